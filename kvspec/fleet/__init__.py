"""Fleets of engine instances behind KV-aware routers (see docs/FLEET.md).

Routers are plugins: :func:`register_router` a factory with what it reads, check it with
:func:`kvspec.fleet.kit.check_router`. The built-ins (:mod:`kvspec.fleet.routers`) are registered here.
"""

from __future__ import annotations

from kvspec.fleet.registry import register_router, resolve_router, router_names
from kvspec.fleet.routers import ROUTER_OPTIONS, register_builtin_routers
from kvspec.fleet.routing import (
    ROUTER_READS,
    FleetView,
    ReadsKVEvents,
    Router,
    RouterContext,
    RouteRequest,
    RouterFactory,
    RouterSpec,
)

register_builtin_routers()

from kvspec.fleet.fleet import FleetReport, FleetSettings, run_fleet  # noqa: E402

__all__ = [
    "ROUTER_OPTIONS",
    "ROUTER_READS",
    "FleetReport",
    "FleetSettings",
    "FleetView",
    "ReadsKVEvents",
    "RouteRequest",
    "Router",
    "RouterContext",
    "RouterFactory",
    "RouterSpec",
    "register_router",
    "resolve_router",
    "router_names",
    "run_fleet",
]
