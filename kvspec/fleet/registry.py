"""Routers by name: a thread-safe registry checked at the door, with snapshot and restore (tests).

Registration builds the router once on a two-instance context and refuses, with a ``RouterError``, a
name that is not dotted lower-case words, a ``reads`` outside :data:`~kvspec.fleet.routing.ROUTER_READS`,
a factory that fails or returns no :class:`~kvspec.fleet.routing.Router`, a router declaring
``"kv_events"`` without ``on_kv_events``, and options it does not know (each router lists its own in
``options``). The conformance kit (:func:`kvspec.fleet.kit.check_router`) goes further: it runs the router.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection, Mapping
from types import MappingProxyType

from kvspec.errors import RouterError, UnknownRouterError
from kvspec.fleet.routing import ROUTER_READS, ReadsKVEvents, Router, RouterContext, RouterFactory, RouterSpec

_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
_lock = threading.Lock()
_routers: dict[str, RouterSpec] = {}


def build_router(spec: RouterSpec, context: RouterContext) -> Router:
    """``spec``'s router for ``context``, checked: a ``RouterError`` naming it if the factory fails or
    returns something that cannot route (or cannot take the KV events it declares)."""
    try:
        router = spec.factory(context)
    except RouterError:
        raise
    except Exception as exc:
        raise RouterError(
            f"Router {spec.name!r}: the factory raised {type(exc).__name__}: {exc} when called with a "
            "RouterContext; it must take one and return a router."
        ) from exc
    if not isinstance(router, Router):
        raise RouterError(
            f"Router {spec.name!r}: the factory returned a {type(router).__name__}, which has no "
            "route(request, fleet) method; see kvspec.fleet.routing.Router."
        )
    if "kv_events" in spec.reads and not isinstance(router, ReadsKVEvents):
        raise RouterError(
            f"Router {spec.name!r} declares it reads 'kv_events' but its {type(router).__name__} has no "
            "on_kv_events(instance, payload) method."
        )
    return router


def register_router(
    name: str,
    factory: RouterFactory,
    *,
    reads: Collection[str] = (),
    description: str = "",
    replace: bool = False,
) -> RouterSpec:
    """Register ``factory`` under ``name`` (dotted lower-case words: "kv_cost", "acme.slo_aware"), reading
    ``reads`` (a subset of "loads", "kv_events", "cache"). A name already taken is refused unless
    ``replace``. Nothing changes when the registration is refused."""
    given: object = name
    if not isinstance(given, str) or not _NAME.match(given):
        raise RouterError(
            f"Router name {name!r} must be dotted lower-case words like 'kv_cost' or 'acme.slo'."
        )
    if isinstance(reads, str):
        raise RouterError(f"Router {name!r}: reads must be a collection of names, got the string {reads!r}.")
    unknown = sorted(set(reads) - ROUTER_READS)
    if unknown:
        raise RouterError(
            f"Router {name!r} declares it reads {', '.join(map(repr, unknown))}; a router may read only "
            f"{', '.join(sorted(ROUTER_READS))}."
        )
    if not callable(factory):
        raise RouterError(
            f"Router {name!r}: the factory must be callable (RouterContext -> Router), got "
            f"{type(factory).__name__}."
        )
    spec = RouterSpec(name=name, factory=factory, reads=frozenset(reads), description=description)
    build_router(spec, RouterContext(num_instances=2, block_size=16, seed=0))
    with _lock:
        taken = _routers.get(name)
        if taken is not None and not replace and taken.factory is not factory:
            raise RouterError(f"Router {name!r} is already registered; pass replace=True to replace it.")
        _routers[name] = spec
    return spec


def router_names() -> tuple[str, ...]:
    with _lock:
        return tuple(sorted(_routers))


def resolve_router(name: str) -> RouterSpec:
    """The registration of ``name``; ``UnknownRouterError`` listing the registered names otherwise."""
    with _lock:
        spec = _routers.get(name)
    if spec is None:
        raise UnknownRouterError(
            f"Unknown router {name!r}; registered: {', '.join(router_names())} (a plugin registers more "
            "with kvspec.fleet.register_router)."
        )
    return spec


def snapshot() -> Mapping[str, RouterSpec]:
    with _lock:
        return MappingProxyType(dict(_routers))


def restore(saved: Mapping[str, RouterSpec]) -> None:
    with _lock:
        _routers.clear()
        _routers.update(saved)


__all__ = ["build_router", "register_router", "resolve_router", "restore", "router_names", "snapshot"]
