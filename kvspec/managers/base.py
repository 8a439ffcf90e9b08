"""Shared bookkeeping of the per-spec-type managers (vLLM's SingleTypeKVCacheManager), and the plugin surface.

Settings come from one ``ManagerContext`` (``self.context``; read-only properties such as ``block_size``,
``block_pool`` and ``kv_cache_group_id`` read it). No runtime type checks here: these methods run per step
and per block.

The per-request state carries vLLM's names, the documented surface a manager ported from vLLM (a subclass
written the way vLLM's ``SingleTypeKVCacheManager`` subclasses are) reads and writes unchanged:

``req_to_blocks: dict[str, list[KVCacheBlock]]``
    Each request's blocks in order; the null block (``_null_block``) stands for a position freed early.
    An entry exists from the request's admission (``allocate_new_computed_blocks``) until ``free``; it is
    a plain dict (vLLM's is a defaultdict), so index it only for admitted requests, else use ``.get``.
``num_cached_block: dict[str, int]``
    How many of the request's leading blocks are published in the prefix cache; presence means the
    request was admitted (its later calls are running steps).
``_null_block: KVCacheBlock``
    The pool's null block (``block_pool.null_block``).
``block_pool``, ``kv_cache_spec``, ``kv_cache_group_id``, ``block_size``, ``enable_caching``, ``use_eagle``
    The group's settings (read-only: they come from the context).

A kvspec-native hook may read the same state through ``get_blocks``, ``num_requests``, ``is_admitted`` and
``num_cached_blocks``.

Capabilities: the class declares in ``manager_capabilities`` every optional hook of
``kvspec.contracts.manager.MANAGER_CAPABILITIES`` it implements (this class: all but ``sub_block_hits``,
which a subclass whose hit search ends hits inside a block adds); the registry checks them at registration.

The hooks a plugin manager overrides (everything else is bookkeeping it inherits):

``setup(self) -> None``
    Called at the end of construction. Validate the spec (read its fields or ``self.traits``), add
    per-manager state, reserve blocks. Raise a ``KVSpecError`` subclass for a spec it cannot run.
``find_longest_cache_hit(cls, query: HitQuery) -> HitResult`` (classmethod)
    The longest prefix hit for ``query.kv_cache_group_ids``: one list per group id, all of one length n,
    such that ``n * block_size <= query.max_length``, ``n * block_size`` is a multiple of
    ``query.alignment_tokens`` and position i holds a block cached under ``query.block_hashes[i]`` (or the
    null block where the spec never reads position i). Must not change the pool.
``get_num_skipped_tokens(self, num_computed_tokens: int) -> int``
    Tokens at the front of a request of ``num_computed_tokens`` tokens that attention never reads again
    (0 <= result <= num_computed_tokens). Blocks wholly inside them are freed early. Default 0.
``reachable_block_mask(self, num_blocks: int) -> list[bool] | None``
    Which of a request's first ``num_blocks`` full blocks are worth publishing to the prefix cache
    (None: all). Default None.
``cache_mask(self, request: RequestView, num_blocks: int) -> list[bool] | None``
    The same question when the answer depends on the request (sparse retention reads its prompt length).
    Default: ``reachable_block_mask(num_blocks)``.
``get_num_common_prefix_blocks(self, running_request_id: str) -> int``
    Leading blocks of the request held by every request that holds blocks (for cascade attention):
    counts a block only if its ref count equals the number of such requests. Default 0 (no cascade).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import ClassVar

from mypy_extensions import mypyc_attr

from kvspec.blocks.pool import BlockPool, KVCacheBlock
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import (
    BLOCK_COPIES,
    BOUNDARY_STATES,
    CACHING_CADENCE,
    EXTERNAL_BLOCKS,
    NEW_BLOCK_RECORDS,
    PREFILL_END,
    PROMPT_TAIL,
    RETENTION,
    BoundaryState,
    HitQuery,
    HitResult,
    ManagerContext,
)
from kvspec.contracts.spec import KVCacheSpec
from kvspec.contracts.traits import SpecTraits
from kvspec.errors import SchedulingError, UnsupportedConfigurationError
from kvspec.intmath import cdiv

#: What ``SingleTypeKVCacheManager`` declares: every optional hook but sub-block hits.
BASE_CAPABILITIES: frozenset[str] = frozenset(
    {
        EXTERNAL_BLOCKS,
        PROMPT_TAIL,
        CACHING_CADENCE,
        PREFILL_END,
        BLOCK_COPIES,
        BOUNDARY_STATES,
        RETENTION,
        NEW_BLOCK_RECORDS,
    }
)


@mypyc_attr(allow_interpreted_subclasses=True)  # plugins subclass it in plain Python (compiled build)
class SingleTypeKVCacheManager:
    """Base class with the behaviour most managers share; subclasses define the hit search."""

    #: The optional hooks this class implements (``kvspec.contracts.manager.MANAGER_CAPABILITIES``). A
    #: subclass whose ``find_longest_cache_hit`` can end a hit inside a block when
    #: ``HitQuery.fine_block_hashes`` is given adds ``SUB_BLOCK_HITS``; a coordinator turns sub-block hits
    #: on only when every prefix-cacheable group's manager declares it, or that group's block is the hash
    #: block.
    manager_capabilities: ClassVar[frozenset[str]] = BASE_CAPABILITIES

    def __init__(self, context: ManagerContext) -> None:
        block_pool = context.block_pool
        #: Every setting of this manager (spec, traits, pool, group id, block sizes, caching, EAGLE, caps);
        #: the read-only properties below read it. The underscored fields are the per-step copies.
        self.context = context
        self._block_size = context.block_size
        self._pool = block_pool
        self._caching = context.enable_caching
        self._cap = context.max_admission_blocks_per_request
        self._group_id = context.kv_cache_group_id
        self._track_new_block_ids = (
            context.traits.zero_new_blocks if context.zero_new_blocks is None else context.zero_new_blocks
        )
        # Per request: its blocks in order (null blocks mark positions freed early), and how many of its
        # leading blocks are published in the prefix cache (presence there: the request was admitted).
        # vLLM's names: the documented surface of a vLLM-shaped subclass (see the module docstring).
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        self._new_block_ids: list[int] = []
        self._null_block = block_pool.null_block
        # Sub-block hits (ManagerContext.partial_hash_hits): per request, the position and shared block of a
        # hit that ends inside it, copied on the next allocation; the copies (source, target) not yet taken
        # by the engine, whose blocks hold one extra reference each until then.
        self._partial_hits = context.partial_hash_hits
        # Read by the caching masks on every caching call: fixed for the manager's life.
        self._hit_alignment = (
            block_pool.hash_block_size if self._partial_hits else context.scheduler_block_size
        )
        self._partial_hit_reqs: dict[str, tuple[int, KVCacheBlock]] = {}
        self._pending_copies: list[tuple[KVCacheBlock, KVCacheBlock]] = []
        self.setup()

    # -- settings, read from the context ------------------------------------------------------

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return self.context.kv_cache_spec

    @property
    def traits(self) -> SpecTraits:
        return self.context.traits

    @property
    def block_pool(self) -> BlockPool:
        return self._pool

    @property
    def block_size(self) -> int:
        """Tokens per block of this group: the spec's block size times the context-parallel sizes."""
        return self._block_size

    @property
    def kv_cache_group_id(self) -> int:
        return self._group_id

    @property
    def enable_caching(self) -> bool:
        return self._caching

    @property
    def scheduler_block_size(self) -> int:
        """Tokens per scheduler block (the LCM of the groups' block sizes in a hybrid)."""
        return self.context.scheduler_block_size

    @property
    def cache_hit_alignment_tokens(self) -> int:
        """Tokens every prefix hit ends on a multiple of: the hash block with sub-block hits
        (``ManagerContext.partial_hash_hits``), else the scheduler block."""
        return self._hit_alignment

    @property
    def use_eagle(self) -> bool:
        return self.context.use_eagle

    @property
    def tracks_new_block_ids(self) -> bool:
        """Whether new blocks are reported by take_new_block_ids (for zeroing): the spec's trait."""
        return self._track_new_block_ids

    # -- what a plugin hook may read about requests (the state itself is the base class's) ------

    @property
    def num_requests(self) -> int:
        """Requests holding blocks of this group (admitted and not freed)."""
        return len(self.req_to_blocks)

    def is_admitted(self, request_id: str) -> bool:
        """Whether the request's prefix hit was attached (later calls are running steps)."""
        return request_id in self.num_cached_block

    def num_cached_blocks(self, request_id: str) -> int:
        """Leading blocks of the request published in the prefix cache (0 for an unknown request)."""
        return self.num_cached_block.get(request_id, 0)

    def setup(self) -> None:
        """Extension hook, called at the end of construction: validate the spec, add state, reserve
        blocks. Subclasses override this instead of repeating the constructor's signature. Declare the
        state it adds in the class body (``limit: int | None = None``): checkers that require attributes
        to be set in the class body or ``__init__`` (basedpyright's recommended mode) then accept it."""

    #: Whether the coordinator tells this manager where a request's prefill ends (``note_prefill_end``)
    #: before it counts and allocates the request's blocks: a manager whose reservation depends on it
    #: (vLLM 0.34's Mamba prefill checkpoints) sets it in ``setup``; the others are not called.
    wants_prefill_end: bool = False

    #: None: the manager takes prefix hits and blocks for external tokens when a request is admitted. A
    #: message: it takes neither (cross attention's encoder blocks come with the encoder's tokens), and a
    #: request offering it hit blocks is refused with that message.
    computed_blocks_refusal: ClassVar[str | None] = None

    def note_prefill_end(self, request_id: str, prefill_end: int) -> None:
        """Called before ``get_num_blocks_to_allocate`` / ``allocate_new_blocks`` when ``wants_prefill_end``:
        the request's prefill ends at token ``prefill_end`` (its prompt, or its tokens but the last when it
        resumes replaying output). Default: nothing."""

    # -- allocation ---------------------------------------------------------------------------

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """New blocks plus prefix-hit blocks that touching would pull out of the free queue."""
        num_required = -(num_tokens // -self._block_size)
        cap = self._cap
        if apply_admission_cap and cap is not None and cap < num_required:
            num_required = cap
        if request_id in self.num_cached_block:
            if new_computed_blocks:
                raise SchedulingError(
                    f"Request {request_id!r} is already running; it cannot take new prefix-hit blocks."
                )
            missing = num_required - len(self.req_to_blocks[request_id])
            return missing if missing > 0 else 0
        req_blocks = self.req_to_blocks.get(request_id, ())
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self._block_size
        num_local = len(new_computed_blocks) + len(req_blocks)
        num_new = max(num_required - max(num_skipped_blocks, num_local), 0)
        skip = max(0, num_skipped_blocks - len(req_blocks))
        num_evictable = 0
        for block in new_computed_blocks[skip:]:
            if block.ref_cnt == 0 and not block.is_null:
                num_evictable += 1
        return num_new + num_evictable

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        if self.computed_blocks_refusal is not None:
            if new_computed_blocks:
                raise SchedulingError(self.computed_blocks_refusal)
            return
        if request_id in self.num_cached_block:
            if new_computed_blocks:
                raise SchedulingError(
                    f"Request {request_id!r} is already running; it cannot take new prefix-hit blocks."
                )
            return
        self.add_local_computed_blocks(
            request_id, new_computed_blocks, num_local_computed_tokens, num_external_computed_tokens
        )
        self.allocate_external_computed_blocks(
            request_id, num_local_computed_tokens, num_external_computed_tokens
        )

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """First half of ``allocate_new_computed_blocks``: take the prefix-hit blocks (those attention still
        reads; null blocks stand for the skipped ones). The coordinator does this for every group before any
        group allocates blocks for external tokens, so that allocation cannot evict another group's hit."""
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        total = num_local_computed_tokens + num_external_computed_tokens
        num_skipped_blocks = self.get_num_skipped_tokens(total) // self._block_size
        blocks = list(new_computed_blocks)
        if num_skipped_blocks > 0:
            blocks = blocks[num_skipped_blocks:]
        if self._caching:
            self._pool.touch(blocks)
        elif blocks:
            raise SchedulingError("Computed blocks should be empty when prefix caching is disabled")
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(blocks)
        self.num_cached_block[request_id] = len(req_blocks)
        if self._partial_hits and blocks and num_local_computed_tokens % self._block_size:
            # The hit ends inside its last block, which other requests share: the request writes the rest
            # of that block into a private copy (taken at the next allocate_new_blocks; the coordinator
            # counted the block). Caching resumes at that position, so the copy is published once full.
            index = num_local_computed_tokens // self._block_size
            self._partial_hit_reqs[request_id] = (index, req_blocks[index])
            self.num_cached_block[request_id] = index

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None:
        """Second half of ``allocate_new_computed_blocks``: fresh blocks for the tokens a connector loads.
        ``record_for_zeroing`` False: the blocks are not reported for zeroing (an asynchronous load writes
        them after this step, which zeroing would race)."""
        if num_external_computed_tokens <= 0:
            return
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        total = num_local_computed_tokens + num_external_computed_tokens
        num_new = cdiv(total, self._block_size) - len(req_blocks)
        if num_new > 0:
            allocated = self._pool.get_new_blocks(num_new)
            req_blocks.extend(allocated)
            if self._track_new_block_ids and record_for_zeroing:
                self._new_block_ids.extend([b.block_id for b in allocated])

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        req_blocks = self.req_to_blocks.get(request_id)
        if req_blocks is None:
            req_blocks = self.req_to_blocks[request_id] = []
        copied: list[KVCacheBlock] = []
        if self._partial_hit_reqs and request_id in self._partial_hit_reqs:
            index, source = self._partial_hit_reqs.pop(request_id)
            target = self._pool.get_new_blocks(1)[0]
            self.copy_on_write(request_id, index, source, target)
            self._new_block_ids.append(target.block_id)  # zeroed, then copied into (as vLLM reports it)
            copied.append(target)
        num_new = -(num_tokens // -self._block_size) - len(req_blocks)
        if num_new <= 0:
            return copied
        new_blocks = self._pool.get_new_blocks(num_new)
        req_blocks.extend(new_blocks)
        if self._track_new_block_ids:
            self._new_block_ids.extend([b.block_id for b in new_blocks])
        return copied + new_blocks if copied else new_blocks

    def copy_on_write(self, request_id: str, index: int, source: KVCacheBlock, target: KVCacheBlock) -> None:
        """Give the request ``target`` (a new block) in place of the shared ``source`` at ``index`` and queue
        the copy source -> target (``take_block_copies``). Both stay referenced until the engine has run
        the copy: ``source`` keeps the reference the request took at its hit, ``target`` takes one more
        than the request's."""
        req_blocks = self.req_to_blocks[request_id]
        if req_blocks[index] is not source or source.is_null:
            raise SchedulingError(
                f"copy on write for request {request_id!r}: block {index} is not the shared block "
                f"{source.block_id} its hit ended in."
            )
        req_blocks[index] = target
        self._pending_copies.append((source, target))
        target.ref_cnt += 1

    def take_block_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        """Drain the (source, target) block copies queued since the last call (copy on write of sub-block
        hits). Each endpoint holds one reference for the copy, which the caller releases once the copy has
        run (``block_pool.free_blocks``)."""
        copies, self._pending_copies = self._pending_copies, []
        return copies

    # -- caching and freeing ------------------------------------------------------------------

    def cache_blocks(self, request: RequestView, num_tokens: int) -> None:
        request_id = request.request_id
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = num_tokens // self._block_size
        if self._partial_hits:
            # Only hashed blocks are published (lookahead hashes lag the tokens); the coordinator leaves
            # num_tokens unclamped under sub-block hits.
            num_hashed = len(request.block_hashes) * self._pool.hash_block_size // self._block_size
            if num_hashed < num_full:
                num_full = num_hashed
        if num_cached >= num_full:
            return
        self._pool.cache_full_blocks(
            request,
            self.req_to_blocks[request_id],
            num_cached,
            num_full,
            self._block_size,
            self._group_id,
            block_mask=self.cache_mask(request, num_full),
        )
        self.num_cached_block[request_id] = num_full

    def finalize_partial_tail(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int
    ) -> BoundaryState | None:
        """When a request finishes: a state the request keyed inside one of its blocks that a connector may
        still offload from that block (vLLM 0.34's ``finalize_partial_tail_offload``). None for every
        manager but Mamba "align" with sub-block hits."""
        return None

    def take_boundary_states(self) -> list[BoundaryState]:
        """Drain the state blocks this manager committed at exact token boundaries since the last call, for
        a KV connector to offload (``kvspec.contracts.manager.BoundaryState``). None for managers whose
        blocks a connector finds by position (every attention manager); Mamba "align" offers its states."""
        return []

    @property
    def caches_on_every_call(self) -> bool:
        """Whether ``cache_blocks`` can change something even when no new full block is complete (the
        coordinator then calls it on every allocation instead of skipping the calls that complete no
        block). False for every built-in manager but Mamba "align" under vLLM 0.32
        (``MambaRules.boundary_recache_defers_hits``)."""
        return False

    def cache_prompt_tail(self, request: RequestView, num_tokens: int) -> None:
        """Register the prompt's last hash-block boundary as a partial prefix-cache entry on the block it
        ends inside (vLLM 0.34, for groups whose block is larger than the hash block; the coordinator
        decides which groups). The boundary is the prompt's last token a resend can hit (the whole prompt
        with EAGLE, whose lookup drops a hash unit), floored to the hash block and to the hashes the request
        has; nothing when it falls on a block boundary or beyond ``num_tokens`` (tokens computed)."""
        pool = self._pool
        hash_block = pool.hash_block_size
        limit = request.num_prompt_tokens if self.context.use_eagle else request.num_prompt_tokens - 1
        num_hashes = len(request.block_hashes)
        boundary = (limit // hash_block if limit // hash_block < num_hashes else num_hashes) * hash_block
        if boundary <= 0 or boundary > num_tokens or boundary % self._block_size == 0:
            return
        blocks = self.req_to_blocks.get(request.request_id)
        index = boundary // self._block_size
        if blocks is None or index >= len(blocks):
            return
        pool.cache_partial_block(request, blocks[index], boundary, self._group_id)

    def retention_boundaries(self, num_prompt_tokens: int, shared_prefix_boundary: int) -> list[int]:
        """Token positions where sparse retention keeps the blocks a hit ending there needs: the prompt's
        replay boundaries (``ReleaseProfile.replay_boundaries``) and the shared-prefix junction (tokens; 0:
        none), with EAGLE also one block before the junction (a sibling's EAGLE peek past it is not shared)."""
        context = self.context
        boundaries = list(
            context.profile.replay_boundaries(
                num_prompt_tokens, self.scheduler_block_size, context.model_uses_eagle
            )
        )
        if shared_prefix_boundary > 0:
            boundaries.append(shared_prefix_boundary)
            if context.use_eagle and context.profile.managers.eagle_block_before_junction:
                boundaries.append(shared_prefix_boundary - self.block_size)
        return boundaries

    def set_prefix_cache_retention_interval(self, interval: int | None) -> None:
        """Follow the coordinator's new retention (tokens; None: dense) from the next caching call."""
        self.context = dataclasses.replace(self.context, prefix_cache_retention_interval=interval)

    def cache_mask(self, request: RequestView, num_blocks: int) -> list[bool] | None:
        """The mask ``cache_blocks`` publishes with: ``reachable_block_mask`` unless a manager's caching
        policy also depends on the request (sparse retention reads its prompt length)."""
        return self.reachable_block_mask(num_blocks)

    def reachable_block_mask(self, num_blocks: int) -> list[bool] | None:
        """Which of the first ``num_blocks`` blocks are worth caching (None: all of them)."""
        return None

    def free(self, request_id: str) -> None:
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        if self._partial_hit_reqs:
            self._partial_hit_reqs.pop(request_id, None)
        if blocks:
            self._pool.free_blocks(reversed(blocks))

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        if self._partial_hit_reqs:
            self._partial_hit_reqs.pop(request_id, None)
        if not blocks:
            return []
        first = 0
        null = self._null_block
        while first < len(blocks) and blocks[first] is null:
            first += 1
        return blocks[first:] if first else blocks  # popped: the caller owns the list, no copy needed

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, /, num_prompt_tokens: int | None = None
    ) -> None:
        """Replace the first ``get_num_skipped_tokens`` tokens' blocks with the null block; cached ones stay
        evictable at the queue's tail, scratch (uncached) ones go to its head to be reused first.
        ``num_prompt_tokens`` is unused here (see ``free_block_range`` for a gap after the prompt)."""
        num_skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        num_skipped = min(num_skipped_tokens // self._block_size, len(blocks))
        null = self._null_block
        if num_skipped == 0 or blocks[num_skipped - 1] is null:
            return  # nothing newly skipped since the last call: most decode steps of a window
        cached: list[KVCacheBlock] = []
        uncached: list[KVCacheBlock] = []
        for i in range(num_skipped - 1, -1, -1):
            block = blocks[i]
            if block is null:
                break
            (uncached if block.block_hash is None else cached).append(block)
            blocks[i] = null
        if cached:
            self._pool.free_blocks(cached)
        if uncached:
            self._pool.free_blocks(uncached, prepend=True)

    def free_block_range(
        self, request_id: str, first_block: int, last_block: int, past_nulls: bool = False
    ) -> None:
        """Free the request's blocks in [first_block, last_block) from the last one back, stopping at a
        null block (freed by an earlier call; with ``past_nulls``, passing over null blocks instead), and
        put the null block in their place; one ``free_blocks`` call for all of them. For a manager's
        ``remove_skipped_blocks`` that frees a gap rather than a head (vLLM 0.34's
        ``_remove_blocks_in_range``). Units: block indices."""
        blocks = self.req_to_blocks.get(request_id)
        if not blocks or first_block >= last_block:
            return
        null = self._null_block
        freed: list[KVCacheBlock] = []
        for i in range(min(last_block, len(blocks)) - 1, first_block - 1, -1):
            block = blocks[i]
            if block is null:
                if past_nulls:
                    continue
                break
            freed.append(block)
            blocks[i] = null
        if freed:
            self._pool.free_blocks(freed)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0

    def get_blocks(self, request_id: str) -> Sequence[KVCacheBlock]:
        return self.req_to_blocks.get(request_id, ())

    def new_step_starts(self) -> None:
        return None

    def iter_held_blocks(self) -> Iterator[KVCacheBlock]:
        for blocks in self.req_to_blocks.values():
            for block in blocks:
                if not block.is_null:
                    yield block
        for source, target in self._pending_copies:  # each endpoint's reference for the queued copy
            yield source
            yield target

    def record_new_block_ids(self, request_id: str, first_block: int) -> None:
        """Report the request's blocks from index ``first_block`` on in ``take_new_block_ids`` again (an
        engine whose external load left them unwritten zeroes them); nothing unless the spec zeroes new
        blocks."""
        if self._track_new_block_ids:
            self._new_block_ids.extend(
                [b.block_id for b in self.req_to_blocks.get(request_id, ())[first_block:]]
            )

    def take_new_block_ids(self) -> list[int]:
        ids, self._new_block_ids = self._new_block_ids, []
        return ids

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        raise NotImplementedError(f"{cls.__name__} does not define a prefix-cache hit search")


def declared_span(spec: KVCacheSpec, traits: SpecTraits, trait: str, manager: str) -> int:
    """The span (tokens) ``spec`` declares in ``SpecTraits.<trait>`` (a window, a chunk), whatever its class;
    a manager that runs only such specs refuses one that declares none (UnsupportedConfigurationError)."""
    span = getattr(traits, trait)
    if not isinstance(span, int) or span <= 0:
        raise UnsupportedConfigurationError(
            f"{manager} runs specs that declare SpecTraits.{trait}; {type(spec).__name__} declares {span!r}."
        )
    return span


def shared_prefix_boundary(request: RequestView) -> int:
    """The request's shared-prefix junction (tokens; 0: none): an optional member of a request view, set by
    the engine from ``KVCacheCoordinator.lookup_prefix`` (kvspec's ``Request`` and vLLM 0.34's have it)."""
    junction: int = getattr(request, "shared_prefix_boundary", 0) or 0
    return junction


def truncate_to_alignment(
    computed: tuple[list[KVCacheBlock], ...], block_size: int, alignment_tokens: int
) -> None:
    """Pop blocks from every group until the hit is a multiple of ``alignment_tokens``."""
    if block_size == alignment_tokens:
        return
    while computed[0] and (len(computed[0]) * block_size) % alignment_tokens:
        for blocks in computed:
            blocks.pop()


def skips_blocks(manager_cls: type) -> bool:
    """Whether ``remove_skipped_blocks`` of ``manager_cls`` may free something: False only for a subclass of
    ``SingleTypeKVCacheManager`` that keeps its no-op skipping (full attention), so the coordinator need not
    call it every step. A manager written without the base class is always called."""
    if not issubclass(manager_cls, SingleTypeKVCacheManager):
        return True
    return (
        manager_cls.get_num_skipped_tokens is not SingleTypeKVCacheManager.get_num_skipped_tokens
        or manager_cls.remove_skipped_blocks is not SingleTypeKVCacheManager.remove_skipped_blocks
    )


def base_managers(managers: Sequence[object]) -> list[SingleTypeKVCacheManager] | None:
    """``managers`` typed as ``SingleTypeKVCacheManager`` when every one is built on it, else None.

    The coordinator calls the same protocol members on them either way; typed as the base class, the
    compiled build makes those per-step calls native calls instead of Python method calls (a plugin
    subclass written in Python is still dispatched to its own overrides)."""
    out: list[SingleTypeKVCacheManager] = []
    for manager in managers:
        if not isinstance(manager, SingleTypeKVCacheManager):
            return None
        out.append(manager)
    return out
