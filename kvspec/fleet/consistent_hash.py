"""``consistent_hash``: prompt-prefix affinity on a hash ring (vllm-router's and SGLang router's
``consistent_hash`` policy, keyed by the prompt's first blocks instead of a session header).

Each instance owns ``virtual_nodes`` points on a ring of 64-bit hashes; a request goes to the owner of the
first point at or after the hash of its first ``prefix_blocks`` block hashes (a prompt shorter than one
block hashes its request id). Requests sharing that prefix land on one instance whatever the load, so its
cache holds what they share; a fleet that grows by one instance moves only the keys the new one takes
(about 1/n of them). It reads nothing and needs no seed: the ring is the same on every run.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass

from kvspec.errors import RouterError
from kvspec.fleet.registry import router
from kvspec.fleet.routing import FleetView, RouterContext, RouteRequest, router_options


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsistentHashOptions:
    """``prefix_blocks``: the blocks of the prompt that key it (>= 1); ``virtual_nodes``: points per
    instance on the ring (>= 1; more spreads keys more evenly)."""

    prefix_blocks: int = 1
    virtual_nodes: int = 64


def _point(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@router(
    "consistent_hash",
    options=ConsistentHashOptions,
    description="prompt-prefix affinity on a hash ring (vllm-router / SGLang consistent_hash)",
)
class ConsistentHash:
    def __init__(self, context: RouterContext) -> None:
        options = router_options(ConsistentHashOptions, "consistent_hash", context)
        if options.prefix_blocks < 1 or options.virtual_nodes < 1:
            raise RouterError(
                "Router 'consistent_hash': prefix_blocks and virtual_nodes must be >= 1, got "
                f"{options.prefix_blocks} and {options.virtual_nodes}."
            )
        self._prefix = options.prefix_blocks
        ring = sorted(
            (_point(f"{instance}/{node}".encode()), instance)
            for instance in range(context.num_instances)
            for node in range(options.virtual_nodes)
        )
        self._points = [point for point, _ in ring]
        self._owners = [instance for _, instance in ring]

    def key(self, request: RouteRequest) -> int:
        """The ring position of ``request``: its first ``prefix_blocks`` block hashes, else its id."""
        blocks = request.block_hashes[: self._prefix]
        return _point(b"".join(blocks) if blocks else request.request_id.encode())

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        at = bisect.bisect_left(self._points, self.key(request))
        return self._owners[at % len(self._owners)]


__all__ = ["ConsistentHash", "ConsistentHashOptions"]
