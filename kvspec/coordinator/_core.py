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
import operator
import time
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple, SupportsIndex, cast

from mypy_extensions import mypyc_attr

from kvspec.blocks.events import KVCacheEvent
from kvspec.blocks.eviction import EvictionContext, GroupInfo
from kvspec.blocks.hashing import BlockHasher
from kvspec.blocks.pool import BlockId, BlockPool, CachedBlocksLookup, KVCacheBlock
from kvspec.blocks.request import Request
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import (
    BLOCK_COPIES,
    BOUNDARY_STATES,
    CACHING_CADENCE,
    EXTERNAL_BLOCKS,
    PREFILL_END,
    PROMPT_TAIL,
    RETENTION,
    SUB_BLOCK_HITS,
    AttachesExternalBlocks,
    BlockCopy,
    BoundaryState,
    CachesPromptTails,
    CachingCadence,
    CopiesBlocks,
    KVCacheManager,
    ManagerContext,
    NeedsPrefillEnd,
    OffersBoundaryStates,
    RetentionAware,
    declared_capabilities,
)
from kvspec.contracts.spec import KVCacheSpec, SchedulerLimits
from kvspec.contracts.traits import SpecTraits, traits_of
from kvspec.coordinator.hit_search import PrefixHitSearch, shared_prefix_junction, split_spec_groups
from kvspec.coordinator.layout import (
    GroupLayout,
    check_retention_interval,
    derive_layout,
)
from kvspec.coordinator.options import CoordinatorOptions
from kvspec.coordinator.stats import PrefixCacheStats, annotate_events, group_event_metadata
from kvspec.errors import InvariantError, KVSpecTypeError, SchedulingError
from kvspec.eviction.registry import resolve_eviction_policy
from kvspec.managers.base import SingleTypeKVCacheManager, base_managers, skips_blocks
from kvspec.planning.config import KVCacheConfig


