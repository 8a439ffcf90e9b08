"""A router plugin: conversations stick to the instance that served their first block, unless it is busy.

Register it, check it with the kit, and route a fleet with it (``kvspec fleet MODEL --router
example.sticky``, after importing this module through ``--plugin``-style entry points or a script).
"""

from __future__ import annotations

from kvspec.fleet import FleetView, RouterContext, RouteRequest, register_router


class StickyRouter:
    """The first block's hash picks a home instance (hash modulo the instance count); a home with more than
    ``spill`` requests in flight beyond the least loaded instance's gives the request to that one instead."""

    def __init__(self, context: RouterContext) -> None:
        self.spill = int(context.options.get("spill", 8))

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        loads = fleet.loads()
        least = min(range(fleet.num_instances), key=lambda i: (loads[i].requests, i))
        if not request.block_hashes:
            return least
        home = int.from_bytes(request.block_hashes[0][:8], "big") % fleet.num_instances
        return home if loads[home].requests - loads[least].requests <= self.spill else least


def register() -> None:
    register_router("example.sticky", StickyRouter, reads=("loads",), description="sticky by first block")
