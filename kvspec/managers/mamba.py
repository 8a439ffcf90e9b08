"""Mamba (state-space) layers: a request needs only its latest state, plus speculative slots.

Modes (``MambaSpec.mamba_cache_mode``):
- "none": one state block per request (block_size is usually max_model_len), no prefix caching;
- "all": one block per ``block_size`` tokens, every finished state cached, older ones freed;
- "align": the running state lives in the last ``1 + num_speculative_blocks`` blocks; states at block
  boundaries are cached, positions in between are null.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.blocks.eviction import BlockUse
from kvspec.blocks.pool import KVCacheBlock, block_use
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import SUB_BLOCK_HITS, BoundaryState, HitQuery, HitResult
from kvspec.contracts.spec import MAMBA_CACHE_MODES, MambaCacheMode
from kvspec.errors import SchedulingError, UnsupportedConfigurationError
from kvspec.intmath import cdiv
from kvspec.managers.base import BASE_CAPABILITIES, SingleTypeKVCacheManager, shared_prefix_boundary


class MambaManager(SingleTypeKVCacheManager):
    """A request's hit is a single state block at a block boundary; everything before it is null.

    With sub-block hits (``ManagerContext.partial_hash_hits``, "align" with a block larger than the hash
    block) a hit may also end on a state cached inside a block: the prompt's last hash boundary, which the
    scheduler ends a chunk on. The request that computed that state keeps writing its block, so the cache
    entry moves to a copy at its next allocation; a request that hits it writes into a copy of its own.
    """

    manager_capabilities = BASE_CAPABILITIES | {SUB_BLOCK_HITS}

    def setup(self) -> None:
        spec = self.kv_cache_spec
        mode = getattr(spec, "mamba_cache_mode", None)
        num_spec_blocks = getattr(spec, "num_speculative_blocks", None)
        if mode not in MAMBA_CACHE_MODES or not isinstance(num_spec_blocks, int) or num_spec_blocks < 0:
            raise UnsupportedConfigurationError(
                f"MambaManager runs specs with mamba_cache_mode in {MAMBA_CACHE_MODES} and "
                f"num_speculative_blocks >= 0; {type(spec).__name__} has {mode!r} and {num_spec_blocks!r}."
            )
        # The release may not run every mode, nor "none" with prefix caching (vLLM 0.34).
        self.context.profile.check_mamba_cache_mode(mode, self.enable_caching)
        self.mamba_cache_mode: MambaCacheMode = mode
        self.num_speculative_blocks: int = num_spec_blocks
        self.cached_blocks_this_step: set[bytes] = set()
        self.last_state_block_idx: dict[str, int] = {}
        self._allocated_block_reqs: set[str] = set()
        # vLLM 0.34's align frees (MambaRules.align_frees_across_nulls): blocks below this index
        # are retired (freed or never kept) per request.
        rules = self.context.profile.mamba  # the profile's Mamba section, read once
        #: Sparse retention thins the states cached (vLLM 0.34's rule; ``MambaRules.sparse_retention``).
        self._sparse_retention = rules.sparse_retention
        self._frees_across_nulls = rules.align_frees_across_nulls
        self._num_retired_blocks: dict[str, int] = {}
        # vLLM 0.32's re-keying of the prompt-boundary state (MambaRules.boundary_recache_defers_hits).
        self._marks_prompt_boundary = mode == "align" and rules.boundary_recache_defers_hits
        # vLLM 0.34's prefill checkpoints ("align", num_prefill_checkpoint_blocks > 0): the prompt's final chunk
        # may run past the last boundary a later request can hit; the backend then exports the state at that
        # boundary into a block reserved here (the one before the chunk's last), which is cached there.
        self.has_prefill_checkpoint_blocks = (
            mode == "align" and getattr(spec, "num_prefill_checkpoint_blocks", 0) > 0
        )
        self.wants_prefill_end = self.has_prefill_checkpoint_blocks
        self._checkpoint_alignment: int | None = getattr(spec, "prefill_checkpoint_alignment", None)
        #: Per request: (checkpoint position in tokens, index of its reserved block), for this step.
        self._checkpoints: dict[str, tuple[int, int]] = {}
        self._prefill_ends: dict[str, int] = {}
        # "align": every state block a caching call keys, offered to a connector until taken or freed.
        self._boundary_states: list[BoundaryState] = []
        # Sub-block hits: per request that keyed its own prompt-boundary state inside a block, that block
        # and the boundary (tokens), for a connector once the request finishes or the entry moves to a copy.
        self._producer_tails: dict[str, tuple[KVCacheBlock, int, BlockUse]] = {}

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        if query.dcp_world_size * query.pcp_world_size != 1:
            raise UnsupportedConfigurationError("Mamba prefix caching does not support context parallelism.")
        block_hashes = query.block_hashes
        block_pool = query.block_pool
        kv_cache_group_ids = query.kv_cache_group_ids
        max_length, alignment_tokens, block_size = (
            query.max_length,
            query.alignment_tokens,
            query.block_tokens,
        )
        max_num_blocks = min(max_length // block_size, len(block_hashes))
        null = block_pool.null_block
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in kv_cache_group_ids)
        fine = query.fine_block_hashes
        if fine is not None and alignment_tokens < block_size and block_size % alignment_tokens == 0:
            # Sub-block hits: the latest state cached at any hash boundary, inside a block or at its end.
            scale = block_size // alignment_tokens
            for fine_index in range(min(max_length // alignment_tokens, len(fine)) - 1, -1, -1):
                hits = block_pool.get_cached_block(fine[fine_index], kv_cache_group_ids)
                if hits is not None:
                    for blocks, block in zip(computed, hits):
                        blocks.extend([null] * (fine_index // scale))
                        blocks.append(block)
                    return HitResult(computed, (fine_index + 1) * alignment_tokens)
            return HitResult(computed, 0)
        for i in range(max_num_blocks - 1, -1, -1):
            if ((i + 1) * block_size) % alignment_tokens:
                continue
            hits = block_pool.get_cached_block(block_hashes[i], kv_cache_group_ids)
            if hits is not None:
                for blocks, block in zip(computed, hits):
                    blocks.extend([null] * i)
                    blocks.append(block)
                break
        return HitResult(computed)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - 1)

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, /, num_prompt_tokens: int | None = None
    ) -> None:
        align = self.mamba_cache_mode == "align"
        if align and self._frees_across_nulls:
            total = total_computed_tokens
            self._retire_skipped_states(request_id, total)
        else:
            # Draft tokens may be rejected, so the states they would skip past are kept (vLLM 0.23).
            total = max(0, total_computed_tokens - self.num_speculative_blocks)
            super().remove_skipped_blocks(request_id, total)
        if not align:
            return
        # The state block from two allocations ago (or the prefix hit's state) is no longer read once
        # the computed tokens pass the block after it. It joins the free queue's tail, as any freed block.
        idx = self.last_state_block_idx.get(request_id)
        if idx is None or idx >= cdiv(total, self.block_size) - 1:
            return
        blocks = self.req_to_blocks[request_id]
        block = blocks[idx]
        if not block.is_null:
            self.block_pool.free_blocks([block])
            blocks[idx] = self._null_block

    def _retire_skipped_states(self, request_id: str, total_computed_tokens: int) -> None:
        """vLLM 0.34's align frees: every not yet retired block before the skipped tokens' end, null gaps
        (states prefill never kept) passed over; freed from the last one back, in one call (unhashed to
        the free queue's head, hashed to its tail)."""
        num_skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        blocks = self.req_to_blocks.get(request_id)
        if num_skipped_tokens <= 0 or not blocks:
            return
        last = min(num_skipped_tokens // self.block_size, len(blocks))
        first = self._num_retired_blocks.get(request_id, 0)
        if first >= last:
            return
        self.free_block_range(request_id, first, last, past_nulls=True)
        self._num_retired_blocks[request_id] = last

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        if (
            new_computed_blocks
            and new_computed_blocks[-1].block_hash is not None
            and new_computed_blocks[-1].block_hash in self.cached_blocks_this_step
        ):
            # Cached by another request this very step: its state may not be written yet. Report
            # "does not fit" so the scheduler retries next step.
            return self.block_pool.num_gpu_blocks + 1
        if self.mamba_cache_mode != "align":
            return super().get_num_blocks_to_allocate(
                request_id,
                num_tokens + self.block_size * self.num_speculative_blocks,
                new_computed_blocks,
                total_computed_tokens,
                num_tokens_main_model,
                apply_admission_cap,
            )
        required = cdiv(num_tokens_main_model, self.block_size) + self.num_speculative_blocks
        have = len(self.req_to_blocks.get(request_id, ())) + len(new_computed_blocks)
        external = 0
        if request_id not in self.num_cached_block and cdiv(total_computed_tokens, self.block_size) > have:
            # An admission with external tokens (a KV connector's load) past the hit's blocks: attaching them
            # takes a real block for the loaded state (behind null placeholders), before the running
            # state's. vLLM 0.34 counts only the latter, and its pool raises when that one block is short.
            external = 1
            have = cdiv(total_computed_tokens, self.block_size)
        checkpoint = 0
        if self.has_prefill_checkpoint_blocks:
            checkpoint = self._checkpoint_position(request_id, total_computed_tokens, num_tokens_main_model)
            if not apply_admission_cap:  # the admission estimate plans; this step's estimate decides
                if checkpoint:
                    self._checkpoints[request_id] = (
                        checkpoint,
                        cdiv(num_tokens_main_model, self.block_size) - 2,
                    )
                else:
                    self._checkpoints.pop(request_id, None)
        num_new = 0
        # A running request whose prompt-boundary state moves to a copy needs that copy's block too (a new
        # request's sub-block hit is counted by the coordinator, as for every group).
        moving = request_id in self._partial_hit_reqs and request_id in self._allocated_block_reqs
        if required > have or moving:
            # At most the running state (and the speculative blocks, the first time), a checkpoint and a copy.
            cap = 1 + (checkpoint > 0) + moving
            if request_id not in self._allocated_block_reqs:
                cap += self.num_speculative_blocks
            num_new = min(max(required - have, 0) + moving, cap)
        num_new += external
        evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        return num_new + evictable

    def note_prefill_end(self, request_id: str, prefill_end: int) -> None:
        self._prefill_ends[request_id] = prefill_end

    def _checkpoint_position(self, request_id: str, query_start: int, query_end: int) -> int:
        """The token position whose state this chunk [query_start, query_end) exports into a reserved block
        (0: none; vLLM 0.34 ``vllm/v1/core/single_type_kv_cache_manager.py``: ``MambaManager._needs_internal_checkpoint`` (0.34.0), ``vllm/v1/kv_cache_interface.py``: ``get_mamba_prefill_checkpoint_position`` (0.34.0)). Only a chunk reaching the prefill's end
        under sparse retention 0 (every chunk otherwise), starting on a hash boundary, and at least a hash
        block below the last boundary a later request can hit, which lies strictly inside the chunk, in a
        block after the one the chunk starts from, and a whole number of alignments from its start."""
        hash_block = self.block_pool.hash_block_size
        block_size = self.block_size
        position = _checkpoint_boundary(
            query_end,
            self.cache_hit_alignment_tokens,
            self.context.model_uses_eagle,
            self.block_pool.hash_lookahead_tokens,
        )
        prefill_end = self._prefill_ends.get(request_id, 0)
        if self.context.prefix_cache_retention_interval != 0:
            prefill_end = 0  # dense or interval retention: every chunk publishes a state
        alignment = self._checkpoint_alignment
        index = cdiv(query_end, block_size) - 2
        if (
            alignment is None
            or query_end < prefill_end
            or query_start % hash_block
            or index <= (query_start - 1) // block_size
            or query_start + hash_block > position
            or not query_start < position < query_end
            or (position - query_start) % alignment
        ):
            return 0
        blocks = self.req_to_blocks.get(request_id, ())
        if (
            index >= len(blocks)
            or blocks[index].is_null
            or (
                request_id in self._allocated_block_reqs
                and index >= len(blocks) - self.num_speculative_blocks
            )
        ):
            return position
        return 0

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        if self.mamba_cache_mode != "align":
            return super().allocate_new_blocks(
                request_id, num_tokens + self.block_size * self.num_speculative_blocks, num_tokens_main_model
            )
        # Lookahead tokens are not counted: a block-aligned chunk plus lookahead would break the alignment
        # (and draft models have no Mamba layers).
        num_spec_blocks = self.num_speculative_blocks
        blocks = self.req_to_blocks.setdefault(request_id, [])
        required = cdiv(num_tokens_main_model, self.block_size) + num_spec_blocks
        prev_len = len(blocks)
        # The block before the chunk's last stays real (not null): the backend exports the checkpoint there.
        checkpoint = int(request_id in self._checkpoints)
        partial = self._partial_hit_reqs.pop(request_id, None) if self._partial_hit_reqs else None
        if required <= prev_len and not checkpoint and partial is None:
            # Running from here on (an external load may have allocated every block it needs): a later
            # copy of its own state moves the cache entry rather than its block (vLLM 0.34).
            if self._partial_hits:
                self._allocated_block_reqs.add(request_id)
            return []
        allocated_before = request_id in self._allocated_block_reqs
        if allocated_before:
            # The running state sits in the block before the speculative ones; freed two steps on.
            self.last_state_block_idx[request_id] = prev_len - 1 - num_spec_blocks
        elif prev_len:
            # A prefix hit: its last block holds the state the request starts from.
            self.last_state_block_idx[request_id] = prev_len - 1
        null = self._null_block
        num_skipped = required - num_spec_blocks - 1 - checkpoint
        if prev_len < num_skipped:
            blocks.extend([null] * (num_skipped - prev_len))
        if allocated_before:
            # The speculative blocks of the last step move up to follow the skipped positions.
            for idx in range(prev_len - num_spec_blocks, prev_len):
                if idx >= num_skipped:
                    break
                blocks.append(blocks[idx])
                blocks[idx] = null
        copy_target = self.block_pool.get_new_blocks(1)[0] if partial is not None else None
        blocks.extend(self.block_pool.get_new_blocks(max(required - len(blocks), 0)))
        self._allocated_block_reqs.add(request_id)
        # Everything appended, null placeholders included, so a runner that appends the returned ids to
        # the block-table row keeps the row aligned to token positions.
        returned = blocks[prev_len:]
        if partial is not None and copy_target is not None:
            index, source = partial
            if allocated_before:
                self._move_tail_entry(request_id, index, source, copy_target)
            else:
                self.copy_on_write(request_id, index, source, copy_target)
                returned.insert(0, copy_target)
        return returned

    def _move_tail_entry(
        self, request_id: str, index: int, source: KVCacheBlock, target: KVCacheBlock
    ) -> None:
        """The running request keyed its own prompt-boundary state inside block ``index`` and goes on
        writing that block (a runner's block table is append-only): the cache entry moves to ``target``,
        filled by a queued copy before the next forward pass. Both hold a reference for the copy; a hit on
        the moved entry waits a step (the copy has not run), and the copy is offered to a connector."""
        if self.req_to_blocks[request_id][index] is not source:
            raise SchedulingError(
                f"Mamba prompt-boundary state of request {request_id!r}: block {index} is no longer the "
                f"block {source.block_id} it was keyed in."
            )
        tail = self._producer_tails.pop(request_id, None)
        self.block_pool.move_block_hashes(source, target, None if tail is None else tail[2])
        self._pending_copies.append((source, target))
        source.ref_cnt += 1
        if tail is not None:
            self._boundary_states.append(
                BoundaryState(
                    request_id=request_id,
                    kv_cache_group_id=self.kv_cache_group_id,
                    block_id=target.block_id,
                    num_tokens=tail[1],
                )
            )
        if target.block_hash is not None:
            self.cached_blocks_this_step.add(target.block_hash)

    def cache_blocks(self, request: RequestView, num_tokens: int) -> None:
        request_id = request.request_id
        num_before = self.num_cached_block.get(request_id, 0)
        super().cache_blocks(request, num_tokens)
        blocks = self.req_to_blocks.get(request_id, ())
        if self._marks_prompt_boundary:
            self._mark_prompt_boundary_state(request, num_tokens, blocks)
        checkpoint = self._checkpoints.get(request_id) if self._checkpoints else None
        if checkpoint is not None:
            key = self._cache_checkpoint(request, *checkpoint)
            if key is not None:
                self.cached_blocks_this_step.add(key)
        elif self._partial_hits and self.mamba_cache_mode == "align":
            key = self._cache_prompt_boundary_state(request, num_tokens)
            if key is not None:
                self.cached_blocks_this_step.add(key)
        # After the checkpoint, which may have dropped a key the full-block pass gave its block this call.
        align = self.mamba_cache_mode == "align"
        for block in blocks[num_before : self.num_cached_block.get(request_id, 0)]:
            if block.block_hash is not None:
                self.cached_blocks_this_step.add(block.block_hash)
                if align:
                    self._boundary_states.append(
                        BoundaryState(
                            request_id=request_id,
                            kv_cache_group_id=self.kv_cache_group_id,
                            block_id=block.block_id,
                            num_tokens=block.block_hash_num_tokens or 0,
                        )
                    )

    def _cache_prompt_boundary_state(self, request: RequestView, num_tokens: int) -> bytes | None:
        """Sub-block hits: caching exactly up to the prompt's last hash boundary a resend can hit keys the
        state there, even inside a block (``vllm/v1/core/single_type_kv_cache_manager.py``: ``MambaManager._cache_partial_tail_block`` (0.34.0)). Inside a block, the request's next allocation
        moves the entry to a copy (the request goes on writing the block). Returns a new key."""
        hash_block = self.block_pool.hash_block_size
        if num_tokens <= 0 or num_tokens % hash_block:
            return None
        boundary = _checkpoint_boundary(
            request.num_prompt_tokens,
            hash_block,
            self.context.model_uses_eagle,
            self.block_pool.hash_lookahead_tokens,
        )
        if num_tokens != boundary and not (
            # The junction a sibling resumes at, inside the prompt chunk being computed (during decode the
            # running state block changes in place: its key would promise a state it holds only later).
            self.context.shared_prefix_checkpoints
            and num_tokens == shared_prefix_boundary(request)
            and request.num_computed_tokens < num_tokens <= request.num_prompt_tokens
        ):
            return None
        index = cdiv(num_tokens, self.block_size) - 1
        request_id = request.request_id
        blocks = self.req_to_blocks.get(request_id, ())
        if index >= len(blocks) or blocks[index].is_null:
            return None
        source = blocks[index]
        if source.block_hash_num_tokens == num_tokens:
            return None  # keyed here already: re-keying would defer every request that hits it
        key = self.block_pool.cache_partial_block(request, source, num_tokens, self.kv_cache_group_id)
        if key is not None and num_tokens % self.block_size:
            self._partial_hit_reqs[request_id] = (index, source)
            self.num_cached_block[request_id] = index
            self._producer_tails[request_id] = (source, num_tokens, block_use(request))
        return key

    def finalize_partial_tail(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int
    ) -> BoundaryState | None:
        """A finishing request's own prompt-boundary state inside a block, for a connector, when no later
        token was computed into that block (``num_computed_tokens`` is the boundary, nothing in flight)."""
        tail = self._producer_tails.pop(request_id, None)
        if tail is None or num_in_flight_tokens or num_computed_tokens != tail[1]:
            return None
        return BoundaryState(
            request_id=request_id,
            kv_cache_group_id=self.kv_cache_group_id,
            block_id=tail[0].block_id,
            num_tokens=tail[1],
        )

    def take_boundary_states(self) -> list[BoundaryState]:
        states = self._boundary_states
        self._boundary_states = []
        return states

    def _cache_checkpoint(self, request: RequestView, position: int, index: int) -> bytes | None:
        """Key the block reserved at ``index`` by the state it holds, the one at ``position`` tokens
        (replacing any key an earlier step or this one gave it), when a later request can reach it: the
        prompt's own checkpoint, a retained segment's end, or the shared-prefix junction. Otherwise the
        state in it is transient, and any key it has is dropped (``vllm/v1/core/single_type_kv_cache_manager.py``: ``MambaManager._cache_partial_tail_block`` (0.34.0)). Returns a new key."""
        blocks = self.req_to_blocks[request.request_id]
        block = blocks[index]
        prompt_checkpoint = _checkpoint_boundary(
            request.num_prompt_tokens,
            self.cache_hit_alignment_tokens,
            self.context.model_uses_eagle,
            self.block_pool.hash_lookahead_tokens,
        )
        retained = False
        if position % self.block_size == 0:
            retained = self._retains_segment_end(position // self.block_size - 1)
        if position != prompt_checkpoint and not retained and position != shared_prefix_boundary(request):
            self.block_pool.evict_blocks([block.block_id])
            return None
        if block.block_hash_num_tokens == position:
            return None
        return self.block_pool.cache_partial_block(
            request, block, position, self.kv_cache_group_id, replace_existing=True
        )

    def _retains_segment_end(self, block_index: int) -> bool:
        """Whether sparse retention keeps the state block ``block_index`` as a segment's end (dense: yes;
        interval 0: no segments)."""
        interval = self.context.prefix_cache_retention_interval
        if interval is None or not self._sparse_retention:
            return True
        if interval == 0:
            return False
        per_segment = interval // self.block_size
        return per_segment <= 1 or (block_index + 1) % per_segment == 0

    @property
    def caches_on_every_call(self) -> bool:
        return self._marks_prompt_boundary

    def _mark_prompt_boundary_state(
        self, request: RequestView, num_tokens: int, blocks: Sequence[KVCacheBlock]
    ) -> None:
        """vLLM 0.32: caching exactly up to the prompt's last hash boundary (tokens; the last token a resend
        can hit, floored to the hash block) re-keys the state block there, which marks it cached this step
        even when it was keyed in an earlier step, so a hit ending on it waits a step."""
        hash_block = self.block_pool.hash_block_size
        boundary = (request.num_prompt_tokens - 1) // hash_block * hash_block
        if num_tokens <= 0 or num_tokens != boundary:
            return
        index = cdiv(num_tokens, self.block_size) - 1
        if index < len(blocks):
            block_hash = blocks[index].block_hash  # None for the null block and an uncached state
            if block_hash is not None:
                self.cached_blocks_this_step.add(block_hash)

    def cache_mask(self, request: RequestView, num_blocks: int) -> list[bool] | None:
        """Dense (None) unless sparse retention applies (``MambaRules.sparse_retention``, "align"):
        then only the state blocks a hit can end on are cached: the last block of every ``interval`` tokens
        (none when 0), and the block ending at each reachable boundary (the prompt's replay boundaries and
        the shared-prefix junction, aligned down to the scheduler block). Units: blocks from the first."""
        context = self.context
        interval = context.prefix_cache_retention_interval
        if interval is None or self.mamba_cache_mode != "align" or not self._sparse_retention:
            return None
        block_size = self.block_size
        mask = [False] * num_blocks
        if interval:
            per_segment = interval // block_size
            if per_segment <= 1:
                return None  # every block ends a segment
            for i in range(per_segment - 1, num_blocks, per_segment):
                mask[i] = True
        scheduler_block = self.cache_hit_alignment_tokens
        for boundary in self.retention_boundaries(request.num_prompt_tokens, shared_prefix_boundary(request)):
            index = boundary // scheduler_block * scheduler_block // block_size - 1
            if 0 <= index < num_blocks:
                mask[index] = True
        return mask

    def free(self, request_id: str) -> None:
        self._forget(request_id)
        super().free(request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        self._forget(request_id)
        return super().pop_blocks_for_free(request_id)

    def _forget(self, request_id: str) -> None:
        if self._boundary_states:  # the blocks go back to the pool: an offer not yet taken would be stale
            self._boundary_states = [s for s in self._boundary_states if s.request_id != request_id]
        self._checkpoints.pop(request_id, None)
        self._prefill_ends.pop(request_id, None)
        self._producer_tails.pop(request_id, None)
        self.last_state_block_idx.pop(request_id, None)
        self._allocated_block_reqs.discard(request_id)
        self._num_retired_blocks.pop(request_id, None)

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()


def _checkpoint_boundary(
    num_tokens: int, hash_block_size: int, drop_eagle_block: bool, hash_lookahead: int
) -> int:
    """The last boundary (tokens, a multiple of ``hash_block_size``) a later request can hit in a prefix of
    ``num_tokens`` tokens: one token is left to recompute for the logits, or the lookahead tokens the
    boundary's hash reads; EAGLE's block drop takes one more hash block off (vLLM 0.34 ``vllm/v1/kv_cache_interface.py``: ``get_mamba_prefill_checkpoint_position`` (0.34.0))."""
    limit = num_tokens if drop_eagle_block else num_tokens - max(1, hash_lookahead)
    boundary = limit // hash_block_size * hash_block_size
    if drop_eagle_block:
        boundary -= hash_block_size
    return max(boundary, 0)
