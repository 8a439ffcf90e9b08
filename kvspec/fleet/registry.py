"""Routers by name: :data:`ROUTERS`, a :class:`~kvspec.named_registry.NamedRegistry` checked at the door.

Registration builds the router once on a two-instance context and refuses, with a ``RouterError``, a
name that is not dotted lower-case words, a ``reads`` outside :data:`~kvspec.fleet.routing.ROUTER_READS`,
a factory that fails or returns no :class:`~kvspec.fleet.routing.Router`, and a router declaring
``"kv_events"`` without ``on_kv_events``. Each router declares its options (:class:`~kvspec.named_registry.Option`:
name, kind, default), usually as the dataclass it reads them into (``router_options``); :func:`build_router`
refuses an unknown option or a value of the wrong kind with a ``RouterOptionError`` in the wording every
registry uses, before the factory runs. The conformance kit (:func:`kvspec.fleet.kit.check_router`) goes further: it runs the router.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from kvspec.errors import RouterError, RouterOptionError, UnknownRouterError
from kvspec.fleet.routing import ROUTER_READS, ReadsKVEvents, Router, RouterContext, RouterFactory, RouterSpec
from kvspec.named_registry import NamedRegistry, Option, declared_options, option_settings

#: The context a router is tried on when it registers.
PROBE = RouterContext(num_instances=2, block_size=16, seed=0)


def build_router(spec: RouterSpec, context: RouterContext) -> Router:
    """``spec``'s router for ``context``, with every declared option in ``context.options`` (the given
    value, checked, else the default); a ``RouterOptionError`` for an option it does not declare or of the
    wrong kind, a ``RouterError`` naming it if the factory fails or returns something that cannot route (or
    cannot take the KV events it declares)."""
    owner = f"Router {spec.name!r}"
    option_settings(owner, spec.options, context.options, RouterOptionError)
    try:
        router = spec.factory(context)
    except RouterError:
        raise
    except Exception as exc:
        raise RouterError(
            f"{owner}: the factory raised {type(exc).__name__}: {exc} when called with a RouterContext; it "
            "must take one and return a router."
        ) from exc
    if not isinstance(router, Router):
        raise RouterError(
            f"{owner}: the factory returned a {type(router).__name__}, which has no route(request, fleet) "
            "method; see kvspec.fleet.routing.Router."
        )
    if "kv_events" in spec.reads and not isinstance(router, ReadsKVEvents):
        raise RouterError(
            f"{owner} declares it reads 'kv_events' but its {type(router).__name__} has no "
            "on_kv_events(instance, payload) method."
        )
    return router


def _check(name: str, spec: RouterSpec) -> RouterSpec:
    unknown = sorted(set(spec.reads) - ROUTER_READS)
    if unknown:
        raise RouterError(
            f"Router {name!r} declares it reads {', '.join(map(repr, unknown))}; a router may read only "
            f"{', '.join(sorted(ROUTER_READS))}."
        )
    if not callable(spec.factory):
        raise RouterError(
            f"Router {name!r}: the factory must be callable (RouterContext -> Router), got "
            f"{type(spec.factory).__name__}."
        )
    build_router(spec, PROBE)
    return spec


#: Every router by name; built-ins register in kvspec.fleet.routers, one decorator each.
ROUTERS: NamedRegistry[RouterSpec] = NamedRegistry(
    what="Router",
    error=RouterError,
    unknown_error=UnknownRouterError,
    option_error=RouterOptionError,
    register_with="kvspec.fleet.register_router",
    example="kv_cost",
    check=_check,
)


def register_router(
    name: str,
    factory: RouterFactory,
    *,
    reads: Collection[str] = (),
    options: Iterable[Option] | type[Any] = (),
    description: str = "",
    replace: bool = False,
) -> RouterSpec:
    """Register ``factory`` under ``name`` (dotted lower-case words: "kv_cost", "acme.slo_aware"), reading
    ``reads`` (a subset of "loads", "kv_events", "cache") and taking ``options``: ``Option`` values, or the
    dataclass of options the router reads them into (:func:`~kvspec.fleet.routing.router_options`). A name
    already taken is refused unless ``replace``. Nothing changes when refused."""
    if isinstance(reads, str):
        raise RouterError(f"Router {name!r}: reads must be a collection of names, got the string {reads!r}.")
    declared = declared_options(options) if isinstance(options, type) else tuple(options)
    spec = RouterSpec(
        name=name,
        factory=factory,
        reads=frozenset(reads),
        options=declared,
        description=description,
    )
    return ROUTERS.register(name, spec, options=declared, description=description, replace=replace).item


def router(
    name: str | None = None,
    *,
    reads: Collection[str] = (),
    options: Iterable[Option] | type[Any] | None = None,
    description: str = "",
) -> Callable[[RouterFactory], RouterFactory]:
    """A decorator registering the decorated router class (or factory) under ``name``: a built-in's one
    line. A class that declares ``name`` and ``settings`` (its options dataclass) as class attributes need
    not repeat them here."""

    def register(factory: RouterFactory) -> RouterFactory:
        register_router(
            name if name is not None else getattr(factory, "name"),  # noqa: B009
            factory,
            reads=reads,
            options=options if options is not None else getattr(factory, "settings", ()),
            description=description,
        )
        return factory

    return register


# The module-level doors are the registry's own methods (one behaviour, one docstring).
router_names = ROUTERS.names
#: The registration of a name; ``UnknownRouterError`` listing the registered names otherwise.
resolve_router = ROUTERS.item
snapshot = ROUTERS.snapshot
restore = ROUTERS.restore


__all__ = [
    "ROUTERS",
    "build_router",
    "register_router",
    "resolve_router",
    "restore",
    "router",
    "router_names",
    "snapshot",
]
