"""The scheduler-facing facade: one block pool, one manager per KV cache group, prefix-cache hits
that agree across groups, and the ``allocate_slots`` / ``free`` calls an engine makes every step.

:class:`KVCacheCoordinator` is :class:`kvspec.coordinator._core.CoordinatorCore` (compiled in the compiled
build) with a constructor whose arguments beartype checks (``KVSPEC_TYPECHECK``): a compiled constructor
would refuse a wrong argument with mypyc's bare ``TypeError`` instead of kvspec's ``KVSpecTypeError``.
It runs once per engine, so this plain-Python layer costs nothing per step. The per-step methods, their
atomicity and how they treat bad counts are documented in :mod:`kvspec.coordinator._core`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvspec.blocks.eviction import EvictionPolicyFactory
from kvspec.contracts.checking import check_door
from kvspec.contracts.release import ReleaseProfile
from kvspec.contracts.spec import SchedulerLimits
from kvspec.coordinator._core import CoordinatorCore, KVCacheBlocks, as_count, resolve_block_sizes
from kvspec.coordinator.hit_search import shared_prefix_junction
from kvspec.planning.config import KVCacheConfig
from kvspec.registry.core import AnyRegistry

__all__ = [
    "KVCacheBlocks",
    "KVCacheCoordinator",
    "as_count",
    "resolve_block_sizes",
    "shared_prefix_junction",
]


class KVCacheCoordinator(CoordinatorCore):
    """Scheduler API over all KV cache groups of one model (vLLM's KVCacheManager + coordinator).

    Construct it with a planned :class:`~kvspec.KVCacheConfig` and the run's :class:`~kvspec.SchedulerLimits`;
    the per-step methods (``get_computed_blocks``, ``allocate_slots``, ``free``, ...) are the core's.
    """

    @check_door(CoordinatorCore.__init__)
    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        limits: SchedulerLimits,
        *,
        enable_caching: bool = True,
        use_eagle: bool = False,
        enable_kv_cache_events: bool = False,
        log_stats: bool = False,
        hash_block_size: int | None = None,
        hash_algorithm: str = "sha256",
        registry: AnyRegistry | None = None,
        prefix_cache_retention_interval: int | None = None,
        profile: ReleaseProfile | None = None,
        hash_lookahead_tokens: int = 0,
        num_reprefillable_tokens: int = 0,
        zero_new_blocks: Sequence[bool] | None = None,
        eviction_policy: str | EvictionPolicyFactory | None = None,
        eviction_clock: Callable[[], float] | None = None,
        allow_partial_hash_hits: bool = False,
        shared_prefix_checkpoints: bool = False,
    ) -> None:
        """``allow_partial_hash_hits``: turn on sub-block prefix hits where they apply (vLLM 0.34's partial
        hash hits: a Mamba "align" group whose block is larger than the hash block, every other cached group
        able to search by hash block or hashed by its own block): hits then end on any hash-block boundary,
        and a hit ending inside a block is copied on write. The engine must then run the block copies
        ``take_block_copies`` hands out before the next forward pass and release their blocks with
        ``release_copied_blocks``. Off by default (vLLM's Scheduler runs the copies: its adapter turns it on);
        ``partial_hash_hits`` says whether it applies. ``shared_prefix_checkpoints``: with sub-block hits, EAGLE
        and no re-prefillable tokens, state groups also key their state at a request's shared-prefix junction
        (``Request.shared_prefix_boundary``), where the engine ends a chunk (vLLM 0.34's
        ``enable_mamba_shared_prefix_checkpoint``); ``shared_prefix_checkpoints_apply`` says whether it does.
        ``num_reprefillable_tokens``: the last computed tokens a multi-module MTP drafter may prefill
        again (vLLM 0.34's num_prefill_lookahead - 1); they are not published until final.
        ``hash_lookahead_tokens``: tokens after each block that the engine's block hash also covers
        (vLLM 0.34's EAGLE lookahead block hashes); blocks are published only once hashed. ``profile``: the vLLM release whose behaviour to reproduce (``kvspec.contracts.release``; None:
        ``DEFAULT_PROFILE``). ``prefix_cache_retention_interval`` (tokens, a multiple of the scheduler block; None: cache
        every full block) keeps windowed groups' cached tails only once per interval plus at the prompt's
        replay boundary (vLLM's VLLM_PREFIX_CACHE_RETENTION_INTERVAL); it needs a sliding-window group.
        ``zero_new_blocks``: per group, whether its new block ids are reported for zeroing
        (``take_new_block_ids``); None: each spec's ``zero_new_blocks`` trait.
        ``eviction_policy``: which free cached block is reused first when blocks run out, a name registered in
        ``kvspec.eviction`` ("lru", "lfu", "slru", "retention", "hybrid", or a plugin's) or a factory; None
        or "lru": LRU in vLLM's exact free-queue order. ``eviction_clock``: the policy's clock in seconds
        (None: ``time.monotonic``; a trace replay gives its simulated time)."""
        super().__init__(
            kv_cache_config,
            limits,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            enable_kv_cache_events=enable_kv_cache_events,
            log_stats=log_stats,
            hash_block_size=hash_block_size,
            hash_algorithm=hash_algorithm,
            registry=registry,
            prefix_cache_retention_interval=prefix_cache_retention_interval,
            profile=profile,
            hash_lookahead_tokens=hash_lookahead_tokens,
            num_reprefillable_tokens=num_reprefillable_tokens,
            zero_new_blocks=zero_new_blocks,
            eviction_policy=eviction_policy,
            eviction_clock=eviction_clock,
            allow_partial_hash_hits=allow_partial_hash_hits,
            shared_prefix_checkpoints=shared_prefix_checkpoints,
        )
