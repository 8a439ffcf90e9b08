"""The built-in routers (registered by name when :mod:`kvspec.fleet` is imported).

========================  =====================================================================  =========
name                      rule (source)                                                          reads
========================  =====================================================================  =========
``round_robin``           instances in turn                                                      --
``random``                uniform, seeded                                                        --
``least_loaded``          fewest requests in flight (queued + running), lowest index on ties     loads
``power_of_two``          two distinct instances at random, the one with fewer in flight         loads
``cache_aware``           SGLang's / vllm-router's: shortest queue when imbalanced (max - min >  loads
                          64 and max > 1.5 min), else the longest prefix match of the router's
                          own history if its ratio > 0.3, else the least loaded; history is an
                          LRU of block hashes per instance (``max_tree_size`` tokens)
``precise_prefix``        llm-d's precise scorer: longest consecutive prefix from block 0 in an   loads,
                          index fed only by KV events (vLLM 0.34 wire), weighted 3 with KV         kv_events
                          usage 2 and queue 2 (llm-d's benchmark weights), ties at random;
                          a block held only in host memory counts ``cpu_weight`` (0.8)
``kv_cost``               Dynamo's cost: ``scale * max(0, prefill - credit * overlap) + decode``  loads,
                          in blocks (prefill: tokens queued + this prompt; decode: blocks held +   kv_events
                          this prompt's), overlap from the KV event index; lowest wins, ties at
                          random; ``temperature`` > 0 samples a softmax of normalised costs;
                          offloaded blocks credit ``host_credit`` 0.75 / ``disk_credit`` 0.25
``exact``                 kvspec's: ``kv_cost``'s cost with each instance's real hit (its          loads,
                          coordinator's lookup: sliding windows, Mamba states, retention)          cache
``exact_prefix``          kvspec's: ``precise_prefix``'s scoring with each instance's real hit     loads,
                                                                                                 cache
``longest_prefix``        the instance with the longest real hit, no load term (Mooncake FAST'25  cache
                          Fig. 10's local scheduler: "the node with the higher prefix-match
                          ratio"); ties to the lowest index, or at random with ``random_ties`` 1.
                          With ties to the lowest index it herds: a prefix every request shares
                          (the conversation trace's first block) pulls all traffic to one instance
========================  =====================================================================  =========

Options (``RouterContext.options``) per router are listed in :data:`ROUTER_OPTIONS`; an unknown one is a
``RouterError`` when the router is built.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final

from kvspec.errors import RouterError
from kvspec.fleet.index import KVEventIndex
from kvspec.fleet.registry import register_router
from kvspec.fleet.routing import FleetView, RouterContext, RouteRequest, option

#: Each built-in router's options and their defaults.
ROUTER_OPTIONS: Final[Mapping[str, Mapping[str, float]]] = {
    "round_robin": {},
    "random": {},
    "least_loaded": {},
    "power_of_two": {},
    "cache_aware": {
        "cache_threshold": 0.3,
        "balance_abs_threshold": 64,
        "balance_rel_threshold": 1.5,
        "max_tree_size": 2**25,
    },
    "precise_prefix": {"prefix_weight": 3.0, "kv_usage_weight": 2.0, "queue_weight": 2.0, "cpu_weight": 0.8},
    "exact_prefix": {"prefix_weight": 3.0, "kv_usage_weight": 2.0, "queue_weight": 2.0},
    "kv_cost": {
        "overlap_score_credit": 1.0,
        "prefill_load_scale": 1.0,
        "temperature": 0.0,
        "host_credit": 0.75,
        "disk_credit": 0.25,
    },
    "exact": {"overlap_score_credit": 1.0, "prefill_load_scale": 1.0, "temperature": 0.0},
    "longest_prefix": {"random_ties": 0.0},
}


def _check_options(name: str, context: RouterContext) -> None:
    known = ROUTER_OPTIONS[name]
    unknown = sorted(set(context.options) - set(known))
    if unknown:
        raise RouterError(
            f"Router {name!r} has no option {', '.join(map(repr, unknown))}; its options: "
            f"{', '.join(f'{k} (default {v:g})' for k, v in known.items()) or 'none'}."
        )


def _pick_tied(values: Sequence[float], best: float, rng: random.Random) -> int:
    """The instance whose value is ``best``; among several, one at random (the router's seeded ``rng``)."""
    ties = [i for i, value in enumerate(values) if value == best]
    return ties[0] if len(ties) == 1 else rng.choice(ties)


class _IndexFed:
    """A router whose overlap is the KV-event index's (fed by ``on_kv_events``). With offloaded media in
    the index (instances with tiers publish "CPU" events), a block counts the best weight among the media
    holding it (``medium_weights``: llm-d's GPU 1.0 / CPU 0.8, Dynamo's 1.0 / 0.75 / 0.25)."""

    index: KVEventIndex
    medium_weights: dict[str, float]

    def on_kv_events(self, instance: int, payload: bytes) -> None:
        self.index.apply(instance, payload)

    def _overlap_blocks(self, request: RouteRequest, fleet: FleetView) -> list[float]:
        if self.index.offloaded:
            return self.index.weighted_overlap(request.block_hashes, self.medium_weights)
        return [float(d) for d in self.index.overlap(request.block_hashes)]


def _least_loaded(loads: Sequence[Any], among: Sequence[int] | None = None) -> int:
    candidates = range(len(loads)) if among is None else among
    return min(candidates, key=lambda i: (loads[i].requests, i))


class RoundRobin:
    def __init__(self, context: RouterContext) -> None:
        _check_options("round_robin", context)
        self._n = context.num_instances
        self._next = 0

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        choice = self._next
        self._next = (choice + 1) % self._n
        return choice


class RandomRouter:
    def __init__(self, context: RouterContext) -> None:
        _check_options("random", context)
        self._n = context.num_instances
        self._rng = random.Random(context.seed)

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        return self._rng.randrange(self._n)


class LeastLoaded:
    def __init__(self, context: RouterContext) -> None:
        _check_options("least_loaded", context)

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        return _least_loaded(fleet.loads())


class PowerOfTwo:
    def __init__(self, context: RouterContext) -> None:
        _check_options("power_of_two", context)
        self._n = context.num_instances
        self._rng = random.Random(context.seed)

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        if self._n == 1:
            return 0
        first, second = self._rng.sample(range(self._n), 2)
        loads = fleet.loads()
        return second if loads[second].requests < loads[first].requests else first


class CacheAware:
    """SGLang's / vllm-router's ``cache_aware`` over the router's own routing history (see the module table)."""

    def __init__(self, context: RouterContext) -> None:
        _check_options("cache_aware", context)
        self._threshold = option(context, "cache_threshold", 0.3)
        self._abs = option(context, "balance_abs_threshold", 64)
        self._rel = option(context, "balance_rel_threshold", 1.5)
        self._block = context.block_size
        self._capacity = max(1, int(option(context, "max_tree_size", 2**25)) // context.block_size)
        self._trees: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in range(context.num_instances)]

    def _match(self, tree: OrderedDict[bytes, None], hashes: Sequence[bytes]) -> int:
        matched = 0
        for h in hashes:
            if h not in tree:
                break
            matched += 1
        return matched

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        loads = fleet.loads()
        counts = [load.requests for load in loads]
        high, low = max(counts), min(counts)
        if high - low > self._abs and high > self._rel * low:
            choice = _least_loaded(loads)
        else:
            matches = [self._match(tree, request.block_hashes) for tree in self._trees]
            best = max(matches)
            ratio = best * self._block / request.num_tokens if request.num_tokens else 0.0
            if best and ratio > self._threshold:
                choice = _least_loaded(loads, [i for i, m in enumerate(matches) if m == best])
            else:
                choice = _least_loaded(loads)
        tree = self._trees[choice]
        for h in request.block_hashes:
            tree[h] = None
            tree.move_to_end(h)
        while len(tree) > self._capacity:
            tree.popitem(last=False)
        return choice


class PrecisePrefix(_IndexFed):
    """llm-d's precise prefix-cache scorer with its queue and KV-usage scorers (see the module table)."""

    def __init__(self, context: RouterContext) -> None:
        _check_options("precise_prefix", context)
        self.index = KVEventIndex(context.num_instances)
        self.medium_weights = {"GPU": 1.0, "CPU": option(context, "cpu_weight", 0.8)}
        self._weights = (
            option(context, "prefix_weight", 3.0),
            option(context, "kv_usage_weight", 2.0),
            option(context, "queue_weight", 2.0),
        )
        self._rng = random.Random(context.seed)

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        loads = fleet.loads()
        overlap = self._overlap_blocks(request, fleet)
        total = max(1, len(request.block_hashes))
        queues = [load.waiting for load in loads]
        q_high, q_low = max(queues), min(queues)
        w_prefix, w_kv, w_queue = self._weights
        scores = []
        for i, load in enumerate(loads):
            queue = 1.0 if q_high == q_low else (q_high - queues[i]) / (q_high - q_low)
            scores.append(w_prefix * overlap[i] / total + w_kv * (1.0 - load.kv_usage) + w_queue * queue)
        return _pick_tied(scores, max(scores), self._rng)


class ExactPrefix(PrecisePrefix):
    """llm-d's scoring with each instance's real hit instead of the KV-event index (``exact_prefix``)."""

    name = "exact_prefix"

    def __init__(self, context: RouterContext) -> None:
        super().__init__(context)  # the same options as precise_prefix's
        self._block = context.block_size

    def _overlap_blocks(self, request: RouteRequest, fleet: FleetView) -> list[float]:
        return [fleet.cache_hit(i, request) / self._block for i in range(fleet.num_instances)]


class _CostRouter:
    """Dynamo's KV router cost (``kv_cost``), with the overlap from KV events or, in ``exact``, from each
    instance's coordinator."""

    name = "kv_cost"

    def __init__(self, context: RouterContext) -> None:
        _check_options(self.name, context)
        self._credit = option(context, "overlap_score_credit", 1.0)
        self._scale = option(context, "prefill_load_scale", 1.0)
        self._temperature = option(context, "temperature", 0.0)
        if self._temperature < 0:
            raise RouterError(f"Router {self.name!r}: temperature must be >= 0, got {self._temperature:g}")
        self._block = context.block_size
        self._rng = random.Random(context.seed)

    def _overlap_blocks(self, request: RouteRequest, fleet: FleetView) -> list[float]:
        raise NotImplementedError

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        loads = fleet.loads()
        overlap = self._overlap_blocks(request, fleet)
        block = self._block
        incoming = request.num_tokens / block
        costs = []
        for i, load in enumerate(loads):
            prefill = (load.prefill_tokens + request.num_tokens) / block
            adjusted = max(0.0, prefill - self._credit * overlap[i])
            decode = load.active_blocks + math.ceil(incoming)
            costs.append(self._scale * adjusted + decode)
        if self._temperature > 0:
            high, low = max(costs), min(costs)
            span = (high - low) or 1.0
            weights = [math.exp(-((c - low) / span) / self._temperature) for c in costs]
            return self._rng.choices(range(len(costs)), weights=weights)[0]
        return _pick_tied(costs, min(costs), self._rng)


class KvCost(_IndexFed, _CostRouter):
    name = "kv_cost"

    def __init__(self, context: RouterContext) -> None:
        super().__init__(context)
        self.index = KVEventIndex(context.num_instances)
        # Dynamo's overlap credits per tier: device 1.0, host 0.75, disk 0.25.
        self.medium_weights = {
            "GPU": 1.0,
            "CPU": option(context, "host_credit", 0.75),
            "STORAGE": option(context, "disk_credit", 0.25),
        }


class Exact(_CostRouter):
    name = "exact"

    def _overlap_blocks(self, request: RouteRequest, fleet: FleetView) -> list[float]:
        return [fleet.cache_hit(i, request) / self._block for i in range(fleet.num_instances)]


class LongestPrefix:
    """The instance whose coordinator gives ``request`` the longest hit (tiers included), whatever its load;
    ties to the lowest index (``random_ties`` 0) or at random (1). A cache-only baseline: it shows what
    affinity alone does, herding included."""

    def __init__(self, context: RouterContext) -> None:
        _check_options("longest_prefix", context)
        random_ties = option(context, "random_ties", 0.0)
        if random_ties not in (0.0, 1.0):
            raise RouterError(f"Router 'longest_prefix': random_ties must be 0 or 1, got {random_ties:g}")
        self._rng = random.Random(context.seed) if random_ties else None

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        hits = [fleet.cache_hit(i, request) for i in range(fleet.num_instances)]
        best = max(hits)
        if self._rng is None:
            return hits.index(best)
        return _pick_tied(hits, best, self._rng)


def register_builtin_routers() -> None:
    register_router("round_robin", RoundRobin, description="instances in turn")
    register_router("random", RandomRouter, description="uniform at random (seeded)")
    register_router("least_loaded", LeastLoaded, reads=("loads",), description="fewest requests in flight")
    register_router(
        "power_of_two", PowerOfTwo, reads=("loads",), description="the less loaded of two random instances"
    )
    register_router(
        "cache_aware",
        CacheAware,
        reads=("loads",),
        description="SGLang/vllm-router cache_aware: routing-history prefix match, balance thresholds",
    )
    register_router(
        "precise_prefix",
        PrecisePrefix,
        reads=("loads", "kv_events"),
        description="llm-d precise prefix scorer: KV-event index, longest prefix, queue and KV usage",
    )
    register_router(
        "kv_cost",
        KvCost,
        reads=("loads", "kv_events"),
        description="Dynamo KV router: prefill blocks left after the overlap + active blocks",
    )
    register_router(
        "exact_prefix",
        ExactPrefix,
        reads=("loads", "cache"),
        description="kvspec: precise_prefix's scoring with each instance's real hit",
    )
    register_router(
        "exact",
        Exact,
        reads=("loads", "cache"),
        description="kvspec: kv_cost with each instance's real hit (hybrid retention counted)",
    )
    register_router(
        "longest_prefix",
        LongestPrefix,
        reads=("cache",),
        description="the longest real hit, no load term (Mooncake Fig. 10's local scheduler)",
    )


__all__ = [
    "ROUTER_OPTIONS",
    "CacheAware",
    "Exact",
    "ExactPrefix",
    "KvCost",
    "LeastLoaded",
    "LongestPrefix",
    "PowerOfTwo",
    "PrecisePrefix",
    "RandomRouter",
    "RoundRobin",
    "register_builtin_routers",
]
