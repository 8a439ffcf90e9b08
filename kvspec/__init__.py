"""kvspec: typed, pluggable KV cache specs, registry, planning, block management and block tables.

Data flows one way: spec -> registry -> plan -> manager (coordinator) -> block table; ``docs/ARCHITECTURE.md``
shows which folder holds which layer. This module is the public API in one place: ``_API`` below is the one
declaration (module -> names), ``__all__`` is derived from it, and the ``TYPE_CHECKING`` imports repeat it
for type checkers (``tests/unit/test_public_api.py`` keeps the two equal). Names load on first use
(PEP 562), so ``import kvspec`` and ``kvspec --help`` do not pay for torch; the first name used registers the
built-in specs (``kvspec.registry.builtins``) before it is returned. Code that imports submodules directly
(``from kvspec.registry import default_registry``) should ``import kvspec.builtins`` (or use any name from
``kvspec``) before it relies on the built-ins. Every exception class is in ``kvspec.errors``; the ones here
are the bases a caller catches.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvspec.blocks.events import (
        AllBlocksCleared as AllBlocksCleared,
    )
    from kvspec.blocks.events import (
        BlockRemoved as BlockRemoved,
    )
    from kvspec.blocks.events import (
        BlockStored as BlockStored,
    )
    from kvspec.blocks.events import (
        KVCacheEvent as KVCacheEvent,
    )
    from kvspec.blocks.eviction import BlockUse as BlockUse
    from kvspec.blocks.eviction import EvictionContext as EvictionContext
    from kvspec.blocks.eviction import EvictionPolicy as EvictionPolicy
    from kvspec.blocks.eviction import GroupInfo as GroupInfo
    from kvspec.blocks.hashing import BlockHash as BlockHash
    from kvspec.blocks.hashing import BlockHasher as BlockHasher
    from kvspec.blocks.hashing import MultiModalFeature as MultiModalFeature
    from kvspec.blocks.pool import (
        BlockId as BlockId,
    )
    from kvspec.blocks.pool import (
        BlockPool as BlockPool,
    )
    from kvspec.blocks.pool import (
        KVCacheBlock as KVCacheBlock,
    )
    from kvspec.blocks.request import (
        Request as Request,
    )
    from kvspec.blocks.request_view import (
        RequestView as RequestView,
    )
    from kvspec.contracts.manager import (
        BlockCopy as BlockCopy,
    )
    from kvspec.contracts.manager import (
        BoundaryState as BoundaryState,
    )
    from kvspec.contracts.manager import (
        HitQuery as HitQuery,
    )
    from kvspec.contracts.manager import (
        HitResult as HitResult,
    )
    from kvspec.contracts.manager import (
        KVCacheManager as KVCacheManager,
    )
    from kvspec.contracts.manager import (
        ManagerContext as ManagerContext,
    )
    from kvspec.contracts.spec import (
        KVCacheSpec as KVCacheSpec,
    )
    from kvspec.contracts.spec import (
        SchedulerLimits as SchedulerLimits,
    )
    from kvspec.contracts.spec import (
        SpecCollection as SpecCollection,
    )
    from kvspec.contracts.spec import (
        as_spec_list as as_spec_list,
    )
    from kvspec.contracts.traits import (
        PageView as PageView,
    )
    from kvspec.contracts.traits import (
        SpecHooks as SpecHooks,
    )
    from kvspec.contracts.traits import (
        SpecTraits as SpecTraits,
    )
    from kvspec.contracts.traits import (
        traits_of as traits_of,
    )
    from kvspec.coordinator import (
        KVCacheBlocks as KVCacheBlocks,
    )
    from kvspec.coordinator import (
        KVCacheCoordinator as KVCacheCoordinator,
    )
    from kvspec.coordinator.prefix_diagnosis import (
        PrefixCachingFinding as PrefixCachingFinding,
    )
    from kvspec.coordinator.prefix_diagnosis import (
        diagnose_prefix_caching as diagnose_prefix_caching,
    )
    from kvspec.coordinator.stats import (
        PrefixCacheStats as PrefixCacheStats,
    )
    from kvspec.errors import (
        CapacityError as CapacityError,
    )
    from kvspec.errors import (
        InvariantError as InvariantError,
    )
    from kvspec.errors import (
        KVSpecError as KVSpecError,
    )
    from kvspec.errors import (
        PlanningError as PlanningError,
    )
    from kvspec.errors import (
        PluginError as PluginError,
    )
    from kvspec.errors import (
        RegistrationError as RegistrationError,
    )
    from kvspec.errors import (
        SchedulingError as SchedulingError,
    )
    from kvspec.errors import (
        SpecValidationError as SpecValidationError,
    )
    from kvspec.errors import (
        UnsupportedConfigurationError as UnsupportedConfigurationError,
    )
    from kvspec.eviction import eviction_policy_names as eviction_policy_names
    from kvspec.eviction import register_eviction_policy as register_eviction_policy
    from kvspec.managers import (
        ChunkedLocalAttentionManager as ChunkedLocalAttentionManager,
    )
    from kvspec.managers import (
        CircularBufferManager as CircularBufferManager,
    )
    from kvspec.managers import (
        CrossAttentionManager as CrossAttentionManager,
    )
    from kvspec.managers import (
        FullAttentionManager as FullAttentionManager,
    )
    from kvspec.managers import (
        MambaManager as MambaManager,
    )
    from kvspec.managers import (
        RSWAManager as RSWAManager,
    )
    from kvspec.managers import (
        SingleTypeKVCacheManager as SingleTypeKVCacheManager,
    )
    from kvspec.managers import (
        SinkFullAttentionManager as SinkFullAttentionManager,
    )
    from kvspec.managers import (
        SlidingWindowManager as SlidingWindowManager,
    )
    from kvspec.planning.config import (
        KVCacheConfig as KVCacheConfig,
    )
    from kvspec.planning.config import (
        KVCacheGroupSpec as KVCacheGroupSpec,
    )
    from kvspec.planning.config import (
        KVCacheTensor as KVCacheTensor,
    )
    from kvspec.registry import (
        AnyRegistry as AnyRegistry,
    )
    from kvspec.registry import (
        Capabilities as Capabilities,
    )
    from kvspec.registry import (
        Registration as Registration,
    )
    from kvspec.registry import (
        Registry as Registry,
    )
    from kvspec.registry import (
        apply_platform_hook as apply_platform_hook,
    )
    from kvspec.registry import (
        default_registry as default_registry,
    )
    from kvspec.registry import (
        load_plugins as load_plugins,
    )
    from kvspec.registry import (
        register_kv_cache_spec as register_kv_cache_spec,
    )
    from kvspec.specs import (
        AttentionSpec as AttentionSpec,
    )
    from kvspec.specs import (
        ChunkedLocalAttentionSpec as ChunkedLocalAttentionSpec,
    )
    from kvspec.specs import (
        CircularBufferSpec as CircularBufferSpec,
    )
    from kvspec.specs import (
        CrossAttentionSpec as CrossAttentionSpec,
    )
    from kvspec.specs import (
        EncoderOnlyAttentionSpec as EncoderOnlyAttentionSpec,
    )
    from kvspec.specs import (
        FullAttentionSpec as FullAttentionSpec,
    )
    from kvspec.specs import (
        HiddenStateCacheSpec as HiddenStateCacheSpec,
    )
    from kvspec.specs import (
        KVCacheSpecKind as KVCacheSpecKind,
    )
    from kvspec.specs import (
        KVQuantMode as KVQuantMode,
    )
    from kvspec.specs import (
        MambaSpec as MambaSpec,
    )
    from kvspec.specs import (
        MLAAttentionSpec as MLAAttentionSpec,
    )
    from kvspec.specs import (
        RSWASpec as RSWASpec,
    )
    from kvspec.specs import (
        SinkFullAttentionSpec as SinkFullAttentionSpec,
    )
    from kvspec.specs import (
        SlidingWindowMLASpec as SlidingWindowMLASpec,
    )
    from kvspec.specs import (
        SlidingWindowSpec as SlidingWindowSpec,
    )
    from kvspec.specs import (
        TQFullAttentionSpec as TQFullAttentionSpec,
    )
    from kvspec.specs import (
        UniformTypeKVCacheSpecs as UniformTypeKVCacheSpecs,
    )
    from kvspec.specs import (
        get_kv_cache_spec_kind as get_kv_cache_spec_kind,
    )
    from kvspec.specs import (
        get_kv_cache_spec_sliding_window as get_kv_cache_spec_sliding_window,
    )
    from kvspec.specs import (
        get_kv_quant_mode as get_kv_quant_mode,
    )

__version__ = "0.1.0"

if TYPE_CHECKING:
    #: "pure", "compiled" or "mixed": which build of kvspec runs (kvspec.build_info).
    __build__: str

#: The public API: defining module -> the names it exports.
_API: dict[str, tuple[str, ...]] = {
    "kvspec.blocks.events": (
        "AllBlocksCleared",
        "BlockRemoved",
        "BlockStored",
        "KVCacheEvent",
    ),
    "kvspec.blocks.eviction": (
        "BlockUse",
        "EvictionContext",
        "EvictionPolicy",
        "GroupInfo",
    ),
    "kvspec.blocks.hashing": (
        "BlockHash",
        "BlockHasher",
        "MultiModalFeature",
    ),
    "kvspec.blocks.pool": (
        "BlockId",
        "BlockPool",
        "KVCacheBlock",
    ),
    "kvspec.blocks.request": ("Request",),
    "kvspec.blocks.request_view": ("RequestView",),
    "kvspec.contracts.manager": (
        "BlockCopy",
        "BoundaryState",
        "HitQuery",
        "HitResult",
        "KVCacheManager",
        "ManagerContext",
    ),
    "kvspec.contracts.spec": (
        "KVCacheSpec",
        "SchedulerLimits",
        "SpecCollection",
        "as_spec_list",
    ),
    "kvspec.contracts.traits": (
        "PageView",
        "SpecHooks",
        "SpecTraits",
        "traits_of",
    ),
    "kvspec.coordinator": (
        "KVCacheBlocks",
        "KVCacheCoordinator",
    ),
    "kvspec.coordinator.prefix_diagnosis": (
        "PrefixCachingFinding",
        "diagnose_prefix_caching",
    ),
    "kvspec.coordinator.stats": ("PrefixCacheStats",),
    "kvspec.errors": (
        "CapacityError",
        "InvariantError",
        "KVSpecError",
        "PlanningError",
        "PluginError",
        "RegistrationError",
        "SchedulingError",
        "SpecValidationError",
        "UnsupportedConfigurationError",
    ),
    "kvspec.eviction": (
        "eviction_policy_names",
        "register_eviction_policy",
    ),
    "kvspec.managers": (
        "ChunkedLocalAttentionManager",
        "CircularBufferManager",
        "CrossAttentionManager",
        "FullAttentionManager",
        "MambaManager",
        "RSWAManager",
        "SingleTypeKVCacheManager",
        "SinkFullAttentionManager",
        "SlidingWindowManager",
    ),
    "kvspec.planning.config": (
        "KVCacheConfig",
        "KVCacheGroupSpec",
        "KVCacheTensor",
    ),
    "kvspec.registry": (
        "AnyRegistry",
        "Capabilities",
        "Registration",
        "Registry",
        "apply_platform_hook",
        "default_registry",
        "load_plugins",
        "register_kv_cache_spec",
    ),
    "kvspec.specs": (
        "AttentionSpec",
        "ChunkedLocalAttentionSpec",
        "CircularBufferSpec",
        "CrossAttentionSpec",
        "EncoderOnlyAttentionSpec",
        "FullAttentionSpec",
        "HiddenStateCacheSpec",
        "KVCacheSpecKind",
        "KVQuantMode",
        "MLAAttentionSpec",
        "MambaSpec",
        "RSWASpec",
        "SinkFullAttentionSpec",
        "SlidingWindowMLASpec",
        "SlidingWindowSpec",
        "TQFullAttentionSpec",
        "UniformTypeKVCacheSpecs",
        "get_kv_cache_spec_kind",
        "get_kv_cache_spec_sliding_window",
        "get_kv_quant_mode",
    ),
}

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {name: module for module, names in _API.items() for name in names}

__all__ = sorted(_EXPORTS)


if not TYPE_CHECKING:  # type checkers see the imports above; an unknown name stays an error for them

    def __getattr__(name: str) -> Any:
        if name == "__build__":
            from kvspec.build_info import build_info

            return build_info().build
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'kvspec' has no attribute {name!r}")
        importlib.import_module(
            "kvspec.registry.builtins"
        )  # the built-ins are registered before any name is used
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
