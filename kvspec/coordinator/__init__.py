"""The scheduler-facing facade: one block pool, one manager per KV cache group, prefix-cache hits
that agree across groups, and the ``allocate_slots`` / ``free`` calls an engine makes every step.

:class:`KVCacheCoordinator` is :class:`kvspec.coordinator._core.CoordinatorCore` (compiled in the compiled
build) with a constructor whose arguments beartype checks (``KVSPEC_TYPECHECK``): a compiled constructor
would refuse a wrong argument with mypyc's bare ``TypeError`` instead of kvspec's ``KVSpecTypeError``.
It runs once per engine, so this plain-Python layer costs nothing per step. The per-step methods, their
atomicity and how they treat bad counts are documented in :mod:`kvspec.coordinator._core`.
"""

from __future__ import annotations

from typing_extensions import Unpack

from kvspec.contracts.spec import SchedulerLimits
from kvspec.coordinator._core import CoordinatorCore
from kvspec.coordinator._state import KVCacheBlocks
from kvspec.coordinator._steps import as_count
from kvspec.coordinator.hit_search import shared_prefix_junction
from kvspec.coordinator.layout import resolve_block_sizes
from kvspec.coordinator.options import PLANNED, CoordinatorOptions, CoordinatorSettings
from kvspec.errors import KVSpecTypeError
from kvspec.planning.config import KVCacheConfig

__all__ = [
    "PLANNED",
    "CoordinatorOptions",
    "CoordinatorSettings",
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

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        limits: SchedulerLimits,
        options: CoordinatorOptions | None = None,
        **settings: Unpack[CoordinatorSettings],
    ) -> None:
        """Build the coordinator of ``kv_cache_config`` (planned) for a run with ``limits``.

        ``options``: every setting, one validated :class:`CoordinatorOptions` (None: the defaults). Keyword
        ``settings`` (``enable_caching=False``, ``eviction_policy="lfu"``, ...: the option names) are applied
        on top of it, checked the same way; an unknown name is a ``KVSpecTypeError``. The release whose
        behaviour the coordinator reproduces is ``options.profile`` (the current vLLM release by default),
        and the prefix-cache retention is the one the planner wrote into the config unless the options set
        one (see ``CoordinatorOptions``)."""
        if type(kv_cache_config) is not KVCacheConfig and not isinstance(kv_cache_config, KVCacheConfig):
            raise KVSpecTypeError(
                f"KVCacheCoordinator takes a KVCacheConfig (kvspec.planning), got {type(kv_cache_config).__name__}."
            )
        if not isinstance(limits, SchedulerLimits):
            raise KVSpecTypeError(f"KVCacheCoordinator takes SchedulerLimits, got {type(limits).__name__}.")
        if options is not None and not isinstance(options, CoordinatorOptions):
            raise KVSpecTypeError(
                f"options must be a CoordinatorOptions, got {type(options).__name__}; pass settings by keyword."
            )
        super().__init__(kv_cache_config, limits, CoordinatorOptions.from_settings(options, settings))
