"""The router conformance kit: run a router plugin on a synthetic fleet before it routes real traffic.

:func:`check_router` builds the router twice from the same seed and routes the same synthetic requests
(shared prefixes, varied lengths) on a synthetic fleet whose loads change between requests, feeding KV
events (vLLM 0.34 wire payloads) to a router that declares it reads them. It raises

- :class:`~kvspec.errors.RoutingError` for a choice that is not an instance (not an int in 0..n-1), and
  for a router that chooses differently under the same seed (not deterministic);
- :class:`~kvspec.errors.RouterAccessError` for a read the registration did not declare;
- :class:`~kvspec.errors.RouterError` for a factory that fails or builds no router;

and returns what it checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.blocks.event_wire import encode_event_batch
from kvspec.blocks.events import BlockRemoved, BlockStored, KVCacheEvent
from kvspec.engine.instance import InstanceLoad
from kvspec.errors import RoutingError
from kvspec.fleet.registry import build_router, resolve_router
from kvspec.fleet.routing import ReadsKVEvents, RouterContext, RouteRequest, RouterSpec, require_read


@dataclass(frozen=True, kw_only=True, slots=True)
class RouterCheck:
    """What :func:`check_router` ran: the router, its reads, the requests routed and each choice."""

    name: str
    reads: frozenset[str]
    requests: int
    choices: tuple[int, ...]
    checks: tuple[str, ...]


class _KitView:
    __slots__ = ("_loads", "_name", "_reads", "_residency", "num_instances_")

    def __init__(self, spec: RouterSpec, num_instances: int) -> None:
        self._name = spec.name
        self._reads = spec.reads
        self.num_instances_ = num_instances
        self._loads: list[InstanceLoad] = []
        self._residency: list[set[bytes]] = [set() for _ in range(num_instances)]

    @property
    def num_instances(self) -> int:
        return self.num_instances_

    def loads(self) -> Sequence[InstanceLoad]:
        require_read(self._name, self._reads, "loads")
        return self._loads

    def cache_hit(self, instance: int, request: RouteRequest) -> int:
        require_read(self._name, self._reads, "cache")
        if not 0 <= instance < self.num_instances_:
            raise RoutingError(f"Router {self._name!r} probed instance {instance}, which does not exist")
        hit = 0
        for h in request.block_hashes:
            if h not in self._residency[instance]:
                break
            hit += 1
        return hit * 16


def _requests(count: int) -> list[tuple[str, list[bytes], int]]:
    """(id, block hashes, tokens): 8 prefix families, 1 to 12 blocks of 16 tokens each."""
    out = []
    for i in range(count):
        family = i % 8
        blocks = 1 + (i * 7) % 12
        hashes = []
        parent = b"family%d" % family
        for b in range(blocks):
            if b >= 3 + family % 4:
                parent = parent + b"-%d" % i  # a private tail past the family's shared prefix
            parent = hashlib.sha256(parent + b"%d" % b).digest()
            hashes.append(parent)
        out.append((f"kit-{i}", hashes, blocks * 16 + (i % 16)))
    return out


def _run(spec: RouterSpec, num_instances: int, seed: int, count: int) -> list[int]:
    context = RouterContext(num_instances=num_instances, block_size=16, seed=seed)
    router = build_router(spec, context)
    view = _KitView(spec, num_instances)
    events_sink = router if "kv_events" in spec.reads and isinstance(router, ReadsKVEvents) else None
    choices: list[int] = []
    for step, (rid, hashes, tokens) in enumerate(_requests(count)):
        view._loads = [
            InstanceLoad(
                index=i,
                waiting=(step + 3 * i) % 5,
                running=(step * (i + 1)) % 7,
                prefill_tokens=((step + i) % 4) * 64,
                active_blocks=((step + 2 * i) % 9) * 10,
                num_blocks=100,
            )
            for i in range(num_instances)
        ]
        request = RouteRequest(request_id=rid, arrival_ms=float(step), num_tokens=tokens, block_hashes=hashes)
        choice: object = router.route(request, view)
        if type(choice) is not int or not 0 <= choice < num_instances:
            raise RoutingError(
                f"Router {spec.name!r} sent request {rid} to instance {choice!r}; the fleet has instances "
                f"0..{num_instances - 1}"
            )
        choices.append(choice)
        resident = view._residency[choice]
        new = [h for h in hashes if h not in resident]
        resident.update(new)
        evicted: list[bytes] = []
        if len(resident) > 40:  # a small cache: the kit evicts too, so removals reach the router
            evicted = sorted(resident)[: len(resident) - 40]
            resident.difference_update(evicted)
        if events_sink is not None and (new or evicted):
            events: list[KVCacheEvent] = []
            if new:
                events.append(
                    BlockStored(
                        block_hashes=new,
                        parent_block_hash=None,
                        token_ids=list(range(16 * len(new))),
                        block_size=16,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                        group_idx=0,
                        kv_cache_spec_kind="full_attention",
                    )
                )
            if evicted:
                events.append(BlockRemoved(block_hashes=evicted, medium="GPU", group_idx=0))
            events_sink.on_kv_events(choice, encode_event_batch(events, ts=float(step)))
    return choices


def check_router(
    router: str | RouterSpec, *, num_instances: int = 4, seed: int = 0, requests: int = 96
) -> RouterCheck:
    """Run ``router`` (a registered name or a spec) through the kit (see the module docstring)."""
    spec = resolve_router(router) if isinstance(router, str) else router
    first = _run(spec, num_instances, seed, requests)
    second = _run(spec, num_instances, seed, requests)
    if first != second:
        at = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
        raise RoutingError(
            f"Router {spec.name!r} is not deterministic under seed {seed}: request kit-{at} went to "
            f"instance {first[at]}, then to {second[at]} in a second run with the same seed (take all "
            "randomness from RouterContext.seed)"
        )
    single = _run(spec, 1, seed, 8)
    checks = (
        f"{requests} requests on {num_instances} instances: every choice an instance",
        f"reads only what it declares ({', '.join(sorted(spec.reads)) or 'nothing'})",
        f"deterministic under seed {seed}",
        "routes on a one-instance fleet",
    )
    del single
    return RouterCheck(
        name=spec.name, reads=spec.reads, requests=requests, choices=tuple(first), checks=checks
    )


__all__ = ["RouterCheck", "check_router"]
