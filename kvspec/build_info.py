"""Which build of kvspec is running: pure Python, or with its hot modules compiled by mypyc.

``COMPILED_MODULES`` is the one list of modules the compiled build compiles (``setup.py`` reads it from
this file without importing kvspec). A module counts as compiled when Python would load it from an
extension module (``.so``/``.pyd``) rather than its ``.py`` source; nothing is imported to find out.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal

#: Source paths, relative to the project root, of the modules ``KVSPEC_COMPILE=1`` compiles.
COMPILED_MODULES: tuple[str, ...] = (
    "kvspec/blocks/block.py",
    "kvspec/blocks/free_queue.py",
    "kvspec/blocks/cache_map.py",
    "kvspec/blocks/pool.py",
    "kvspec/blocks/events.py",
    "kvspec/blocks/hashing.py",
    "kvspec/coordinator/hit_search.py",
    "kvspec/blocks/request.py",
    "kvspec/coordinator/_state.py",
    "kvspec/coordinator/_steps.py",
    "kvspec/coordinator/_core.py",
    "kvspec/planning/_core.py",
    "kvspec/planning/sizing.py",
    "kvspec/planning/packing.py",
    "kvspec/managers/base.py",
    "kvspec/managers/full.py",
    "kvspec/managers/sliding_window.py",
    "kvspec/eviction/_blocklist.py",
    "kvspec/eviction/_heap.py",
    "kvspec/eviction/lfu.py",
    "kvspec/eviction/slru.py",
    "kvspec/eviction/hybrid.py",
    "kvspec/engine/scheduler.py",
    "kvspec/engine/instance.py",
    "kvspec/fleet/index.py",
    "kvspec/tiers/policies.py",
    "kvspec/tiers/host.py",
    "kvspec/tiers/pool.py",
    "kvspec/tiers/connector.py",
)

Build = Literal["pure", "compiled", "mixed"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BuildInfo:
    """``build``: "compiled" when every module of COMPILED_MODULES loads compiled, "pure" when none does."""

    build: Build
    compiled: tuple[str, ...]
    pure: tuple[str, ...]


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def build_info() -> BuildInfo:
    compiled: list[str] = []
    pure: list[str] = []
    for path in COMPILED_MODULES:
        name = _module_name(path)
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None and spec.origin else ""
        (pure if origin.endswith(".py") else compiled).append(name)
    build: Build = "compiled" if not pure else "pure" if not compiled else "mixed"
    return BuildInfo(build=build, compiled=tuple(compiled), pure=tuple(pure))
