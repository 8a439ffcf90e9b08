"""The registry layer: ``Registry[SpecT, MgrT]`` (which manager runs each spec type), what registration
checks at the door, plugin loading, and the built-in registrations.

``from kvspec.registry import default_registry`` gives the process-wide registry; it holds the built-ins
once ``kvspec.registry.builtins`` (or any name of ``kvspec``) has been imported.
"""

from kvspec.registry.core import (
    AnyRegistry,
    Capabilities,
    Registration,
    Registry,
    RegistrySnapshot,
    default_registry,
    register_kv_cache_spec,
)
from kvspec.registry.plugins import PLUGIN_GROUP, PLUGINS_ENV, PlatformHook, apply_platform_hook, load_plugins

__all__ = [
    "PLUGINS_ENV",
    "PLUGIN_GROUP",
    "AnyRegistry",
    "Capabilities",
    "PlatformHook",
    "Registration",
    "Registry",
    "RegistrySnapshot",
    "apply_platform_hook",
    "default_registry",
    "load_plugins",
    "register_kv_cache_spec",
]
