"""Names test_kv_cache_spec_registry.py imports from vLLM, bound to kvspec's (used by shim_conftest.py).

They are bound *before* that file is imported (its module-level tables are keyed by the spec classes), and
only for that import: vLLM's own modules get their names back at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kvspec import managers, specs
from kvspec.integrations.vllm import KVCacheSpecRegistry, register_kv_cache_spec
from kvspec.registry.builtins import default_registry
from kvspec.registry.core import RegistrySnapshot

SPEC_NAMES = (
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "HiddenStateCacheSpec",
    "MambaSpec",
    "MLAAttentionSpec",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "TQFullAttentionSpec",
)
MANAGER_NAMES = (
    "ChunkedLocalAttentionManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "MambaManager",
    "SingleTypeKVCacheManager",
    "SinkFullAttentionManager",
    "SlidingWindowManager",
)


class RegistryEntries:
    """vLLM's ``_REGISTRY_KVCACHESPEC_LIST`` (a dict the tests copy, clear and update) over kvspec's
    registry: ``copy()`` is a snapshot, ``update(snapshot)`` restores it."""

    def copy(self) -> RegistrySnapshot[Any, Any]:
        return default_registry.snapshot()

    def clear(self) -> None:
        """The following ``update`` replaces every entry (kvspec restores all or nothing)."""

    def update(self, snapshot: RegistrySnapshot[Any, Any]) -> None:
        default_registry.restore(snapshot)

    def __iter__(self) -> Iterator[type]:
        return iter([r.spec_cls for r in default_registry.registrations()])

    def __contains__(self, spec_cls: object) -> bool:
        return spec_cls in default_registry

    def __len__(self) -> int:
        return len(default_registry)


class UniformTypeKVCacheSpecs(specs.UniformTypeKVCacheSpecs):
    """kvspec's uniform-type spec with vLLM's ``is_uniform_type({layer: spec})`` classmethod."""

    @classmethod
    def is_uniform_type(cls, kv_cache_specs: Mapping[str, Any]) -> bool:
        return KVCacheSpecRegistry.is_uniform_type(kv_cache_specs)


def _no_op_register_all(vllm_config: Any) -> None:
    """kvspec's built-ins are registered when kvspec is imported."""


def routes() -> dict[str, dict[str, object]]:
    """module -> {name: kvspec's object} to bind while the test file is imported (the spec names the
    installed vLLM has: 0.34.0 dropped TQFullAttentionSpec)."""
    import importlib

    interface = importlib.import_module("vllm.v1.kv_cache_interface")
    return {
        "vllm.v1.kv_cache_interface": {
            **{name: getattr(specs, name) for name in SPEC_NAMES if hasattr(interface, name)},
            "UniformTypeKVCacheSpecs": UniformTypeKVCacheSpecs,
            **(
                {"get_kv_cache_spec_kind": specs.get_kv_cache_spec_kind}
                if hasattr(interface, "get_kv_cache_spec_kind")
                else {}
            ),
        },
        "vllm.v1.core.single_type_kv_cache_manager": {
            **{name: getattr(managers, name) for name in MANAGER_NAMES},
            "register_all_kvcache_specs": _no_op_register_all,
        },
        "vllm.v1.kv_cache_spec_registry": {
            "KVCacheSpecRegistry": KVCacheSpecRegistry,
            "register_kv_cache_spec": register_kv_cache_spec,
            "_REGISTRY_KVCACHESPEC_LIST": RegistryEntries(),
        },
    }
