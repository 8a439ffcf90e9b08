"""kvspec: typed, pluggable KV cache specs, registry, planning, block management and block tables.

Data flows one way: spec -> registry -> plan -> manager (coordinator) -> block table. This module is the
public API in one place. Names load on first use (PEP 562), so ``import kvspec`` and ``kvspec --help`` do
not pay for torch; the first name used registers the built-in specs (kvspec.builtins) before it is
returned. Code that imports submodules directly (``from kvspec.registry import default_registry``) should
``import kvspec.builtins`` (or any name from ``kvspec``) before it relies on the built-ins.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvspec.config import (
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
    )
    from kvspec.coordinator import (
        KVCacheBlocks,
        KVCacheCoordinator,
    )
    from kvspec.errors import (
        BlockPoolError,
        CapabilityError,
        CapacityError,
        ConflictingLayerSpecError,
        ConflictingRegistrationError,
        DeviceError,
        HybridUnificationError,
        InsufficientKVCacheMemoryError,
        InvariantError,
        InvariantViolationError,
        KVSpecError,
        KVSpecTypeError,
        ManagerProtocolError,
        ManagerSignatureError,
        MissingManagerError,
        ModelConfigError,
        NotEnoughFreeBlocksError,
        PageSizeUnificationError,
        PlanningError,
        PluginContractError,
        PluginError,
        RegistrationError,
        SchedulingError,
        SpecClassError,
        SpecMergeError,
        SpecProtocolError,
        SpecValidationError,
        TraitsError,
        UniformBaseError,
        UnregisteredSpecError,
        UnsupportedConfigurationError,
        WindowSizeMismatchError,
    )
    from kvspec.hashing import (
        BlockHash,
        BlockHasher,
        MultiModalFeature,
    )
    from kvspec.manager_api import (
        HitQuery,
        HitResult,
        KVCacheManager,
        ManagerContext,
    )
    from kvspec.managers import (
        ChunkedLocalAttentionManager,
        CrossAttentionManager,
        FullAttentionManager,
        MambaManager,
        SingleTypeKVCacheManager,
        SinkFullAttentionManager,
        SlidingWindowManager,
    )
    from kvspec.pool import (
        AllBlocksCleared,
        BlockId,
        BlockPool,
        BlockRemoved,
        BlockStored,
        KVCacheBlock,
    )
    from kvspec.protocols import (
        KVCacheSpec,
        SchedulerLimits,
        SpecCollection,
        as_spec_list,
    )
    from kvspec.registry import (
        AnyRegistry,
        Capabilities,
        Registration,
        Registry,
        apply_platform_hook,
        default_registry,
        load_plugins,
        register_kv_cache_spec,
    )
    from kvspec.request import (
        Request,
    )
    from kvspec.request_view import (
        RequestView,
    )
    from kvspec.specs import (
        AttentionSpec,
        ChunkedLocalAttentionSpec,
        CrossAttentionSpec,
        EncoderOnlyAttentionSpec,
        FullAttentionSpec,
        HiddenStateCacheSpec,
        KVCacheSpecKind,
        KVQuantMode,
        MambaSpec,
        MLAAttentionSpec,
        SinkFullAttentionSpec,
        SlidingWindowMLASpec,
        SlidingWindowSpec,
        TQFullAttentionSpec,
        UniformTypeKVCacheSpecs,
        get_kv_cache_spec_kind,
        get_kv_cache_spec_sliding_window,
        get_kv_quant_mode,
    )
    from kvspec.stats_events import (
        PrefixCacheStats,
    )
    from kvspec.traits import (
        PageView,
        SpecHooks,
        SpecTraits,
        traits_of,
    )

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "AllBlocksCleared": "kvspec.pool",
    "AnyRegistry": "kvspec.registry",
    "AttentionSpec": "kvspec.specs",
    "BlockHash": "kvspec.hashing",
    "BlockHasher": "kvspec.hashing",
    "BlockId": "kvspec.pool",
    "BlockPool": "kvspec.pool",
    "BlockPoolError": "kvspec.errors",
    "BlockRemoved": "kvspec.pool",
    "BlockStored": "kvspec.pool",
    "Capabilities": "kvspec.registry",
    "CapabilityError": "kvspec.errors",
    "CapacityError": "kvspec.errors",
    "ChunkedLocalAttentionManager": "kvspec.managers",
    "ChunkedLocalAttentionSpec": "kvspec.specs",
    "ConflictingLayerSpecError": "kvspec.errors",
    "ConflictingRegistrationError": "kvspec.errors",
    "CrossAttentionManager": "kvspec.managers",
    "CrossAttentionSpec": "kvspec.specs",
    "DeviceError": "kvspec.errors",
    "EncoderOnlyAttentionSpec": "kvspec.specs",
    "FullAttentionManager": "kvspec.managers",
    "FullAttentionSpec": "kvspec.specs",
    "HiddenStateCacheSpec": "kvspec.specs",
    "HitQuery": "kvspec.manager_api",
    "HitResult": "kvspec.manager_api",
    "HybridUnificationError": "kvspec.errors",
    "InsufficientKVCacheMemoryError": "kvspec.errors",
    "InvariantError": "kvspec.errors",
    "InvariantViolationError": "kvspec.errors",
    "KVCacheBlock": "kvspec.pool",
    "KVCacheBlocks": "kvspec.coordinator",
    "KVCacheConfig": "kvspec.config",
    "KVCacheCoordinator": "kvspec.coordinator",
    "KVCacheGroupSpec": "kvspec.config",
    "KVCacheManager": "kvspec.manager_api",
    "KVCacheSpec": "kvspec.protocols",
    "KVCacheSpecKind": "kvspec.specs",
    "KVCacheTensor": "kvspec.config",
    "KVQuantMode": "kvspec.specs",
    "KVSpecError": "kvspec.errors",
    "KVSpecTypeError": "kvspec.errors",
    "MLAAttentionSpec": "kvspec.specs",
    "MambaManager": "kvspec.managers",
    "MambaSpec": "kvspec.specs",
    "ManagerContext": "kvspec.manager_api",
    "ManagerProtocolError": "kvspec.errors",
    "ManagerSignatureError": "kvspec.errors",
    "MissingManagerError": "kvspec.errors",
    "ModelConfigError": "kvspec.errors",
    "MultiModalFeature": "kvspec.hashing",
    "NotEnoughFreeBlocksError": "kvspec.errors",
    "PageSizeUnificationError": "kvspec.errors",
    "PageView": "kvspec.traits",
    "PlanningError": "kvspec.errors",
    "PluginContractError": "kvspec.errors",
    "PluginError": "kvspec.errors",
    "PrefixCacheStats": "kvspec.stats_events",
    "Registration": "kvspec.registry",
    "RegistrationError": "kvspec.errors",
    "Registry": "kvspec.registry",
    "Request": "kvspec.request",
    "RequestView": "kvspec.request_view",
    "SchedulerLimits": "kvspec.protocols",
    "SchedulingError": "kvspec.errors",
    "SingleTypeKVCacheManager": "kvspec.managers",
    "SinkFullAttentionManager": "kvspec.managers",
    "SinkFullAttentionSpec": "kvspec.specs",
    "SlidingWindowMLASpec": "kvspec.specs",
    "SlidingWindowManager": "kvspec.managers",
    "SlidingWindowSpec": "kvspec.specs",
    "SpecClassError": "kvspec.errors",
    "SpecCollection": "kvspec.protocols",
    "SpecHooks": "kvspec.traits",
    "SpecMergeError": "kvspec.errors",
    "SpecProtocolError": "kvspec.errors",
    "SpecTraits": "kvspec.traits",
    "SpecValidationError": "kvspec.errors",
    "TQFullAttentionSpec": "kvspec.specs",
    "TraitsError": "kvspec.errors",
    "UniformBaseError": "kvspec.errors",
    "UniformTypeKVCacheSpecs": "kvspec.specs",
    "UnregisteredSpecError": "kvspec.errors",
    "UnsupportedConfigurationError": "kvspec.errors",
    "WindowSizeMismatchError": "kvspec.errors",
    "apply_platform_hook": "kvspec.registry",
    "as_spec_list": "kvspec.protocols",
    "default_registry": "kvspec.registry",
    "get_kv_cache_spec_kind": "kvspec.specs",
    "get_kv_cache_spec_sliding_window": "kvspec.specs",
    "get_kv_quant_mode": "kvspec.specs",
    "load_plugins": "kvspec.registry",
    "register_kv_cache_spec": "kvspec.registry",
    "traits_of": "kvspec.traits",
}


def __getattr__(name: str) -> Any:
    if name == "__build__":
        from kvspec.build_info import build_info

        return build_info().build
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvspec' has no attribute {name!r}")
    importlib.import_module("kvspec.builtins")  # the built-ins are registered before any name is used
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "AllBlocksCleared",
    "AnyRegistry",
    "AttentionSpec",
    "BlockHash",
    "BlockHasher",
    "BlockId",
    "BlockPool",
    "BlockPoolError",
    "BlockRemoved",
    "BlockStored",
    "Capabilities",
    "CapabilityError",
    "CapacityError",
    "ChunkedLocalAttentionManager",
    "ChunkedLocalAttentionSpec",
    "ConflictingLayerSpecError",
    "ConflictingRegistrationError",
    "CrossAttentionManager",
    "CrossAttentionSpec",
    "DeviceError",
    "EncoderOnlyAttentionSpec",
    "FullAttentionManager",
    "FullAttentionSpec",
    "HiddenStateCacheSpec",
    "HitQuery",
    "HitResult",
    "HybridUnificationError",
    "InsufficientKVCacheMemoryError",
    "InvariantError",
    "InvariantViolationError",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheCoordinator",
    "KVCacheGroupSpec",
    "KVCacheManager",
    "KVCacheSpec",
    "KVCacheSpecKind",
    "KVCacheTensor",
    "KVQuantMode",
    "KVSpecError",
    "KVSpecTypeError",
    "MLAAttentionSpec",
    "MambaManager",
    "MambaSpec",
    "ManagerContext",
    "ManagerProtocolError",
    "ManagerSignatureError",
    "MissingManagerError",
    "ModelConfigError",
    "MultiModalFeature",
    "NotEnoughFreeBlocksError",
    "PageSizeUnificationError",
    "PageView",
    "PlanningError",
    "PluginContractError",
    "PluginError",
    "PrefixCacheStats",
    "Registration",
    "RegistrationError",
    "Registry",
    "Request",
    "RequestView",
    "SchedulerLimits",
    "SchedulingError",
    "SingleTypeKVCacheManager",
    "SinkFullAttentionManager",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowManager",
    "SlidingWindowSpec",
    "SpecClassError",
    "SpecCollection",
    "SpecHooks",
    "SpecMergeError",
    "SpecProtocolError",
    "SpecTraits",
    "SpecValidationError",
    "TQFullAttentionSpec",
    "TraitsError",
    "UniformBaseError",
    "UniformTypeKVCacheSpecs",
    "UnregisteredSpecError",
    "UnsupportedConfigurationError",
    "WindowSizeMismatchError",
    "apply_platform_hook",
    "as_spec_list",
    "default_registry",
    "get_kv_cache_spec_kind",
    "get_kv_cache_spec_sliding_window",
    "get_kv_quant_mode",
    "load_plugins",
    "register_kv_cache_spec",
    "traits_of",
]
