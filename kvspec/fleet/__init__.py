"""Fleets of engine instances behind KV-aware routers (see docs/FLEET.md).

Routers are plugins: :func:`register_router` a factory with what it reads, check it with
:func:`kvspec.fleet.kit.check_router`. The built-ins (:mod:`kvspec.fleet.routers`) register where they are defined, one ``@router`` each.
"""

from __future__ import annotations

from kvspec.fleet import consistent_hash as _consistent_hash  # noqa: F401  (registers its router)
from kvspec.fleet import routers as _routers  # noqa: F401  (registers the built-in routers)
from kvspec.fleet import routing as _routing
from kvspec.fleet.fleet import FleetReport, FleetSettings, run_fleet
from kvspec.fleet.registry import ROUTERS, register_router, resolve_router, router, router_names
from kvspec.fleet.routing import *  # noqa: F403  (the router contract, listed once in its __all__)

__all__ = [
    "ROUTERS",
    "FleetReport",
    "FleetSettings",
    "register_router",
    "resolve_router",
    "router",
    "router_names",
    "run_fleet",
]
__all__ += _routing.__all__
