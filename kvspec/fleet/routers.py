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

Each router declares its options (name, default) where it registers, in one ``@router`` line; the registry
fills in the defaults and refuses an unknown option or a value that is not a number (``RouterOptionError``)
when the router is built. ``ROUTERS.entry(name).options`` lists them.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kvspec.errors import RouterError
from kvspec.fleet.index import KVEventIndex
from kvspec.fleet.registry import router
from kvspec.fleet.routing import FleetView, RouterContext, RouteRequest, router_options


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheAwareOptions:
    """``cache_aware``: the prefix-match ratio to follow history, the imbalance (absolute requests and
    ratio) that falls back to the least loaded, the history's size in tokens."""

    cache_threshold: float = 0.3
    balance_abs_threshold: float = 64
    balance_rel_threshold: float = 1.5
    max_tree_size: int = 2**25


@dataclass(frozen=True, kw_only=True, slots=True)
class PrefixScorerOptions:
    """``exact_prefix``: llm-d's weights (its benchmark's) of prefix overlap, free KV and short queue."""

    prefix_weight: float = 3.0
    kv_usage_weight: float = 2.0
    queue_weight: float = 2.0


@dataclass(frozen=True, kw_only=True, slots=True)
class PrecisePrefixOptions(PrefixScorerOptions):
    """``precise_prefix``: the weights, and what a block held only in host memory counts."""

    cpu_weight: float = 0.8


@dataclass(frozen=True, kw_only=True, slots=True)
class CostOptions:
    """``exact``: Dynamo's overlap credit, prefill load scale and softmax temperature (0: lowest cost)."""

    overlap_score_credit: float = 1.0
    prefill_load_scale: float = 1.0
    temperature: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class KvCostOptions(CostOptions):
    """``kv_cost``: the cost's options, and the overlap credit of a block in host memory and on disk."""

    host_credit: float = 0.75
    disk_credit: float = 0.25


@dataclass(frozen=True, kw_only=True, slots=True)
class LongestPrefixOptions:
    """``longest_prefix``: ties to the lowest index (0) or at random (1)."""

    random_ties: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class NoOptions:
    """A router that takes no option."""


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

    def _start_index(self, num_instances: int, **offloaded: float) -> None:
        """An empty index of ``num_instances``; a block in device memory counts 1, one only offloaded the
        weight of its medium in ``offloaded`` (CPU=, STORAGE=)."""
        self.index = KVEventIndex(num_instances)
        self.medium_weights = {"GPU": 1.0, **offloaded}

    def on_kv_events(self, instance: int, payload: bytes) -> None:
        self.index.apply(instance, payload)

    def _overlap_blocks(self, request: RouteRequest, fleet: FleetView) -> list[float]:
        if self.index.offloaded:
            return self.index.weighted_overlap(request.block_hashes, self.medium_weights)
        return [float(d) for d in self.index.overlap(request.block_hashes)]


def _least_loaded(loads: Sequence[Any], among: Sequence[int] | None = None) -> int:
    candidates = range(len(loads)) if among is None else among
    return min(candidates, key=lambda i: (loads[i].requests, i))


@router("round_robin", options=NoOptions, description="instances in turn")
class RoundRobin:
    def __init__(self, context: RouterContext) -> None:
        router_options(NoOptions, "round_robin", context)
        self._n = context.num_instances
        self._next = 0

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        choice = self._next
        self._next = (choice + 1) % self._n
        return choice


@router("random", options=NoOptions, description="uniform at random (seeded)")
class RandomRouter:
    def __init__(self, context: RouterContext) -> None:
        router_options(NoOptions, "random", context)
        self._n = context.num_instances
        self._rng = random.Random(context.seed)

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        return self._rng.randrange(self._n)


@router("least_loaded", reads=("loads",), options=NoOptions, description="fewest requests in flight")
class LeastLoaded:
    def __init__(self, context: RouterContext) -> None:
        router_options(NoOptions, "least_loaded", context)

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        return _least_loaded(fleet.loads())


@router(
    "power_of_two", reads=("loads",), options=NoOptions, description="the less loaded of two random instances"
)
class PowerOfTwo:
    def __init__(self, context: RouterContext) -> None:
        router_options(NoOptions, "power_of_two", context)
        self._n = context.num_instances
        self._rng = random.Random(context.seed)

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        if self._n == 1:
            return 0
        first, second = self._rng.sample(range(self._n), 2)
        loads = fleet.loads()
        return second if loads[second].requests < loads[first].requests else first


