"""What a router is and what it may see: the values and protocols of kvspec's fleet routing.

A router picks the instance each arriving request goes to. It sees the request (:class:`RouteRequest`: its
id, arrival time, token count and block hashes, the same hashes the engines key their prefix caches by) and,
through a :class:`FleetView`, only what its registration declares it reads (:data:`ROUTER_READS`):

- ``"loads"``: each instance's :class:`~kvspec.engine.instance.InstanceLoad` now (queue, running,
  tokens left to prefill, blocks held);
- ``"kv_events"``: the instances' KV events, delivered to the router's ``on_kv_events(instance, payload)``
  as vLLM publishes them (one msgpack payload per engine step, in vLLM 0.34's wire format by default),
  after the fleet's configured event lag;
- ``"cache"``: the hit each instance's coordinator would really give the request now
  (:meth:`FleetView.cache_hit`; kvspec's ``exact`` router).

Its own routing history is its own state and always allowed: a router that implements
:class:`TracksRequests` is told when each request it routed leaves its instance. Reading anything undeclared raises
:class:`~kvspec.errors.RouterAccessError`. A router is built per run by its factory from a
:class:`RouterContext` (instance count, block size, seed, options) and must be deterministic under the seed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeVar, runtime_checkable

from kvspec.blocks.request import Request
from kvspec.engine.instance import InstanceLoad
from kvspec.errors import RouterAccessError, RouterOptionError
from kvspec.named_registry import Option, read_options

#: What a router may declare it reads.
ROUTER_READS: Final = frozenset({"loads", "kv_events", "cache"})

D = TypeVar("D")


@dataclass(frozen=True, kw_only=True, slots=True)
class RouterContext:
    """What a router is built with: ``num_instances`` (instances are 0..n-1), ``block_size`` (tokens per
    block hash), ``seed`` (its only source of randomness) and ``options`` (its own settings, by name)."""

    num_instances: int
    block_size: int
    seed: int = 0
    options: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class RouteRequest:
    """An arriving request as a router sees it. ``block_hashes``: its full blocks' chained hashes, block 0
    first, ``block_size`` tokens each (read-only); tokens; milliseconds."""

    request_id: str
    arrival_ms: float
    num_tokens: int
    block_hashes: Sequence[bytes]
    #: The engine-side request, for the fleet's cache probe (routers do not read it).
    request: Request | None = None


class FleetView(Protocol):
    """The fleet as a router sees it (guarded: undeclared reads raise RouterAccessError)."""

    @property
    def num_instances(self) -> int: ...

    def loads(self) -> Sequence[InstanceLoad]: ...

    def cache_hit(self, instance: int, request: RouteRequest) -> int: ...


@runtime_checkable
class Router(Protocol):
    """Picks the instance (0..num_instances-1) for ``request``."""

    def route(self, request: RouteRequest, fleet: FleetView) -> int: ...


@runtime_checkable
class ReadsKVEvents(Protocol):
    """A router that declares ``"kv_events"`` implements this: one publisher payload of ``instance``."""

    def on_kv_events(self, instance: int, payload: bytes) -> None: ...


@runtime_checkable
class TracksRequests(Protocol):
    """A router that keeps its own record of what it routed implements this: the fleet calls it when a
    request it routed to ``instance`` leaves it (finished, or refused by the instance after routing), as a
    real router learns from the end of the response stream. Part of a router's own history: no read to
    declare."""

    def on_request_done(self, instance: int, request_id: str) -> None: ...


RouterFactory = Callable[[RouterContext], Router]


@dataclass(frozen=True, kw_only=True, slots=True)
class RouterSpec:
    """A registered router: its name, factory, what it reads, the options it declares and a one-line
    description."""

    name: str
    factory: RouterFactory
    reads: frozenset[str]
    options: tuple[Option, ...] = ()
    description: str = ""


#: What each guarded read is, in a RouterAccessError's words.
_READ_WORDS: Final = {"loads": "read the instances' loads", "cache": "probed instance caches"}


def require_read(router: str, reads: frozenset[str], read: str) -> None:
    """Raise ``RouterAccessError`` when ``router``, declaring ``reads``, reads ``read`` ("loads", "cache")
    (the one check every view a router gets makes: the fleet's and the kit's)."""
    if read not in reads:
        raise RouterAccessError(
            f"Router {router!r} {_READ_WORDS[read]} but did not declare reads=({read!r},)"
        )


def router_options(settings: type[D], router: str, context: RouterContext) -> D:
    """``router``'s options: ``settings`` (a dataclass whose fields are the options it declares, with their
    defaults) built from ``context.options``; an option it does not declare, or a value of the wrong kind,
    is a ``RouterOptionError`` in the wording every registry uses."""
    return read_options(settings, f"Router {router!r}", context.options, RouterOptionError)


__all__ = [
    "ROUTER_READS",
    "FleetView",
    "ReadsKVEvents",
    "RouteRequest",
    "Router",
    "RouterContext",
    "RouterFactory",
    "RouterSpec",
    "TracksRequests",
    "require_read",
    "router_options",
]
