"""kvspec's coordinator behind the ``KVCacheManager`` interface vLLM 0.23.0's ``Scheduler`` calls
(``Vllm023KVCacheManager``); the later releases' adapters build on it (``vllm_adapter_034``), and
``vllm_kv_cache_manager`` installs the one the installed vLLM speaks.

It takes the constructor arguments vLLM's scheduler passes (vLLM's ``KVCacheConfig`` with vLLM spec
objects) and answers the calls the scheduler makes (listed from vLLM 0.23.0's ``v1/core/sched/scheduler.py``):
``get_computed_blocks``, ``allocate_slots``, ``free``, ``remove_skipped_blocks``, ``evict_blocks``,
``reset_prefix_cache``, ``get_num_common_prefix_blocks``, ``take_events``, ``get_blocks``, ``get_block_ids``,
``cache_blocks``, ``take_new_block_ids``, ``new_step_starts``, ``usage``, ``make_prefix_cache_stats``,
``empty_kv_cache_blocks``, ``block_pool`` and ``coordinator.get_num_blocks_to_allocate``.

What it does is translation only; every decision (block ids, hits, admission, eviction) is kvspec's:

- vLLM's spec objects become kvspec's (``kvspec.integrations.vllm.to_kvspec``) and the config a kvspec
  ``KVCacheConfig``;
- a vLLM ``Request`` is read through ``VllmRequestView`` (no copy: ``block_hashes`` and ``all_token_ids``
  are vLLM's own lists, hashed by vLLM's block hasher at ``hash_block_size`` tokens);
- results are vLLM's ``KVCacheBlocks`` holding kvspec's blocks (they carry ``block_id``, ``ref_cnt``,
  ``block_hash``, ``is_null`` as vLLM's do), stats vLLM's ``PrefixCacheStats``, events vLLM's
  ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``.

Constructing the adapter imports vLLM; importing this module does not.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Iterable
from typing import Any

from kvspec.blocks.eviction import EvictionPolicyFactory
from kvspec.blocks.hashing import BlockHasher
from kvspec.blocks.pool import BlockId, KVCacheBlock
from kvspec.contracts.release import ReleaseProfile, profile_for_vllm_version
from kvspec.contracts.spec import SchedulerLimits
from kvspec.coordinator import CoordinatorOptions, KVCacheBlocks, KVCacheCoordinator
from kvspec.coordinator.prefix_diagnosis import diagnose_prefix_caching
from kvspec.coordinator.stats import PrefixCacheStats
from kvspec.integrations.vllm import SpecConverter
from kvspec.integrations.vllm_adoption import adopt_vllm_registrations, check_adopted_specs
from kvspec.integrations.vllm_events import event_to_vllm
from kvspec.integrations.vllm_facades import (
    _BlockPoolFacade,
    _coordinator_facade,
    _retention_interval,
)
from kvspec.integrations.vllm_planning import config_from_vllm
from kvspec.integrations.vllm_request_view import VllmRequestView
from kvspec.registry.builtins import default_registry
from kvspec.registry.core import AnyRegistry

__all__ = ["Vllm023KVCacheManager", "scheduler_options"]


#: The modules that define a release's adapter (a subclass named elsewhere is a binding, not a release).
_ADAPTER_MODULES = ("kvspec.integrations.vllm_adapter_",)


class Vllm023KVCacheManager:
    """vLLM 0.23.0's ``KVCacheManager`` interface over ``kvspec.KVCacheCoordinator`` (see the module).

    Each release's adapter takes the arguments its release's Scheduler passes (plus the settings ``install``
    binds: ``registry``, ``spec_converter``, ``profile``, ``eviction_policy``, ``default_retention_seconds``),
    turns them into one :class:`~kvspec.coordinator.CoordinatorOptions` and one ``SchedulerLimits``, and
    starts from those (:meth:`_start`); nothing else is forwarded setting by setting."""

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
        eviction_policy: str | EvictionPolicyFactory | None = None,
        default_retention_seconds: float | None = None,
    ) -> None:
        limits = SchedulerLimits(
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            decode_context_parallel_size=dcp_world_size,
            prefill_context_parallel_size=pcp_world_size,
        )
        options = scheduler_options(
            kv_cache_config,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            enable_kv_cache_events=enable_kv_cache_events,
            log_stats=log_stats,
            hash_block_size=hash_block_size,
            registry=registry,
            profile=profile,
            eviction_policy=eviction_policy,
        )
        self._start(
            kv_cache_config, limits, options, metrics_collector, spec_converter, default_retention_seconds
        )

    def _start(
        self,
        kv_cache_config: Any,
        limits: SchedulerLimits,
        options: CoordinatorOptions,
        metrics_collector: Any,
        spec_converter: SpecConverter | None,
        default_retention_seconds: float | None,
    ) -> None:
        """Build the coordinator of vLLM's ``kv_cache_config`` (converted) from ``limits`` and ``options``,
        and the facades vLLM's code reads."""
        vllm_manager_module = importlib.import_module("vllm.v1.core.kv_cache_manager")
        self._vllm_blocks_cls: Any = vllm_manager_module.KVCacheBlocks
        # Warnings go where vLLM's own manager sends them (operators filter on vLLM's logger).
        self._vllm_logger: Any = vllm_manager_module.logger
        self._vllm_stats_cls: Any = importlib.import_module("vllm.v1.metrics.stats").PrefixCacheStats
        registry = options.registry
        # A platform's own registrations in vLLM's registry run on kvspec as they are (refused here, before
        # anything is served, when they cannot be).
        self.adoptions = adopt_vllm_registrations(default_registry if registry is None else registry)
        config = config_from_vllm(kv_cache_config, spec_converter=spec_converter, registry=registry)
        check_adopted_specs(config, limits)
        self.kv_cache_config = kv_cache_config
        self.max_model_len = limits.max_model_len
        self.enable_caching = options.enable_caching
        self.use_eagle = options.use_eagle
        self.log_stats = options.log_stats
        self.metrics_collector = metrics_collector
        self.kvspec_coordinator = KVCacheCoordinator(config, limits, options)
        # vLLM's collector (or kvspec's: same calls) is told of allocations, hits and evictions by kvspec's pool.
        self.kvspec_coordinator.block_pool.metrics_collector = metrics_collector
        self.coordinator = _coordinator_facade(self.kvspec_coordinator, self.enable_caching, kv_cache_config)
        self._hasher = BlockHasher(self.kvspec_coordinator.hash_block_size)
        self.block_pool = _BlockPoolFacade(self.kvspec_coordinator.block_pool)
        self.num_kv_cache_groups = len(config.kv_cache_groups)
        self.empty_kv_cache_blocks = self._vllm_blocks_cls(tuple(() for _ in range(self.num_kv_cache_groups)))
        self._views: dict[str, VllmRequestView] = {}
        #: The retention of requests that name none (seconds; None: none), for the ``retention`` policy.
        self.default_retention_seconds = default_retention_seconds
        self.eviction_policy = options.eviction_policy

    def _release_adapter_name(self) -> str:
        """The release adapter this object is (not ``install``'s binding subclass)."""
        for cls in type(self).__mro__:
            # Each release's adapter lives in its own module (vllm_adapter_023, vllm_adapter_034).
            if cls.__module__.startswith(_ADAPTER_MODULES) and not cls.__name__.startswith("Bound"):
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
        # With caching on, say what keeps this model's prefix hits from happening (a hybrid's 0% otherwise
        # shows in no log); caching off was said already.
        findings = (
            diagnose_prefix_caching(
                coordinator.kv_cache_config,
                coordinator.limits,
                retention_interval=coordinator.prefix_cache_retention_interval,
            )
            if self.enable_caching
            else ()
        )
        diagnosis = "".join(f"; prefix caching {f.line()}" for f in findings)
        return (
            f"kvspec {_kvspec_version()} manages the KV cache: {self._release_adapter_name()} under release "
            f"profile {coordinator.profile.name}, eviction policy {policy_name!r}, default retention "
            f"{'none' if retention is None else f'{retention:g} s'}, prefix caching "
            f"{'on' if self.enable_caching else 'off'}, {coordinator.kv_cache_config.num_blocks} blocks, "
            f"{sum(counts.values())} groups: {kinds}{adopted}{diagnosis}"
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


def scheduler_options(
    kv_cache_config: Any,
    *,
    enable_caching: bool,
    use_eagle: bool,
    enable_kv_cache_events: bool,
    log_stats: bool,
    hash_block_size: int,
    registry: AnyRegistry | None,
    profile: ReleaseProfile | None,
    eviction_policy: str | EvictionPolicyFactory | None,
    **release_settings: Any,
) -> CoordinatorOptions:
    """The coordinator's options from a Scheduler's arguments: what every release passes, and
    ``release_settings`` (``CoordinatorOptions`` fields only a later release's Scheduler sets)."""
    return CoordinatorOptions(
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
        # Beyond vLLM: its requests' priorities reach the policy (None: vLLM's own LRU order).
        eviction_policy=eviction_policy,
        # vLLM's Scheduler checks prompts against max_model_len itself and keys requests by id, whatever the
        # object (its tests rebuild them): the coordinator's own admission checks would second-guess it.
        check_admissions=False,
        **release_settings,
    )


def _kvspec_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvspec")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "(source)"