@router(
    "cache_aware",
    reads=("loads",),
    options=CacheAwareOptions,
    description="SGLang/vllm-router cache_aware: routing-history prefix match, balance thresholds",
)
class CacheAware:
    """SGLang's / vllm-router's ``cache_aware`` over the router's own routing history (see the module table)."""

    def __init__(self, context: RouterContext) -> None:
        options = router_options(CacheAwareOptions, "cache_aware", context)
        self._threshold = options.cache_threshold
        self._abs = options.balance_abs_threshold
        self._rel = options.balance_rel_threshold
        self._block = context.block_size
        self._capacity = max(1, options.max_tree_size // context.block_size)
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


class _PrefixScorer:
    """llm-d's precise prefix-cache scorer with its queue and KV-usage scorers (see the module table), the
    overlap from KV events (``precise_prefix``) or from each instance's coordinator (``exact_prefix``)."""

    name: ClassVar[str]
    settings: ClassVar[type[PrefixScorerOptions]]

    def __init__(self, context: RouterContext) -> None:
        options = router_options(self.settings, self.name, context)
        self._weights = (options.prefix_weight, options.kv_usage_weight, options.queue_weight)
        self._rng = random.Random(context.seed)

    def _overlap_blocks(self, request: RouteRequest, fleet: FleetView) -> list[float]:
        raise NotImplementedError

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


@router(
    reads=("loads", "kv_events"),
    description="llm-d precise prefix scorer: KV-event index, longest prefix, queue and KV usage",
)
class PrecisePrefix(_IndexFed, _PrefixScorer):
    name = "precise_prefix"
    settings = PrecisePrefixOptions

    def __init__(self, context: RouterContext) -> None:
        super().__init__(context)
        self._start_index(
            context.num_instances, CPU=router_options(PrecisePrefixOptions, self.name, context).cpu_weight
        )


@router(
    reads=("loads", "cache"),
    description="kvspec: precise_prefix's scoring with each instance's real hit",
)
class ExactPrefix(_PrefixScorer):
    """llm-d's scoring with each instance's real hit instead of the KV-event index (``exact_prefix``)."""

    name = "exact_prefix"
    settings = PrefixScorerOptions

    def __init__(self, context: RouterContext) -> None:
        super().__init__(context)
        self._block = context.block_size

    def _overlap_blocks(self, request: RouteRequest, fleet: FleetView) -> list[float]:
        return [fleet.cache_hit(i, request) / self._block for i in range(fleet.num_instances)]


@router(
    reads=("loads", "kv_events"),
    description="kvspec: precise_prefix's scoring with every group's residency from KV events (hybrids)",
)
class HybridPrefix(_IndexFed, _PrefixScorer):
    """llm-d's scoring with a hybrid's servable prefix read from events alone (llm-d's "two-phase" idea):
    full attention's consecutive prefix, then the largest boundary below it where each window group holds
    its window and each Mamba group its state (``KVEventIndex.hybrid_overlap``). A model with only full
    attention scores as ``precise_prefix`` does."""

    name = "hybrid_prefix"
    settings = PrefixScorerOptions

    def __init__(self, context: RouterContext) -> None:
        super().__init__(context)
        self.index = KVEventIndex(context.num_instances, groups=True)
        self.medium_weights = {"GPU": 1.0}
        self._block = context.block_size

    def _overlap_blocks(self, request: RouteRequest, fleet: FleetView) -> list[float]:
        return [float(d) for d in self.index.hybrid_overlap(request.block_hashes, self._block)]


def _held_depth(hashes: Sequence[bytes], held: dict[bytes, int]) -> int:
    """How many of ``hashes`` from block 0 on ``held`` holds (Dynamo's overlap depth with the prompts in
    flight). Chained hashes make what is held prefix-closed (a block's hash names its whole prefix, so a
    prompt holding block k holds blocks 0..k-1 too), so the depth is found by bisection."""
    low, high = 0, len(hashes) if held else 0
    while low < high:
        middle = (low + high) // 2
        if hashes[middle] in held:
            low = middle + 1
        else:
            high = middle
    return low


class _CostRouter:
    """Dynamo's KV router cost (``kv_cost``), with the overlap from KV events or, in ``exact``, from each
    instance's coordinator.

    The decode term is Dynamo's potential active blocks: the blocks the instance holds for its requests,
    plus the request's full blocks that none of the requests this router sent there and that have not
    finished already holds (Dynamo's ``new_blocks``, counted over the block hashes it tracks per routed
    request). A prefix that requests in flight on an instance share is charged to it once."""

    name: ClassVar[str]
    settings: ClassVar[type[CostOptions]]

    def __init__(self, context: RouterContext) -> None:
        options = router_options(self.settings, self.name, context)
        self._credit = options.overlap_score_credit
        self._scale = options.prefill_load_scale
        self._temperature = options.temperature
        if self._temperature < 0:
            raise RouterError(f"Router {self.name!r}: temperature must be >= 0, got {self._temperature:g}")
        self._block = context.block_size
        self._rng = random.Random(context.seed)
        #: Per instance, how many of the requests routed there and not yet done hold each block hash.
        self._in_flight: list[dict[bytes, int]] = [{} for _ in range(context.num_instances)]
        self._routed: dict[str, tuple[int, tuple[bytes, ...]]] = {}

    def _overlap_blocks(self, request: RouteRequest, fleet: FleetView) -> list[float]:
        raise NotImplementedError

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        loads = fleet.loads()
        overlap = self._overlap_blocks(request, fleet)
        block = self._block
        hashes = tuple(request.block_hashes)  # the prompt's: the engine's list grows as the request decodes
        costs = []
        for i, load in enumerate(loads):
            prefill = (load.prefill_tokens + request.num_tokens) / block
            adjusted = max(0.0, prefill - self._credit * overlap[i])
            new_blocks = len(hashes) - _held_depth(hashes, self._in_flight[i])
            costs.append(self._scale * adjusted + load.active_blocks + new_blocks)
        if self._temperature > 0:
            high, low = max(costs), min(costs)
            span = (high - low) or 1.0
            weights = [math.exp(-((c - low) / span) / self._temperature) for c in costs]
            choice = self._rng.choices(range(len(costs)), weights=weights)[0]
        else:
            choice = _pick_tied(costs, min(costs), self._rng)
        held = self._in_flight[choice]
        for h in hashes:
            held[h] = held.get(h, 0) + 1
        self._routed[request.request_id] = (choice, hashes)
        return choice

    def on_request_done(self, instance: int, request_id: str) -> None:
        """``request_id`` left ``instance``: its blocks no longer count as in flight there."""
        routed = self._routed.pop(request_id, None)
        if routed is None:
            return
        held = self._in_flight[routed[0]]
        for h in routed[1]:
            left = held[h] - 1
            if left:
                held[h] = left
            else:
                del held[h]


@router(
    reads=("loads", "kv_events"),
    description="Dynamo KV router: prefill blocks left after the overlap + active blocks",
)
class KvCost(_IndexFed, _CostRouter):
    name = "kv_cost"
    settings = KvCostOptions

    def __init__(self, context: RouterContext) -> None:
        super().__init__(context)
        costs = router_options(KvCostOptions, self.name, context)
        # Dynamo's overlap credits per tier: device 1.0, host 0.75, disk 0.25.
        self._start_index(context.num_instances, CPU=costs.host_credit, STORAGE=costs.disk_credit)


@router(
    reads=("loads", "cache"),
    description="kvspec: kv_cost with each instance's real hit (hybrid retention counted)",
)
class Exact(_CostRouter):
    name = "exact"
    settings = CostOptions

    def _overlap_blocks(self, request: RouteRequest, fleet: FleetView) -> list[float]:
        return [fleet.cache_hit(i, request) / self._block for i in range(fleet.num_instances)]


@router(
    "longest_prefix",
    reads=("cache",),
    options=LongestPrefixOptions,
    description="the longest real hit, no load term (Mooncake Fig. 10's local scheduler)",
)
class LongestPrefix:
    """The instance whose coordinator gives ``request`` the longest hit (tiers included), whatever its load;
    ties to the lowest index (``random_ties`` 0) or at random (1). A cache-only baseline: it shows what
    affinity alone does, herding included."""

    def __init__(self, context: RouterContext) -> None:
        random_ties = router_options(LongestPrefixOptions, "longest_prefix", context).random_ties
        if random_ties not in (0.0, 1.0):
            raise RouterError(f"Router 'longest_prefix': random_ties must be 0 or 1, got {random_ties:g}")
        self._rng = random.Random(context.seed) if random_ties else None

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        hits = [fleet.cache_hit(i, request) for i in range(fleet.num_instances)]
        best = max(hits)
        if self._rng is None:
            return hits.index(best)
        return _pick_tied(hits, best, self._rng)


__all__ = [
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
]
