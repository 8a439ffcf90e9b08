"""Plugins reach a registry two ways: ``kvspec.plugins`` entry points (``load_plugins``) and a hardware
platform's hook (``apply_platform_hook``). Both register atomically: a plugin that fails leaves none of its
registrations behind.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from kvspec.errors import KVSpecTypeError, PluginError
from kvspec.registry.core import AnyRegistry, default_registry

PLUGIN_GROUP = "kvspec.plugins"
PLUGINS_ENV = "KVSPEC_PLUGINS"


@runtime_checkable
class PlatformHook(Protocol):
    """A hardware platform's registration hook (vLLM's ``Platform.register_custom_kv_cache_specs``)."""

    def register_custom_kv_cache_specs(self, registry: AnyRegistry) -> None: ...


def apply_platform_hook(platform: PlatformHook, registry: AnyRegistry | None = None) -> None:
    """Let a platform register its specs, atomically: if the hook raises, none of its registrations stay.

    Call it once per process that builds managers or plans memory (engine core and workers alike): the
    registry is process-local. Hooks must be idempotent (identical re-registration is allowed).
    """
    hook = getattr(platform, "register_custom_kv_cache_specs", None)
    if not callable(hook):
        raise KVSpecTypeError(
            f"{type(platform).__name__} is not a platform hook: it needs a register_custom_kv_cache_specs(registry) "
            "method."
        )
    target = default_registry if registry is None else registry
    try:
        with target.transaction():
            hook(target)
    except Exception as exc:
        raise PluginError(
            f"Platform hook {type(platform).__name__}.register_custom_kv_cache_specs failed "
            f"({type(exc).__name__}): {exc}"
        ) from exc


def _allowed_plugins(allow: Sequence[str] | None) -> set[str] | None:
    if allow is not None:
        if isinstance(allow, str) or not all(isinstance(a, str) for a in allow):
            raise KVSpecTypeError(
                f"load_plugins(allow=...) takes a list of plugin names, got {allow!r}; "
                "write allow=['name'] (a bare string would be read letter by letter)."
            )
        return set(allow)
    env = os.environ.get(PLUGINS_ENV)
    if env is None:
        return None
    return {name.strip() for name in env.split(",") if name.strip()}


def _dist_name(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    return str(getattr(dist, "name", "") or "")


def _select_allowed(points: list[Any], allowed: set[str], group: str) -> list[Any]:
    """The entry points the allow-list names. ``name`` matches an entry point of that name if exactly one
    distribution declares it; ``distribution:name`` picks one distribution's. Anything else is an error:
    a typo (matches nothing) or an ambiguous name (a second distribution must not be imported silently)."""
    chosen: list[Any] = []
    for want in sorted(allowed):
        dist, sep, name = want.rpartition(":")
        matches = [ep for ep in points if ep.name == name and (not sep or _dist_name(ep) == dist)]
        if not matches:
            available = ", ".join(sorted({f"{_dist_name(ep)}:{ep.name}" for ep in points})) or "none"
            raise PluginError(
                f"kvspec plugin {want!r} named in the allow-list matches no installed entry point in group "
                f"{group!r} (installed: {available}). Check the spelling or install it."
            )
        if len(matches) > 1:
            dists = ", ".join(f"{_dist_name(ep) or '?'}:{ep.name}" for ep in matches)
            raise PluginError(
                f"kvspec plugin name {want!r} is declared by several distributions ({dists}); name the one to "
                "load as 'distribution:name' in KVSPEC_PLUGINS."
            )
        chosen.extend(matches)
    return sorted(chosen, key=lambda e: (e.name, _dist_name(e)))


def load_plugins(
    registry: AnyRegistry | None = None,
    *,
    allow: Sequence[str] | None = None,
    group: str = PLUGIN_GROUP,
) -> list[str]:
    """Load plugins from the ``kvspec.plugins`` entry-point group; return the names loaded.

    Each entry point names a callable taking the registry. Which run: ``allow`` if given, else the
    comma-separated ``KVSPEC_PLUGINS`` variable if set (empty: none), else all installed ones.
    A name in the allow-list that matches no entry point is a PluginError (a typo would load nothing), and
    so is a name two distributions declare (write ``distribution:name`` to choose one).
    Each plugin registers atomically; a failing plugin raises PluginError naming the plugins already
    registered (they stay) and leaves none of its own registrations behind.
    """
    target = default_registry if registry is None else registry
    allowed = _allowed_plugins(allow)
    points = sorted(importlib.metadata.entry_points(group=group), key=lambda e: (e.name, _dist_name(e)))
    if allowed is not None:
        points = _select_allowed(points, allowed, group)
    loaded: list[str] = []
    for ep in points:
        done = f" Plugins registered before it: {', '.join(loaded) or 'none'}."
        try:
            hook = ep.load()
        except SystemExit as exc:
            raise PluginError(
                f"kvspec plugin {ep.name!r} ({ep.value}) exited the process while importing ({exc.code!r}); a "
                f"plugin must raise an exception, not exit.{done}"
            ) from None
        except Exception as exc:
            raise PluginError(
                f"kvspec plugin {ep.name!r} ({ep.value}) failed to import ({type(exc).__name__}: {exc}).{done}"
            ) from exc
        if not callable(hook):
            raise PluginError(
                f"kvspec plugin {ep.name!r} ({ep.value}) is not callable; it must be a function "
                f"taking the registry.{done}"
            )
        try:
            with target.transaction():
                hook(target)
        except SystemExit as exc:
            raise PluginError(
                f"kvspec plugin {ep.name!r} exited the process while registering ({exc.code!r}); a plugin "
                f"must raise an exception, not exit.{done}"
            ) from None
        except Exception as exc:
            raise PluginError(
                f"kvspec plugin {ep.name!r} failed to register ({type(exc).__name__}: {exc}).{done}"
            ) from exc
        loaded.append(ep.name)
    return loaded
