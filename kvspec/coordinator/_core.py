"""The compiled part of the scheduler-facing coordinator: everything but the checked constructor.

``kvspec.coordinator.KVCacheCoordinator`` (plain Python) subclasses :class:`CoordinatorCore` only to
type-check its constructor's arguments with beartype; every per-step method is this module's, and the
compiled build compiles this module with mypyc. Construct ``KVCacheCoordinator``, not the core.

Bad input at a compiled boundary: mypyc refuses an argument of the wrong type with a bare ``TypeError``
before a method's body runs, so the counts an engine passes every step (``allocate_slots``) are typed
``SupportsIndex`` and checked in the body: any integer (Python, numpy, a 0-d integer tensor) is taken, and
anything else is a ``SchedulingError`` naming the argument, in both builds.

Atomicity: ``allocate_slots`` checks capacity before it changes anything, so a ``None`` return leaves
ref counts, the free queue and the cache map as they were (only blocks that fell out of a sliding window
are released first, which is what the request would do next step anyway).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import SupportsIndex

from mypy_extensions import mypyc_attr

from kvspec.blocks.events import KVCacheEvent
from kvspec.blocks.hashing import BlockHasher
from kvspec.blocks.pool import BlockId, KVCacheBlock
from kvspec.blocks.request import Request
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import (
    BlockCopy,
    BoundaryState,
)
from kvspec.coordinator._state import CoordinatorState, KVCacheBlocks
from kvspec.coordinator._steps import (
    AdmissionCounts,
    admit,
    allocate_running,
    as_count,
    cache_computed_blocks,
    count_new_blocks,
    find_prefix_hit,
    free_request,
    not_a_request,
    note_prefix_hit,
)
from kvspec.coordinator.hit_search import shared_prefix_junction
from kvspec.coordinator.layout import (
    check_retention_interval,
)
from kvspec.coordinator.stats import PrefixCacheStats, annotate_events
from kvspec.errors import InvariantError, SchedulingError
from kvspec.managers.base import SingleTypeKVCacheManager


@mypyc_attr(allow_interpreted_subclasses=True)  # kvspec.coordinator.KVCacheCoordinator checks construction
class CoordinatorCore(CoordinatorState):
    """The per-step methods of :class:`kvspec.coordinator.KVCacheCoordinator`; construct that class (the
    same class with a checked constructor), never this one."""

    # -- helpers for engines ------------------------------------------------------------------

    def quiet_decode_block_sizes(self) -> tuple[int, ...] | None:
        """Each group's block (tokens) when a running request's one-token step that neither starts nor
        fills a block changes nothing in any group (allocates, caches, frees, copies nothing, no per-step
        manager work), so an engine may run such steps as bookkeeping only; None when a group acts on
        other steps too: sliding windows and chunked attention free blocks as the window moves, Mamba
        keeps states, retention and lookahead hashing, sub-block hits, encoder groups, prompt-tail entries,
        or a manager that is not built on the base class or overrides its per-step hook."""
        if (
            self._skipping_managers
            or self._prefill_end_managers
            or self._cache_every_call
            or self._eagle_group_ids
            or self._tail_groups
            or self._encoder_groups
            or self.partial_hash_hits
            or self.hash_lookahead_tokens
            or self._base_all is None
        ):
            return None
        base = SingleTypeKVCacheManager
        for manager in self.managers:
            kind = type(manager)
            if (
                kind.new_step_starts is not base.new_step_starts
                or kind.get_num_blocks_to_allocate is not base.get_num_blocks_to_allocate
            ):
                return None
        return tuple(self.group_block_sizes)

    def make_block_hasher(self, seed: bytes | str | None = None) -> BlockHasher:
        """A hasher with this coordinator's hash block size, for the engine's Request objects."""
        return BlockHasher(self.hash_block_size, algorithm=self.hash_algorithm, seed=seed)

    @property
    def num_groups(self) -> int:
        return len(self.specs)

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    # -- prefix-cache hits --------------------------------------------------------------------

    def get_computed_blocks(self, request: RequestView) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of ``request`` (blocks per group, tokens).

        The last token is never a hit (its logits must be computed), so at most num_tokens - 1. The lookup's
        shared-prefix junction (``shared_prefix_junction``; 0: none) is pinned on the request
        (``shared_prefix_boundary``, where it can be set) as vLLM 0.34's Scheduler pins it after every lookup:
        sparse retention then keeps the junction cached. An engine that schedules chunks ends the request's
        first chunk there (``Request.shared_prefix_boundary``).
        """
        blocks, num_hit_tokens, uncached = find_prefix_hit(self, request, request.num_tokens - 1)
        note_prefix_hit(self, request, num_hit_tokens)
        try:
            setattr(request, "shared_prefix_boundary", shared_prefix_junction(num_hit_tokens, uncached))  # noqa: B010
        except AttributeError:
            pass  # a read-only view: its engine pins the junction itself (vLLM's Scheduler)
        return blocks, num_hit_tokens

    def lookup_prefix(self, request: RequestView, max_length: int) -> tuple[KVCacheBlocks, int, int]:
        """The longest cached prefix of at most ``max_length`` tokens, without recording stats (the
        engine records what it admits with ``record_prefix_hit``): (blocks per group, hit tokens, uncached
        shared prefix tokens: how far one group's hit reached past the common one, 0 if none; see
        ``PrefixHitSearch.find_with_uncached``). Nothing when caching is off or the request skips reads."""
        return find_prefix_hit(self, request, max_length)

    def record_prefix_hit(self, request: RequestView, num_hit_tokens: int) -> None:
        """Count one prefix-cache query of ``request`` that hit ``num_hit_tokens`` tokens (with log_stats;
        a request that skips cache reads is not counted)."""
        note_prefix_hit(self, request, num_hit_tokens)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """(blocks per group, hit tokens) for at most ``max_length`` tokens (see kvspec.coordinator.hit_search)."""
        return self.hit_search.find(block_hashes, max_length)

    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[bytes], max_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], tuple[int, ...]]:
        """Each group's own hit, searched without agreement (blocks per group, tokens per group): for a KV
        connector that supplies what a lagging group lacks (see ``PrefixHitSearch.find_per_group``)."""
        return self.hit_search.find_per_group(block_hashes, max_length)

    # -- allocation ---------------------------------------------------------------------------

    def allocate_slots(
        self,
        request: RequestView,
        num_new_tokens: SupportsIndex,
        num_new_computed_tokens: SupportsIndex = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: SupportsIndex = 0,
        *,
        num_external_computed_tokens: SupportsIndex = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: SupportsIndex = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: SupportsIndex = 0,
        num_in_flight_tokens: SupportsIndex = 0,
        watermark_blocks: SupportsIndex = 0,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        """Blocks for ``num_new_tokens`` more tokens of ``request``, or None if they do not fit.

        ``new_computed_blocks`` / ``num_new_computed_tokens`` come from ``get_computed_blocks`` for a
        request being admitted. ``num_lookahead_tokens`` reserves room for speculative tokens. The rarer
        counts are keyword-only: ``num_external_computed_tokens`` (a KV connector's tokens),
        ``num_encoder_tokens`` (cross attention's encoder input, at admission), ``full_sequence_must_fit``
        (admit the request only if its whole prompt fits now), ``reserved_blocks`` (must stay free after
        this allocation; ``watermark_blocks`` too, and the admission check of ``full_sequence_must_fit``
        keeps them as well: vLLM 0.34's watermark), ``num_in_flight_tokens`` (of the computed tokens,
        scheduled but not yet processed, asynchronous scheduling: blocks out of a window are freed only
        behind the processed ones), ``skip_zeroing_group_ids`` (groups whose blocks for external tokens are
        not reported for zeroing: an asynchronous load writes them later; vLLM 0.34), ``delay_cache_blocks``.
        Counts are ints >= 0 (any integer type; anything else is a SchedulingError before anything changes).

        Two paths: a running request's step (``allocate_running``: the call made every step, its counts
        tested without a call per count) and everything else (``admit``: every count checked, hits and
        external tokens attached).
        """
        # kvspec's own Request is read natively in the compiled build; any other view through Python's
        # attribute lookup (the same value, a tenth of a decode step slower). The same split below.
        if isinstance(request, Request):
            request_id = request.request_id
        else:
            try:
                request_id = request.request_id
            except AttributeError:
                raise not_a_request("allocate_slots", request) from None
        if (
            type(num_new_tokens) is int
            and num_new_tokens > 0
            and type(num_lookahead_tokens) is int
            and num_lookahead_tokens >= 0
            and type(reserved_blocks) is int
            and reserved_blocks >= 0
            and num_in_flight_tokens == 0
            and watermark_blocks == 0
            and self._admitted.get(request_id) is request
            and new_computed_blocks is None
            and num_new_computed_tokens == 0
            and num_external_computed_tokens == 0
            and num_encoder_tokens == 0
            and not full_sequence_must_fit
        ):
            return allocate_running(
                self,
                request,
                request_id,
                num_new_tokens,
                num_lookahead_tokens,
                reserved_blocks,
                delay_cache_blocks,
            )
        return admit(
            self,
            request,
            request_id,
            AdmissionCounts(
                new_tokens=as_count("num_new_tokens", num_new_tokens),
                new_computed=as_count("num_new_computed_tokens", num_new_computed_tokens),
                lookahead=as_count("num_lookahead_tokens", num_lookahead_tokens),
                external=as_count("num_external_computed_tokens", num_external_computed_tokens),
                encoder=as_count("num_encoder_tokens", num_encoder_tokens),
                reserved=as_count("reserved_blocks", reserved_blocks),
                in_flight=as_count("num_in_flight_tokens", num_in_flight_tokens),
                watermark=as_count("watermark_blocks", watermark_blocks),
            ),
            new_computed_blocks,
            full_sequence_must_fit,
            delay_cache_blocks,
            skip_zeroing_group_ids,
        )

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        computed: tuple[Sequence[KVCacheBlock], ...],
        total_computed: int,
        num_tokens_main_model: int,
        num_encoder_tokens: int,
        apply_admission_cap: bool = False,
        prefill_end: int | None = None,
        num_local_computed_tokens: int | None = None,
    ) -> int:
        """Blocks the request needs (all groups) to hold ``num_tokens`` tokens, given the hit blocks
        ``computed`` it is about to attach and ``total_computed`` tokens already computed; encoder-sized
        groups count ``num_encoder_tokens``. With ``apply_admission_cap``, groups that recycle blocks
        (windows) count at most their admission cap. ``prefill_end`` (tokens): where the request's prefill
        ends, for managers that reserve by it (``wants_prefill_end``); None: as last noted.
        ``num_local_computed_tokens``: the prefix hit's tokens (None: ``total_computed``); with sub-block hits,
        a hit ending inside a group's block counts one more block there, for its copy."""
        if prefill_end is not None:
            for noting in self._prefill_end_managers:
                noting.note_prefill_end(request_id, prefill_end)
        return count_new_blocks(
            self,
            request_id,
            num_tokens,
            num_tokens_main_model,
            computed,
            total_computed,
            num_encoder_tokens,
            apply_admission_cap,
            total_computed if num_local_computed_tokens is None else num_local_computed_tokens,
        )

    def cache_blocks(self, request: RequestView, num_computed_tokens: int) -> None:
        """Publish the request's full blocks up to ``num_computed_tokens`` (aligned for hybrids)."""
        cache_computed_blocks(self, request, num_computed_tokens)

    def free(self, request: RequestView) -> None:
        """Release every block of the request, tail first (so tails are evicted first). A request holding
        no block (never admitted, or already freed) is a no-op, as an engine frees aborted waiting ones."""
        try:
            request_id = request.request_id
        except AttributeError:
            raise not_a_request("free", request) from None
        free_request(self, request_id)

    def free_request_id(self, request_id: str) -> None:
        free_request(self, request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        """Forget the request as ``free`` does, returning its blocks (group by group, each in allocation
        order) instead of releasing them: the engine releases them later with
        ``block_pool.free_blocks(reversed(blocks))``, once no in-flight step can still write them."""
        self._admitted.pop(request_id, None)
        self._cached_tokens.pop(request_id, None)
        blocks: list[KVCacheBlock] = []
        for manager in self.managers:
            blocks.extend(manager.pop_blocks_for_free(request_id))
        return blocks

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        for manager in self.managers:
            manager.remove_skipped_blocks(request_id, total_computed_tokens, num_prompt_tokens)

    def new_step_starts(self) -> None:
        for manager in self.managers:
            manager.new_step_starts()

    # -- queries ------------------------------------------------------------------------------

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(m.get_blocks(request_id) for m in self.managers))

    def get_block_ids(self, request_id: str) -> tuple[list[BlockId], ...]:
        return tuple([b.block_id for b in m.get_blocks(request_id)] for m in self.managers)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [m.get_num_common_prefix_blocks(running_request_id) for m in self.managers]

    def take_new_block_ids(self) -> list[int]:
        ids: list[int] = []
        for manager in self.managers:
            ids.extend(manager.take_new_block_ids())
        return ids

    def take_boundary_states(self) -> list[BoundaryState]:
        """Drain every group's state blocks committed at exact token boundaries since the last call, in
        group order (``BoundaryState``: what a KV connector offloads; Mamba "align" groups offer them)."""
        states: list[BoundaryState] = []
        for manager in self._boundary_managers:
            states.extend(manager.take_boundary_states())
        return states

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def set_prefix_cache_retention_interval(self, interval: int | None) -> None:
        """Change sparse retention (tokens, a multiple of the scheduler block; None: dense) from the next
        caching call on; blocks already cached stay cached. Checked as the constructor checks it
        (``UnsupportedConfigurationError``); nothing changes when it is refused. Every manager declaring the
        ``retention`` capability is told (``set_prefix_cache_retention_interval``)."""
        check_retention_interval(interval, self.scheduler_block_size, self.traits)
        self.prefix_cache_retention_interval = interval
        for manager in self._retention_managers:
            manager.set_prefix_cache_retention_interval(interval)

    def reset_prefix_cache(self) -> bool:
        """Forget all cached blocks; False (nothing changed) while requests still hold blocks.

        Blocks a manager reserves for its lifetime (sink tokens) are not a request's and do not block a
        reset (in vLLM 0.23 they do, so a model with sink attention can never reset its prefix cache).
        """
        reserved = sum(1 for m in self.managers for _ in m.iter_held_blocks()) if not self._admitted else 0
        if not self.block_pool.reset_prefix_cache(num_reserved=reserved):
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The stats gathered since the last call (None when log_stats is off); starts new ones."""
        stats = self.prefix_cache_stats
        if stats is None:
            return None
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def take_events(self, log: logging.Logger | None = None) -> list[KVCacheEvent]:
        """KV events since the last call, BlockStored annotated with its group's declared kind and window
        (an event naming no group of this coordinator is warned about on ``log``, kvspec's by default)."""
        return annotate_events(self.block_pool.take_events(), self._event_metadata, log)

    def take_block_copies(self, track_endpoints: bool = True) -> tuple[list[BlockCopy], list[KVCacheBlock]]:
        """The block copies queued since the last call (sub-block hits' copy on write), for the engine to
        run before the next forward pass, and their endpoints (one reference each, for the copy): release
        them with ``release_copied_blocks`` once the copies have run. Empty without sub-block hits.
        ``track_endpoints`` False: the engine frees the endpoints with the pool itself (vLLM's Scheduler
        calls ``block_pool.free_blocks``), so the coordinator does not count them as held for a copy."""
        copies: list[BlockCopy] = []
        held: list[KVCacheBlock] = []
        for gid, manager in self._copying_groups:
            for source, target in manager.take_block_copies():
                copies.append(
                    BlockCopy(
                        kv_cache_group_id=gid, src_block_id=source.block_id, dst_block_id=target.block_id
                    )
                )
                held.append(source)
                held.append(target)
        if track_endpoints:
            for block in held:
                self._copy_held[block.block_id] = self._copy_held.get(block.block_id, 0) + 1
        return copies, held

    def release_copied_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Drop the copy's reference on each block ``take_block_copies`` handed out (the copies have run);
        a block no one else holds returns to the free queue. A block not held for a copy is a
        SchedulingError, before anything changes."""
        counts: dict[int, int] = {}
        for block in blocks:
            counts[block.block_id] = counts.get(block.block_id, 0) + 1
        for block_id, n in counts.items():
            if self._copy_held.get(block_id, 0) < n:
                raise SchedulingError(
                    f"release_copied_blocks: block {block_id} is not held for a block copy {n} time(s); "
                    "pass the blocks take_block_copies returned, once."
                )
        for block_id, n in counts.items():
            left = self._copy_held[block_id] - n
            if left:
                self._copy_held[block_id] = left
            else:
                del self._copy_held[block_id]
        self.block_pool.free_blocks(blocks)

    def finalize_partial_tails(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int = 0
    ) -> list[BoundaryState]:
        """When a request finishes, before it is freed: the states it keyed inside its own blocks that a
        KV connector may still offload from there (pin them first; see ``BoundaryState``)."""
        states: list[BoundaryState] = []
        for _, manager in self._copying_groups:
            state = manager.finalize_partial_tail(request_id, num_computed_tokens, num_in_flight_tokens)
            if state is not None:
                states.append(state)
        return states

    def check_invariants(self) -> None:
        """Raise if any block's ref count differs from the number of holders (requests + reservations +
        block copies not yet released), or if the pool's queue and cache map disagree. For tests and
        debugging; O(blocks)."""
        self.block_pool.check_invariants()
        holders = [0] * self.block_pool.num_gpu_blocks
        for manager in self.managers:
            for block in manager.iter_held_blocks():
                holders[block.block_id] += 1
        for block_id, n in self._copy_held.items():
            holders[block_id] += n
        for block in self.block_pool.blocks:
            if not block.is_null and block.ref_cnt != holders[block.block_id]:
                raise InvariantError(
                    f"block {block.block_id} has ref_cnt {block.ref_cnt} but {holders[block.block_id]} holders"
                )
