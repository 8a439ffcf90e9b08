"""kvspec: typed, pluggable KV cache specs, registry, planning, block management and block tables.

Data flows one way: spec -> registry -> plan -> manager (coordinator) -> block table.
"""

from kvspec.config import (
    KVCacheConfig as KVCacheConfig,
)
from kvspec.config import (
    KVCacheGroupSpec as KVCacheGroupSpec,
)
from kvspec.config import (
    KVCacheTensor as KVCacheTensor,
)
from kvspec.coordinator import (
    KVCacheBlocks as KVCacheBlocks,
)
from kvspec.coordinator import (
    KVCacheCoordinator as KVCacheCoordinator,
)
from kvspec.coordinator import (
    PrefixCacheStats as PrefixCacheStats,
)
from kvspec.errors import (
    BlockPoolError as BlockPoolError,
)
from kvspec.errors import (
    CapabilityError as CapabilityError,
)
from kvspec.errors import (
    ConflictingLayerSpecError as ConflictingLayerSpecError,
)
from kvspec.errors import (
    ConflictingRegistrationError as ConflictingRegistrationError,
)
from kvspec.errors import (
    DeviceError as DeviceError,
)
from kvspec.errors import (
    HybridUnificationError as HybridUnificationError,
)
from kvspec.errors import (
    InsufficientKVCacheMemoryError as InsufficientKVCacheMemoryError,
)
from kvspec.errors import (
    KVSpecError as KVSpecError,
)
from kvspec.errors import (
    KVSpecTypeError as KVSpecTypeError,
)
from kvspec.errors import (
    ManagerProtocolError as ManagerProtocolError,
)
from kvspec.errors import (
    MissingManagerError as MissingManagerError,
)
from kvspec.errors import (
    ModelConfigError as ModelConfigError,
)
from kvspec.errors import (
    NotEnoughFreeBlocksError as NotEnoughFreeBlocksError,
)
from kvspec.errors import (
    PageSizeUnificationError as PageSizeUnificationError,
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
    SpecMergeError as SpecMergeError,
)
from kvspec.errors import (
    SpecProtocolError as SpecProtocolError,
)
from kvspec.errors import (
    SpecValidationError as SpecValidationError,
)
from kvspec.errors import (
    UniformBaseError as UniformBaseError,
)
from kvspec.errors import (
    UnregisteredSpecError as UnregisteredSpecError,
)
from kvspec.errors import (
    UnsupportedConfigurationError as UnsupportedConfigurationError,
)
from kvspec.errors import (
    WindowSizeMismatchError as WindowSizeMismatchError,
)
from kvspec.hashing import (
    BlockHash as BlockHash,
)
from kvspec.hashing import (
    BlockHasher as BlockHasher,
)
from kvspec.hashing import (
    MultiModalFeature as MultiModalFeature,
)
from kvspec.managers import (
    ChunkedLocalAttentionManager as ChunkedLocalAttentionManager,
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
    SingleTypeKVCacheManager as SingleTypeKVCacheManager,
)
from kvspec.managers import (
    SinkFullAttentionManager as SinkFullAttentionManager,
)
from kvspec.managers import (
    SlidingWindowManager as SlidingWindowManager,
)
from kvspec.pool import (
    AllBlocksCleared as AllBlocksCleared,
)
from kvspec.pool import (
    BlockPool as BlockPool,
)
from kvspec.pool import (
    BlockRemoved as BlockRemoved,
)
from kvspec.pool import (
    BlockStored as BlockStored,
)
from kvspec.pool import (
    KVCacheBlock as KVCacheBlock,
)
from kvspec.protocols import (
    KVCacheManager as KVCacheManager,
)
from kvspec.protocols import (
    KVCacheSpec as KVCacheSpec,
)
from kvspec.protocols import (
    SchedulerLimits as SchedulerLimits,
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
from kvspec.request import Request as Request
from kvspec.specs import (
    AttentionSpec as AttentionSpec,
)
from kvspec.specs import (
    ChunkedLocalAttentionSpec as ChunkedLocalAttentionSpec,
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
    KVQuantMode as KVQuantMode,
)
from kvspec.specs import (
    MambaSpec as MambaSpec,
)
from kvspec.specs import (
    MLAAttentionSpec as MLAAttentionSpec,
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
    get_kv_quant_mode as get_kv_quant_mode,
)

__version__ = "0.1.0"

__all__ = [
    "AllBlocksCleared",
    "AttentionSpec",
    "BlockHash",
    "BlockHasher",
    "BlockPool",
    "BlockPoolError",
    "BlockRemoved",
    "BlockStored",
    "Capabilities",
    "CapabilityError",
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
    "HybridUnificationError",
    "InsufficientKVCacheMemoryError",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheCoordinator",
    "KVCacheGroupSpec",
    "KVCacheManager",
    "KVCacheSpec",
    "KVCacheTensor",
    "KVQuantMode",
    "KVSpecError",
    "KVSpecTypeError",
    "MLAAttentionSpec",
    "MambaManager",
    "MambaSpec",
    "ManagerProtocolError",
    "MissingManagerError",
    "ModelConfigError",
    "MultiModalFeature",
    "NotEnoughFreeBlocksError",
    "PageSizeUnificationError",
    "PlanningError",
    "PluginError",
    "PrefixCacheStats",
    "Registration",
    "RegistrationError",
    "Registry",
    "Request",
    "SchedulerLimits",
    "SchedulingError",
    "SingleTypeKVCacheManager",
    "SinkFullAttentionManager",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowManager",
    "SlidingWindowSpec",
    "SpecMergeError",
    "SpecProtocolError",
    "SpecValidationError",
    "TQFullAttentionSpec",
    "UniformBaseError",
    "UniformTypeKVCacheSpecs",
    "UnregisteredSpecError",
    "UnsupportedConfigurationError",
    "WindowSizeMismatchError",
    "apply_platform_hook",
    "default_registry",
    "get_kv_quant_mode",
    "load_plugins",
    "register_kv_cache_spec",
]
