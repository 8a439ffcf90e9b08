"""Install kvspec in vLLM: ``install()`` makes vLLM's scheduler build kvspec's adapter for the installed
release instead of its own ``KVCacheManager`` (``uninstall()`` undoes it).

Each release's adapter lives in its own module and is named for its release: ``Vllm023KVCacheManager``
(``vllm_adapter_023``), ``Vllm034KVCacheManager`` and ``Vllm032KVCacheManager`` (``vllm_adapter_034``);
``adapter_class()`` picks the one the installed vLLM speaks. The request view (``vllm_request_view``), the
coordinator and pool facades (``vllm_facades``) and the event conversion (``vllm_events``) are re-exported
here, where earlier code imports them from. Importing this module does not import vLLM.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Final, cast

from kvspec.blocks.eviction import EvictionPolicyFactory
from kvspec.contracts.release import profile_for_vllm_version
from kvspec.eviction.registry import resolve_eviction_policy
from kvspec.integrations.vllm import SpecConverter
from kvspec.integrations.vllm_adapter_023 import Vllm023KVCacheManager
from kvspec.integrations.vllm_adapter_034 import Vllm032KVCacheManager, Vllm034KVCacheManager
from kvspec.integrations.vllm_events import event_to_vllm
from kvspec.integrations.vllm_facades import (
    Vllm023BlockPool,
    Vllm034BlockPool,
    VllmBlockPool,
    zeroed_by_vllm_034,
)
from kvspec.integrations.vllm_request_view import VllmRequestView, as_kvspec_request
from kvspec.integrations.vllm_retention import parse_retention_seconds
from kvspec.registry.core import AnyRegistry

__all__ = [
    "Vllm032KVCacheManager",
    "Vllm034BlockPool",
    "Vllm034KVCacheManager",
    "ADAPTERS",
    "Vllm023BlockPool",
    "VllmBlockPool",
    "Vllm023KVCacheManager",
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


#: The adapter for each manager interface a release's scheduler calls (``ReleaseProfile.managers.signatures``):
#: a new release whose scheduler calls an interface listed here needs no new adapter.
ADAPTERS: Final[dict[str, type[Vllm023KVCacheManager]]] = {
    "0.23": Vllm023KVCacheManager,
    "0.32": Vllm032KVCacheManager,
    "0.34": Vllm034KVCacheManager,
}


def adapter_class() -> type[Vllm023KVCacheManager]:
    """The adapter speaking the installed vLLM's interface: ``Vllm034KVCacheManager`` for 0.34 and later,
    ``Vllm032KVCacheManager`` for 0.32 and 0.33, ``Vllm023KVCacheManager`` before."""
    profile = profile_for_vllm_version(str(importlib.import_module("vllm").__version__))
    return ADAPTERS[profile.managers.signatures]


def install(
    *,
    spec_converter: SpecConverter | None = None,
    registry: AnyRegistry | None = None,
    eviction_policy: str | EvictionPolicyFactory | None = None,
    default_retention_seconds: float | None = None,
    announce: Callable[[Vllm023KVCacheManager], None] | None = None,
) -> None:
    """Make vLLM's scheduler (and ``vllm.v1.core.kv_cache_manager.KVCacheManager``) kvspec's adapter.

    ``spec_converter`` (a plugin's conversion of its vLLM-side specs), ``registry``, ``eviction_policy``
    (``kvspec.eviction``: a name or a factory; None: vLLM's LRU order) and ``default_retention_seconds`` (the
    retention of requests that name none) are passed to every adapter the scheduler builds; ``announce`` is
    called with each adapter once built (the vLLM plugin logs what manages the cache). Without any of them
    the class installed is the adapter class itself."""
    manager_cls: type[Vllm023KVCacheManager] = adapter_class()
    bound = (spec_converter, registry, eviction_policy, default_retention_seconds, announce)
    if any(value is not None for value in bound):
        resolve_eviction_policy(eviction_policy)  # an unknown name fails here, not inside vLLM's engine
        if default_retention_seconds is not None:
            parse_retention_seconds(default_retention_seconds)

        base = manager_cls

        def __init__(self: Vllm023KVCacheManager, *args: Any, **kwargs: Any) -> None:
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
        manager_cls = cast("type[Vllm023KVCacheManager]", type("BoundVllmKVCacheManager", (base,), namespace))
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


#: vLLM 0.23.0's adapter under its earlier name (before each release's adapter was named for its release).
VllmKVCacheManager = Vllm023KVCacheManager