class KVCacheBlocks:
    """Blocks per group (outer index = group id), as returned by allocation and hit lookup."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: tuple[Sequence[KVCacheBlock], ...]) -> None:
        self.blocks = blocks

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(list(a) + list(b) for a, b in zip(self.blocks, other.blocks)))

    def get_block_ids(self) -> tuple[list[BlockId], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)

    def get_unhashed_block_ids(self) -> list[BlockId]:
        """Ids of blocks without a hash; only for single-group configs."""
        if len(self.blocks) != 1:
            raise SchedulingError("get_unhashed_block_ids() needs exactly one KV cache group.")
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def get_unhashed_block_ids_all_groups(self) -> list[BlockId]:
        return [b.block_id for g in self.blocks for b in g if b.block_hash is None and not b.is_null]

    def is_empty(self) -> bool:
        return not any(self.blocks)

    def __repr__(self) -> str:
        return f"KVCacheBlocks({self.get_block_ids()})"


def _build_pool(config: KVCacheConfig, layout: GroupLayout, options: CoordinatorOptions) -> BlockPool:
    """The one block pool of a coordinator: ``config.num_blocks`` blocks, the profile's pool rules, and the
    eviction policy the options name (None: vLLM's LRU free-queue order)."""
    policy_factory = resolve_eviction_policy(options.eviction_policy)
    rules = options.profile.pool
    policy = None
    cached_blocks = CachedBlocksLookup()
    if policy_factory is not None:
        policy = policy_factory(
            EvictionContext(
                num_blocks=config.num_blocks,
                groups=tuple(
                    GroupInfo(
                        block_tokens=block_tokens,
                        page_bytes=spec.page_size_bytes,
                        holds_prefix_state=t.hits_at_own_block_boundaries,
                        needed_by_longer_hits=t.prefix_hits_left_closed,
                    )
                    for spec, t, block_tokens in zip(
                        layout.specs, layout.traits, layout.group_block_sizes, strict=True
                    )
                ),
                clock=time.monotonic if options.eviction_clock is None else options.eviction_clock,
                cached_blocks=cached_blocks,
            )
        )
    pool = BlockPool(
        config.num_blocks,
        enable_caching=options.enable_caching,
        hash_block_size=layout.hash_block_size,
        enable_kv_cache_events=options.enable_kv_cache_events,
        free_unhashed_first=rules.free_unhashed_first,
        coarse_hash_is_last_fine=rules.coarse_hash_is_last_fine,
        hash_lookahead_tokens=options.hash_lookahead_tokens,
        eviction_policy=policy,
    )
    cached_blocks.bind(pool.cached_block_hash_to_block)
    return pool


class _Counts(NamedTuple):
    """``allocate_slots``'s counts on the admission path, each checked (``as_count``)."""

    new_tokens: int
    new_computed: int
    lookahead: int
    external: int
    encoder: int
    reserved: int
    in_flight: int
    watermark: int


def as_count(name: str, value: SupportsIndex) -> int:
    """``value`` (tokens or blocks) as an int >= 0: any integer with ``__index__`` (Python, numpy, a 0-d
    integer tensor). A bool, a float or a negative number is a SchedulingError naming allocate_slots'
    argument ``name``."""
    if type(value) is int:  # not isinstance: bool is an int, and a compiled build unboxes True to 1
        if value >= 0:
            return value
    elif not isinstance(value, bool):
        try:
            count = operator.index(value)
        except TypeError:
            count = -1
        if count >= 0:
            return count
    raise SchedulingError(f"allocate_slots: {name} must be an int >= 0, got {value!r}.")


@mypyc_attr(allow_interpreted_subclasses=True)  # kvspec.coordinator.KVCacheCoordinator checks construction
class CoordinatorCore:
    """The per-step methods of :class:`kvspec.coordinator.KVCacheCoordinator`; construct that class (the
    same class with a checked constructor), never this one."""

    def __init__(
        self, kv_cache_config: KVCacheConfig, limits: SchedulerLimits, options: CoordinatorOptions
    ) -> None:
        # Documented on kvspec.coordinator.KVCacheCoordinator, the checked public door.
        layout = derive_layout(kv_cache_config, limits, options)
        #: The settings this coordinator was built from (validated; see ``CoordinatorOptions``).
        self.options: Final = options
        self.profile: Final = options.profile
        self.kv_cache_config = kv_cache_config
        self.limits = limits
        self.max_model_len = limits.max_model_len
        self.enable_caching = options.enable_caching
        self.use_eagle = options.use_eagle
        self.hash_algorithm = options.hash_algorithm
        self.specs: tuple[KVCacheSpec, ...] = layout.specs
        self.traits: tuple[SpecTraits, ...] = layout.traits
        self.scheduler_block_size = layout.scheduler_block_size
        self.hash_block_size = layout.hash_block_size
        self._group_cp: Final = layout.group_cp
        #: Tokens one block of each group holds, context parallelism included.
        self.group_block_sizes: Final = layout.group_block_sizes
        self.prefix_cache_retention_interval = layout.retention_interval
        self.block_pool = _build_pool(kv_cache_config, layout, options)
        self.hash_lookahead_tokens: Final = options.hash_lookahead_tokens
        # Blocks are published only as far as the request is hashed (lookahead hashes lag the tokens).
        self._publish_only_hashed: Final = (
            options.hash_lookahead_tokens > 0 or self.profile.pool.publish_only_hashed_blocks
        )
        self._eagle_group_ids: Final = layout.eagle_group_ids
        self.num_reprefillable_tokens: Final = options.num_reprefillable_tokens
        #: Sub-block prefix hits apply (``allow_partial_hash_hits`` and a model they apply to).
        self.partial_hash_hits: Final = options.allow_partial_hash_hits and _partial_hash_hits_apply(
            self, layout.manager_classes, limits.decode_context_parallel_size
        )
        #: State groups key their state at the shared-prefix junction too (``shared_prefix_checkpoints``
        #: where it applies: sub-block hits, EAGLE, nothing re-prefilled).
        self.shared_prefix_checkpoints_apply: Final = (
            options.shared_prefix_checkpoints
            and self.partial_hash_hits
            and bool(self._eagle_group_ids)
            and options.num_reprefillable_tokens == 0
        )
        #: Hits end on a multiple of this (tokens): the hash block with sub-block hits, else the scheduler
        #: block (vLLM 0.34's cache_hit_alignment_tokens).
        self.cache_hit_alignment_tokens: Final = (
            self.hash_block_size if self.partial_hash_hits else self.scheduler_block_size
        )
        # Blocks taken from a copy's endpoints and not yet released by the engine (block id -> references).
        self._copy_held: dict[int, int] = {}
        self.managers: list[KVCacheManager] = [
            manager_cls(self._manager_context(gid, options))
            for gid, manager_cls in enumerate(layout.manager_classes)
        ]
        self._route_capabilities()
        self.hit_search = PrefixHitSearch(
            spec_groups=split_spec_groups(
                self.specs, self.traits, self.managers, self._eagle_group_ids, self._group_cp
            ),
            num_groups=len(self.specs),
            block_pool=self.block_pool,
            hash_block_size=self.hash_block_size,
            scheduler_block_size=self.scheduler_block_size,
            rules=self.profile.hit_search,
            partial_hash_hits=self.partial_hash_hits,
        )
        # Events describe the whole group (a uniform-type group's kind is its layers', not its
        # representative's), as vLLM annotates them.
        self._event_metadata = group_event_metadata(
            [self.profile.event_traits(traits_of(g.kv_cache_spec)) for g in kv_cache_config.kv_cache_groups],
            list(layout.capability_ids),
        )
        self.block_pool.stored_event_kinds = [(m.kind, m.sliding_window) for m in self._event_metadata]
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if options.log_stats else None
        self._empty = KVCacheBlocks(tuple(() for _ in self.specs))
        # Requests whose prefix hit was attached, by id, with the object admitted: later calls with that
        # object take the short per-step path; another object under a live id is refused at the door.
        self._admitted: dict[str, RequestView] = {}
        #: Admission checks (``CoordinatorOptions.check_admissions``).
        self.check_admissions = options.check_admissions
        self._cached_tokens: dict[str, int] = {}

    def _manager_context(self, gid: int, options: CoordinatorOptions) -> ManagerContext:
        """Group ``gid``'s manager's settings."""
        spec, traits, limits = self.specs[gid], self.traits[gid], self.limits
        return ManagerContext(
            kv_cache_spec=spec,
            traits=traits,
            block_pool=self.block_pool,
            kv_cache_group_id=gid,
            scheduler_block_size=self.scheduler_block_size,
            enable_caching=options.enable_caching,
            dcp_world_size=self._group_cp[gid][0],
            pcp_world_size=self._group_cp[gid][1],
            max_admission_blocks_per_request=traits.admission_cap_blocks(
                traits.block_tokens(spec.block_size), limits.batched_tokens, limits.max_model_len
            ),
            use_eagle=gid in self._eagle_group_ids,
            model_uses_eagle=bool(self._eagle_group_ids),
            prefix_cache_retention_interval=self.prefix_cache_retention_interval,
            max_model_len=limits.max_model_len,
            max_num_batched_tokens=limits.batched_tokens,
            profile=self.profile,
            zero_new_blocks=None if options.zero_new_blocks is None else options.zero_new_blocks[gid],
            partial_hash_hits=self.partial_hash_hits,
            shared_prefix_checkpoints=self.shared_prefix_checkpoints_apply,
        )

    def _route_capabilities(self) -> None:
        """Which managers each per-step path calls, read once from what each manager declares
        (``kvspec.contracts.manager.declared_capabilities``, checked at registration), never from its class."""
        managers = self.managers
        caps = [declared_capabilities(type(m)) for m in managers]
        # Each group's token target in allocate_slots: decoder groups follow the request's tokens; a group
        # sized by the encoder input (cross attention) gets num_encoder_tokens when the request is admitted
        # and nothing after (vLLM's one static allocation).
        self._is_cross = tuple(t.allocate_per_encoder_input for t in self.traits)
        self._decoder_groups = tuple((g, m) for g, m in enumerate(managers) if not self._is_cross[g])
        self._encoder_groups = tuple((g, m) for g, m in enumerate(managers) if self._is_cross[g])
        self._decoder_managers = tuple(m for _, m in self._decoder_groups)
        # Groups that publish blocks to the prefix cache: not encoder-sized, and prefix-cacheable.
        self._caching_groups = tuple(
            (g, m)
            for g, m in enumerate(managers)
            if not self._is_cross[g] and self.traits[g].prefix_cacheable
        )
        # Groups that register the prompt's tail inside a block as a partial entry (vLLM 0.34): left-closed
        # hits, a block larger than the hash block, and a manager declaring the hook.
        self._tail_groups: dict[int, Callable[[RequestView, int], None]] = {
            g: cast(CachesPromptTails, m).cache_prompt_tail
            for g, m in self._caching_groups
            if self.profile.hit_search.partial_prompt_tail_entries
            and self.traits[g].prefix_hits_left_closed
            and self.group_block_sizes[g] != self.hash_block_size
            and PROMPT_TAIL in caps[g]
        }
        # A manager whose cache_blocks acts without a new full block (vLLM 0.32's Mamba "align") turns off
        # the skipping of calls that complete no scheduler block. Sub-block hits publish up to the computed
        # tokens, unaligned: every call may key something.
        self._cache_every_call = self.partial_hash_hits or any(
            CACHING_CADENCE in caps[g] and cast(CachingCadence, m).caches_on_every_call
            for g, m in self._caching_groups
        )
        #: Decoder groups whose managers attach external tokens in two phases (every group's hits, then
        #: every group's external blocks); a per-group zeroing choice needs every decoder's.
        self._external_attachers = tuple(
            (g, cast(AttachesExternalBlocks, m))
            for g, m in self._decoder_groups
            if EXTERNAL_BLOCKS in caps[g]
        )
        self._every_decoder_attaches_external = len(self._external_attachers) == len(self._decoder_groups)
        # External tokens attach in two phases in hybrids, so an external allocation cannot evict a later
        # group's hit.
        self._two_phase_external = len(self._decoder_groups) > 1 and self._every_decoder_attaches_external
        # Managers that can free blocks early; full attention's remove_skipped_blocks is a no-op.
        self._skipping_managers = [m for m in managers if skips_blocks(type(m))]
        self._prefill_end_managers = [
            cast(NeedsPrefillEnd, m)
            for g, m in enumerate(managers)
            if PREFILL_END in caps[g] and cast(NeedsPrefillEnd, m).wants_prefill_end
        ]
        self._copying_groups = tuple(
            (g, cast(CopiesBlocks, m))
            for g, m in enumerate(managers)
            if BLOCK_COPIES in caps[g] or SUB_BLOCK_HITS in caps[g]
        )
        self._boundary_managers = tuple(
            cast(OffersBoundaryStates, m) for g, m in enumerate(managers) if BOUNDARY_STATES in caps[g]
        )
        self._retention_managers = tuple(
            cast(RetentionAware, m) for g, m in enumerate(managers) if RETENTION in caps[g]
        )
        # The per-step paths' managers typed as the base class when all are built on it (native calls in the
        # compiled build; None: the protocol's calls).
        self._base_all: list[SingleTypeKVCacheManager] | None = base_managers(managers)
        self._base_decoder_list: list[SingleTypeKVCacheManager] | None = base_managers(self._decoder_managers)
        # A one-group model's caching manager, typed as the base class when built on it (the per-step
        # caching call; a hybrid's groups are called through the protocol).
        caching_base = base_managers([m for _, m in self._caching_groups[:1]])
        self._single_caching_base: SingleTypeKVCacheManager | None = caching_base[0] if caching_base else None

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
        blocks, num_hit_tokens, uncached = _lookup_prefix(self, request, request.num_tokens - 1)
        _record_prefix_hit(self, request, num_hit_tokens)
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
        return _lookup_prefix(self, request, max_length)

    def record_prefix_hit(self, request: RequestView, num_hit_tokens: int) -> None:
        """Count one prefix-cache query of ``request`` that hit ``num_hit_tokens`` tokens (with log_stats;
        a request that skips cache reads is not counted)."""
        _record_prefix_hit(self, request, num_hit_tokens)

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

        Two paths: a running request's step (``_allocate_running``: the call made every step, its counts
        tested without a call per count) and everything else (``_admit``: every count checked, hits and
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
                raise _not_a_request("allocate_slots", request) from None
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
            return _allocate_running(
                self,
                request,
                request_id,
                num_new_tokens,
                num_lookahead_tokens,
                reserved_blocks,
                delay_cache_blocks,
            )
        return _admit(
            self,
            request,
            request_id,
            _Counts(
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
        return _count_new_blocks(
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
        _cache_blocks(self, request, num_computed_tokens)

    def free(self, request: RequestView) -> None:
        """Release every block of the request, tail first (so tails are evicted first). A request holding
        no block (never admitted, or already freed) is a no-op, as an engine frees aborted waiting ones."""
        try:
            request_id = request.request_id
        except AttributeError:
            raise _not_a_request("free", request) from None
        _free_request_id(self, request_id)

    def free_request_id(self, request_id: str) -> None:
        _free_request_id(self, request_id)

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


# The per-step helpers are module functions, not methods: KVCacheCoordinator is a Python subclass of the
# compiled CoordinatorCore, and a method call on its instance from compiled code goes through Python
# (attribute lookup, argument parsing, boxing); a function call on it is a direct C call.


def _lookup_prefix(
    core: CoordinatorCore, request: RequestView, max_length: int
) -> tuple[KVCacheBlocks, int, int]:
    """``CoordinatorCore.lookup_prefix``."""
    if not core.enable_caching or request.skip_reading_prefix_cache or not core.specs:
        return core._empty, 0, 0
    blocks, num_hit_tokens, uncached = core.hit_search.find_with_uncached(request.block_hashes, max_length)
    return KVCacheBlocks(blocks), num_hit_tokens, uncached


def _record_prefix_hit(core: CoordinatorCore, request: RequestView, num_hit_tokens: int) -> None:
    """``CoordinatorCore.record_prefix_hit``."""
    if (
        core.prefix_cache_stats is None
        or not core.enable_caching
        or request.skip_reading_prefix_cache
        or not core.specs
    ):
        return
    core.prefix_cache_stats.record(request.num_tokens, num_hit_tokens, request.num_preemptions > 0)


def _allocate_running(
    core: CoordinatorCore,
    request: RequestView,
    request_id: str,
    new_tokens: int,
    lookahead: int,
    reserved: int,
    delay_cache_blocks: bool,
) -> KVCacheBlocks | None:
    """A running request's step: no hit, no external or encoder tokens, nothing in flight; the block
    counts inline (a call with eight arguments costs the pure build a tenth of the step)."""
    max_len = core.max_model_len
    if isinstance(request, Request):  # a native read in the compiled build (see allocate_slots)
        total = request.num_computed_tokens
    else:
        total = request.num_computed_tokens
    if total > max_len:
        total = max_len
    main = total + new_tokens
    need = main + lookahead
    if need > max_len:
        need = max_len
    _note_prefill_end(core, request, request_id)
    _remove_skipped(core, request, request_id, total, 0)
    num_blocks = 0
    base = core._base_decoder_list
    if base is not None:
        for base_manager in base:
            num_blocks += base_manager.get_num_blocks_to_allocate(request_id, need, (), total, main)
    else:
        for manager in core._decoder_managers:
            num_blocks += manager.get_num_blocks_to_allocate(request_id, need, (), total, main)
    if num_blocks > core.block_pool.free_block_queue.num_free_blocks - reserved:
        return None
    return _allocate_and_cache(core, request, request_id, num_blocks, need, main, 0, delay_cache_blocks)


def _admit(
    core: CoordinatorCore,
    request: RequestView,
    request_id: str,
    counts: _Counts,
    new_computed_blocks: KVCacheBlocks | None,
    full_sequence_must_fit: bool,
    delay_cache_blocks: bool,
    skip_zeroing_group_ids: tuple[int, ...],
) -> KVCacheBlocks | None:
    """A request's admission (its prefix hit, external and encoder tokens attached), or a call with any
    of the rarer counts: every check before anything changes."""
    new_tokens, new_computed, external = counts.new_tokens, counts.new_computed, counts.external
    encoder, watermark = counts.encoder, counts.watermark
    owner = core._admitted.get(request_id)
    if owner is not None and owner is not request:
        if core.check_admissions:
            raise SchedulingError(
                f"Request id {request_id!r} is in use by a live request (another Request object): free "
                "that one first, or give this one its own id."
            )
        core._admitted[request_id] = request  # the engine's new object for the same request
    attach = owner is None or new_computed_blocks is not None
    if owner is None and core.check_admissions:
        _check_admission(core, request, new_computed, new_computed_blocks)
    if attach and core.enable_caching and owner is None:
        _check_hasher(core, request)
    if new_computed_blocks is not None:
        _check_blocks_are_ours(core, new_computed_blocks)
    if new_tokens == 0 and external == 0 and new_computed == 0:
        # A step may schedule no token of its own and still adopt computed ones: an external load,
        # or a prefix hit whose first chunk ends inside the range the engine replays.
        raise SchedulingError(
            "num_new_tokens must be greater than 0 when there are no computed tokens to adopt "
            "(a prefix hit or external tokens)."
        )
    computed = core._empty.blocks if new_computed_blocks is None else new_computed_blocks.blocks
    # The token targets, computed once for every group (see _count_new_blocks for encoder groups).
    max_len = core.max_model_len
    local = request.num_computed_tokens + new_computed
    total = local + external
    if total > max_len:
        total = max_len
    main = total + new_tokens
    need = main + counts.lookahead
    if need > max_len:
        need = max_len
    _note_prefill_end(core, request, request_id)
    if full_sequence_must_fit:
        whole = min(request.num_tokens, max_len)
        free = core.block_pool.free_block_queue.num_free_blocks
        needed = _count_new_blocks(core, request_id, whole, whole, computed, total, encoder, True, local)
        if needed + watermark > free:
            return None
    _remove_skipped(core, request, request_id, total, counts.in_flight)
    if attach or encoder:
        num_blocks = _count_new_blocks(core, request_id, need, main, computed, total, encoder, False, local)
    else:
        num_blocks = 0
        for manager in core._decoder_managers:
            num_blocks += manager.get_num_blocks_to_allocate(request_id, need, (), total, main)
    if num_blocks + watermark > core.block_pool.free_block_queue.num_free_blocks - counts.reserved:
        return None
    if attach:
        _attach(core, request, request_id, computed, local, external, new_computed, skip_zeroing_group_ids)
    return _allocate_and_cache(core, request, request_id, num_blocks, need, main, encoder, delay_cache_blocks)


def _note_prefill_end(core: CoordinatorCore, request: RequestView, request_id: str) -> None:
    """Tell the managers that reserve by it where the request's prefill ends (before they count)."""
    if core._prefill_end_managers:
        # Where the scheduler's prefill ends: `num_tokens - 1` covers a request resuming its output.
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        for noting in core._prefill_end_managers:
            noting.note_prefill_end(request_id, prefill_end)


def _remove_skipped(
    core: CoordinatorCore, request: RequestView, request_id: str, total: int, in_flight: int
) -> None:
    """Free the blocks that fell out of a window, behind the processed tokens (before counting)."""
    if core._skipping_managers:
        prompt = request.num_prompt_tokens
        processed = total - in_flight if total > in_flight else 0
        for manager in core._skipping_managers:
            manager.remove_skipped_blocks(request_id, processed, prompt)


def _attach(
    core: CoordinatorCore,
    request: RequestView,
    request_id: str,
    computed: tuple[Sequence[KVCacheBlock], ...],
    local: int,
    external: int,
    new_computed: int,
    skip_zeroing_group_ids: tuple[int, ...],
) -> None:
    """Take the prefix hit's blocks and blocks for external tokens in every group; the request is
    admitted from here on."""
    if (
        external
        and (core._two_phase_external or (skip_zeroing_group_ids and core._every_decoder_attaches_external))
        and request_id not in core._admitted
    ):
        # Every group's hit blocks are taken before any group allocates for external tokens, or
        # that allocation could evict a later group's hit and hand one block out twice.
        for gid, attacher in core._external_attachers:
            attacher.add_local_computed_blocks(request_id, computed[gid], local, external)
        for gid, attacher in core._external_attachers:
            attacher.allocate_external_computed_blocks(
                request_id, local, external, gid not in skip_zeroing_group_ids
            )
    else:
        for gid, manager in core._decoder_groups:
            manager.allocate_new_computed_blocks(request_id, computed[gid], local, external)
    for _, manager in core._encoder_groups:
        manager.allocate_new_computed_blocks(request_id, (), 0, 0)
    core._admitted[request_id] = request
    if core.block_pool.eviction_policy is not None and new_computed:
        for group_blocks in computed:
            core.block_pool.note_hit(request, group_blocks)


def _allocate_and_cache(
    core: CoordinatorCore,
    request: RequestView,
    request_id: str,
    num_blocks: int,
    need: int,
    main: int,
    encoder: int,
    delay_cache_blocks: bool,
) -> KVCacheBlocks:
    """Take the ``num_blocks`` counted (they fit) and publish the blocks the request completed."""
    if not num_blocks:
        result = core._empty
    elif not core._encoder_groups:
        base_all = core._base_all
        if base_all is not None:
            result = KVCacheBlocks(tuple([m.allocate_new_blocks(request_id, need, main) for m in base_all]))
        else:
            result = KVCacheBlocks(
                tuple([manager.allocate_new_blocks(request_id, need, main) for manager in core.managers])
            )
    else:
        cross = core._is_cross
        result = KVCacheBlocks(
            tuple(
                [
                    (manager.allocate_new_blocks(request_id, encoder, encoder) if encoder else [])
                    if cross[gid]
                    else manager.allocate_new_blocks(request_id, need, main)
                    for gid, manager in enumerate(core.managers)
                ]
            )
        )
    if core.enable_caching and not delay_cache_blocks:
        if isinstance(request, Request):  # a native read in the compiled build (see allocate_slots)
            num_tokens = len(request.all_token_ids)
        else:
            num_tokens = len(request.all_token_ids)
        if main < num_tokens:
            num_tokens = main
        scheduler_block = core.scheduler_block_size
        # Most decode steps complete no block: skip the call (cache_blocks would return at once).
        if (
            core._eagle_group_ids
            or core._cache_every_call
            or core._cached_tokens.get(request_id, -1) < num_tokens // scheduler_block * scheduler_block
        ):
            _cache_blocks(core, request, num_tokens)
    return result


def _check_admission(
    core: CoordinatorCore, request: RequestView, new_computed: int, new_computed_blocks: KVCacheBlocks | None
) -> None:
    """A request's first allocation: its prompt fits max_model_len, and the computed tokens it claims are
    backed by hit blocks in every per-token decoder group (what ``get_computed_blocks`` returned: a block
    per hit block, null blocks standing for those a window dropped). Once per request,
    never on the per-step path."""
    if request.num_prompt_tokens > core.max_model_len:
        raise SchedulingError(
            f"Request {request.request_id!r} has a prompt of {request.num_prompt_tokens:,} tokens, over "
            f"max_model_len {core.max_model_len:,}; an engine refuses it before it reaches the cache."
        )
    if not new_computed:
        return
    blocks = () if new_computed_blocks is None else new_computed_blocks.blocks
    for gid, _ in core._decoder_groups:
        traits = core.traits[gid]
        if traits.fixed_state_per_request or not traits.prefix_cacheable:
            continue  # a state or ring group's hit is one state; a never-cached group has no hit
        held = len(blocks[gid]) * core.group_block_sizes[gid] if gid < len(blocks) else 0
        if held < new_computed:
            raise SchedulingError(
                f"Request {request.request_id!r} claims {new_computed:,} computed tokens, but group {gid}'s "
                f"hit blocks hold {held:,}; pass the blocks and token count get_computed_blocks returned."
            )


def _check_hasher(core: CoordinatorCore, request: RequestView) -> None:
    """A request is hashed with this coordinator's block size (with prefix caching, hashes are read)."""
    hasher = request.block_hasher
    if hasher is None or hasher.block_size != core.hash_block_size:
        got = "no block_hasher" if hasher is None else f"a block_hasher of {hasher.block_size} tokens"
        raise SchedulingError(
            f"Request {request.request_id!r} has {got}, but this coordinator hashes blocks of "
            f"{core.hash_block_size} tokens; build it with block_hasher=coordinator.make_block_hasher()."
        )


def _check_blocks_are_ours(core: CoordinatorCore, new_computed_blocks: KVCacheBlocks) -> None:
    """Blocks handed back to allocate_slots come from this pool. One block per group is tested: a hit
    list is one coordinator's or another's, and any block of another pool fails the identity test."""
    groups = new_computed_blocks.blocks
    if len(groups) != len(core.specs):
        raise SchedulingError(
            f"new_computed_blocks has {len(groups)} groups; this coordinator has {len(core.specs)}."
        )
    blocks = core.block_pool.blocks
    for group in groups:
        if group:
            block = group[-1]
            if not (0 <= block.block_id < len(blocks)) or blocks[block.block_id] is not block:
                raise SchedulingError(
                    f"new_computed_blocks holds block {block.block_id}, which is not a block of this "
                    "coordinator's pool; pass what this coordinator's get_computed_blocks returned."
                )


def _count_new_blocks(
    coord: CoordinatorCore,
    request_id: str,
    num_tokens: int,
    num_tokens_main_model: int,
    computed: tuple[Sequence[KVCacheBlock], ...],
    total_computed: int,
    num_encoder_tokens: int,
    apply_admission_cap: bool,
    num_local_computed: int = 0,
) -> int:
    """Free-queue blocks allocate_slots would take: decoder groups up to ``num_tokens`` (with the hit blocks
    ``computed`` attached), encoder-sized groups up to ``num_encoder_tokens`` with no hit (nothing when it
    is 0: the encoder input was allocated at admission)."""
    total = 0
    partial = coord.partial_hash_hits and num_local_computed > 0
    sizes = coord.group_block_sizes
    for gid, manager in coord._decoder_groups:
        total += manager.get_num_blocks_to_allocate(
            request_id, num_tokens, computed[gid], total_computed, num_tokens_main_model, apply_admission_cap
        )
        if partial and computed[gid] and num_local_computed % sizes[gid]:
            total += 1  # the hit ends inside this group's block: its private copy (copy on write)
    if num_encoder_tokens:
        for _, manager in coord._encoder_groups:
            total += manager.get_num_blocks_to_allocate(
                request_id, num_encoder_tokens, (), 0, num_encoder_tokens, apply_admission_cap
            )
    return total


def _cache_blocks(coord: CoordinatorCore, request: RequestView, num_computed_tokens: int) -> None:
    """Publish the request's full blocks up to ``num_computed_tokens`` (aligned for hybrids)."""
    if not coord.enable_caching:
        return
    if coord._publish_only_hashed and not coord.partial_hash_hits:
        # A block's hash may come later (lookahead hashes wait for the tokens after it): publish what is hashed.
        # (With sub-block hits each manager bounds its full blocks by the hashes instead: a state keyed inside
        # a block must see the tokens really computed.)
        hashed = len(request.block_hashes) * coord.hash_block_size
        if hashed < num_computed_tokens:
            num_computed_tokens = hashed
    scheduler_block = coord.scheduler_block_size
    # The last tokens a multi-module MTP drafter may re-prefill are not final: not published yet.
    reprefillable = coord.num_reprefillable_tokens
    single = len(coord.specs) == 1
    if reprefillable and single:
        num_computed_tokens = (
            num_computed_tokens - reprefillable if num_computed_tokens > reprefillable else 0
        )
    # Sub-block hits publish every computed token: a hit may end on any hash-block boundary.
    aligned = (
        num_computed_tokens
        if coord.partial_hash_hits
        else num_computed_tokens // scheduler_block * scheduler_block
    )
    if not coord._eagle_group_ids:
        # Nothing new to publish until another scheduler block is complete (the common decode step).
        if coord._cached_tokens.get(request.request_id, -1) >= aligned and not coord._cache_every_call:
            return
        coord._cached_tokens[request.request_id] = aligned
    groups = coord._caching_groups
    if single:
        base = coord._single_caching_base
        if base is not None:
            base.cache_blocks(request, num_computed_tokens)
        elif groups:
            groups[0][1].cache_blocks(request, num_computed_tokens)
        return
    finalized = num_computed_tokens - reprefillable if num_computed_tokens > reprefillable else 0
    finalized_aligned = (
        finalized if coord.partial_hash_hits else finalized // scheduler_block * scheduler_block
    )
    tails = coord._tail_groups
    for gid, manager in groups:
        n = aligned
        if gid in coord._eagle_group_ids and aligned > 0:
            # An EAGLE hit matches one block past the aligned boundary and drops it: that block is cached.
            n = min(
                finalized,
                finalized_aligned + coord.group_block_sizes[gid],
            )
        manager.cache_blocks(request, n)
        if tails and gid in tails:
            tails[gid](request, n)


def _partial_hash_hits_apply(
    coord: CoordinatorCore, manager_classes: Sequence[type[KVCacheManager]], dcp_world_size: int
) -> bool:
    """Whether sub-block hits apply to this model (vLLM 0.34's ``partial_hash_hits_enabled``): a cached
    group of state snapshots ("align" Mamba) whose manager can hit inside its block and whose block is larger
    than the hash block (or as large, under DCP), and every other cached group's manager able to search by
    hash block or its block the hash block. Needs the partial prompt-tail entries of 0.34's pool."""
    profile = coord.profile
    if not (
        coord.enable_caching
        and profile.hit_search.partial_prompt_tail_entries
        and profile.pool.coarse_hash_is_last_fine
    ):
        return False
    hash_block = coord.hash_block_size
    rows = list(zip(coord.specs, coord.traits, manager_classes, coord.group_block_sizes, strict=True))

    def fine(cls: type[KVCacheManager]) -> bool:
        return SUB_BLOCK_HITS in declared_capabilities(cls)

    if not any(
        t.prefix_cacheable
        and t.hits_at_own_block_boundaries
        and fine(cls)
        and getattr(spec, "mamba_cache_mode", "align") == "align"
        and (size > hash_block if dcp_world_size == 1 else size >= hash_block)
        for spec, t, cls, size in rows
    ):
        return False
    return all(not t.prefix_cacheable or fine(cls) or size == hash_block for _, t, cls, size in rows)


def _not_a_request(method: str, request: object) -> KVSpecTypeError:
    return KVSpecTypeError(
        f"{method} takes the Request (a kvspec Request or an engine's RequestView), got "
        f"{type(request).__name__} {request!r:.60}; pass the object, not its id."
    )


def _free_request_id(coord: CoordinatorCore, request_id: str) -> None:
    coord._admitted.pop(request_id, None)
    coord._cached_tokens.pop(request_id, None)
    base = coord._base_all
    if base is not None:
        for base_manager in base:
            base_manager.free(request_id)
        return
    for manager in coord.managers:
        manager.free(request_id)
