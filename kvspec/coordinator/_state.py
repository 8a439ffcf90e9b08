"""The state of the scheduler-facing coordinator and how it is built (compiled with :mod:`._core`).

:class:`CoordinatorState` holds what a coordinator is made of: the layout derived from the config, the one
block pool, one manager per KV cache group, the hit search, and which groups take each optional hook (read
once from the managers' declared capabilities). :mod:`._core` adds the per-step methods and
:mod:`._steps` the helpers they call. Units: tokens, blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final, cast

from mypy_extensions import mypyc_attr

from kvspec.blocks.eviction import EvictionContext, GroupInfo
from kvspec.blocks.pool import BlockId, BlockPool, CachedBlocksLookup, KVCacheBlock
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
from kvspec.coordinator.hit_search import PrefixHitSearch, split_spec_groups
from kvspec.coordinator.layout import (
    GroupLayout,
    derive_layout,
)
from kvspec.coordinator.options import CoordinatorOptions
from kvspec.coordinator.stats import PrefixCacheStats, group_event_metadata
from kvspec.errors import SchedulingError
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


@mypyc_attr(allow_interpreted_subclasses=True)  # CoordinatorCore and KVCacheCoordinator extend it
class CoordinatorState:
    """What a coordinator is made of, built once from its config, limits and options (see the module)."""

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


def _partial_hash_hits_apply(
    coord: CoordinatorState, manager_classes: Sequence[type[KVCacheManager]], dcp_world_size: int
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
