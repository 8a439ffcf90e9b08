"""A fleet: N engine instances of one model behind a router, fed a trace on a simulated clock.

Each instance is an exact kvspec engine (:class:`~kvspec.engine.instance.EngineInstance`: the coordinator
with the model's planned layout and the release's rules, the eviction policy, kvspec's scheduler with
chunked prefill and preemption, a step-time model). One discrete-event loop advances them: the next event
is either the next arrival or the earliest step start of a busy instance; an arrival at or before a step's
start is routed first (it joins that step). A step's KV events are published when the step ends and reach
a router that reads them ``event_lag_ms`` later, encoded in vLLM's wire format, so a router's index lags
the engines as a real one does. With one instance and round robin the loop is exactly the timed replay.

Figures (:class:`FleetReport`): per instance and in total, requests, prompt tokens reused (tokens and
trace blocks, each request's first admission: DynoSim's ``prefix_cache_reused_ratio``), time to first
token, end-to-end latency and queueing (mean and p50/p90/p99, ms), throughput, preemptions and load
imbalance.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvspec.blocks.event_wire import encode_event_batch
from kvspec.contracts.spec import SchedulerLimits
from kvspec.coordinator import KVCacheCoordinator
from kvspec.engine.instance import EngineInstance, InstanceLoad, TimedReplayStats, percentile
from kvspec.engine.offload import build_connector, build_pool
from kvspec.engine.replay import PLANNED_RETENTION, TraceClock, trace_request
from kvspec.engine.step_time import StepTime, StepTimeModel
from kvspec.engine.traces import TraceRequest
from kvspec.errors import FleetConfigError, RoutingError
from kvspec.eviction import resolve_eviction_policy
from kvspec.fleet.registry import build_router, resolve_router
from kvspec.fleet.routing import ReadsKVEvents, Router, RouterContext, RouteRequest, RouterSpec, require_read
from kvspec.intmath import cdiv
from kvspec.planning.config import KVCacheConfig
from kvspec.tiers.connector import TierStats
from kvspec.tiers.settings import TierSettings


@dataclass(frozen=True, kw_only=True, slots=True)
class FleetSettings:
    """How a fleet runs. ``num_instances`` identical instances (each with the config's blocks);
    ``router`` by name with its ``router_options``; ``eviction_policy`` by name; per instance
    ``max_num_batched_tokens`` (tokens a step) and ``max_num_seqs``; ``step_time`` (ms a step);
    ``event_lag_ms`` (KV events reach the router this long after the step that made them);
    ``event_wire`` ("0.34" maps or "0.23" arrays); ``speedup`` (arrival times divided by it); ``seed``
    (the router's randomness); ``retention_interval`` (sliding-window/Mamba prefix-cache retention, tokens;
    None dense)."""

    num_instances: int
    router: str = "round_robin"
    router_options: Mapping[str, float] = field(default_factory=dict)
    eviction_policy: str = "lru"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    step_time: StepTime = field(default_factory=StepTimeModel)
    event_lag_ms: float = 0.0
    event_wire: str = "0.34"
    speedup: float = 1.0
    seed: int = 0
    retention_interval: int | None = PLANNED_RETENTION
    #: Keep one row per request in the report (``FleetReport.requests``).
    per_request: bool = False
    #: Run quiet decode steps as bookkeeping where the layout allows (the same figures; off to compare).
    quiet_decode: bool = True
    #: Offload tiers: host memory per instance and one pool all instances share (None: the GPU cache only).
    tiers: TierSettings | None = None

    def __post_init__(self) -> None:
        count: object = self.num_instances
        if type(count) is not int or count < 1:
            raise FleetConfigError(
                f"a fleet needs at least 1 instance, got num_instances={self.num_instances!r}"
            )
        if not (self.speedup > 0 and math.isfinite(self.speedup)):
            raise FleetConfigError(f"speedup must be a finite number > 0, got {self.speedup!r}")
        if not (self.event_lag_ms >= 0 and math.isfinite(self.event_lag_ms)):
            raise FleetConfigError(f"event_lag_ms must be a finite number >= 0, got {self.event_lag_ms!r}")
        if self.event_wire not in ("0.34", "0.32", "0.23"):
            raise FleetConfigError(f"event_wire must be '0.34' or '0.23', got {self.event_wire!r}")


class _GuardedView:
    """The fleet as one router may see it: reads it did not declare raise RouterAccessError."""

    __slots__ = ("_instances", "_loads", "_name", "_reads")

    def __init__(self, instances: Sequence[EngineInstance], spec: RouterSpec) -> None:
        self._instances = instances
        self._name = spec.name
        self._reads = spec.reads
        self._loads: list[InstanceLoad] | None = None

    @property
    def num_instances(self) -> int:
        return len(self._instances)

    def loads(self) -> Sequence[InstanceLoad]:
        require_read(self._name, self._reads, "loads")
        if self._loads is None:
            self._loads = [instance.load() for instance in self._instances]
        return self._loads

    def cache_hit(self, instance: int, request: RouteRequest) -> int:
        require_read(self._name, self._reads, "cache")
        if request.request is None:
            raise RoutingError(
                f"Router {self._name!r}: request {request.request_id} carries no engine request"
            )
        return self._instances[instance].probe_hit(request.request)

    def _fresh(self) -> None:
        self._loads = None


@dataclass(frozen=True, kw_only=True, slots=True)
class FleetReport:
    """A fleet run's figures: ``total`` and one row per instance (``instances``), plus the settings and
    ``wall_seconds`` (this machine's time to run it)."""

    settings: dict[str, Any]
    total: dict[str, Any]
    instances: list[dict[str, Any]]
    wall_seconds: float
    #: With ``FleetSettings.per_request``: per request, in trace order, its line, instance, first
    #: admission's hit tokens, queueing, TTFT and end-to-end ms.
    requests: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "total": self.total,
            "instances": self.instances,
            "wall_seconds": self.wall_seconds,
        }


def _latency(values: list[float], name: str) -> dict[str, float]:
    return {
        f"{name}_mean": round(statistics.fmean(values), 1) if values else 0.0,
        f"{name}_p50": round(percentile(values, 0.5), 1),
        f"{name}_p90": round(percentile(values, 0.9), 1),
        f"{name}_p99": round(percentile(values, 0.99), 1),
    }


def _figures(stats: TimedReplayStats, seconds: float) -> dict[str, Any]:
    return {
        "requests": stats.requests,
        "finished": stats.finished,
        "refused": stats.refused,
        "prompt_tokens": stats.prompt_tokens,
        "reused_tokens": stats.first_admission_hit_tokens,
        "reuse_ratio": round(stats.prompt_hit_rate, 4),
        "prompt_blocks": stats.prompt_blocks,
        "reused_blocks": stats.first_admission_hit_blocks,
        "block_reuse_ratio": round(stats.block_hit_rate, 4),
        "generated_tokens": stats.generated_tokens,
        "preemptions": stats.preemptions,
        "steps": stats.steps,
        **_latency(stats.ttft_ms, "ttft_ms"),
        **_latency(stats.e2e_ms, "e2e_ms"),
        **_latency(stats.queue_ms, "queue_ms"),
        "output_tokens_per_s": round(stats.generated_tokens / seconds, 1) if seconds else 0.0,
        "total_tokens_per_s": round((stats.prompt_tokens + stats.generated_tokens) / seconds, 1)
        if seconds
        else 0.0,
        **stats.tier_figures(),
    }


def _merge(parts: Sequence[TimedReplayStats]) -> TimedReplayStats:
    total = TimedReplayStats()
    tiers = [part.tiers for part in parts if part.tiers is not None]
    if tiers:
        total.tiers = TierStats.merged(tiers)
    for part in parts:
        for f in dataclasses.fields(TimedReplayStats):
            value = getattr(part, f.name)
            if f.name == "tiers":
                continue
            if isinstance(value, list):
                getattr(total, f.name).extend(value)
            elif f.name == "simulated_ms":
                total.simulated_ms = max(total.simulated_ms, value)
            else:
                setattr(total, f.name, getattr(total, f.name) + value)
    return total


def _tier_settings(tiers: TierSettings | None, pool: object) -> dict[str, Any]:
    if tiers is None:
        return {}
    return {
        "host_bytes_per_instance": tiers.host_bytes,
        "host_tier": tiers.host_tier,
        "host_options": dict(tiers.host_options),
        "shared_pool_bytes": tiers.pool_bytes,
        "pool_blocks": getattr(pool, "capacity_blocks", 0),
        "offload": list(tiers.offload),
        "host_link": repr(tiers.host_link),
        "pool_link": repr(tiers.pool_link),
    }


def fleet_coordinator(
    config: KVCacheConfig,
    limits: SchedulerLimits,
    settings: FleetSettings,
    *,
    clock: TraceClock,
    events: bool,
) -> KVCacheCoordinator:
    """One instance's coordinator: prefix caching on, the current release's rules, the settings' policy
    and retention, KV events on when the router reads them."""
    return KVCacheCoordinator(
        config,
        limits,
        enable_caching=True,
        enable_kv_cache_events=events,
        eviction_policy=settings.eviction_policy,
        eviction_clock=clock,
        prefix_cache_retention_interval=settings.retention_interval,
    )


def run_fleet(
    requests: Iterable[TraceRequest],
    config: KVCacheConfig,
    limits: SchedulerLimits,
    settings: FleetSettings,
    *,
    router: Router | None = None,
    on_request: Callable[[TraceRequest], None] | None = None,
) -> FleetReport:
    """Run ``requests`` (a trace, any order: sorted by arrival, stable) through ``settings.num_instances``
    instances of ``config`` (blocks per instance) behind the settings' router (or ``router``, already built,
    with the registration of ``settings.router`` deciding what it may read). ``on_request`` is called as
    each request finishes or is refused (a progress bar). Every instance holds no request afterwards."""
    spec = resolve_router(settings.router)
    resolve_eviction_policy(settings.eviction_policy)  # an unknown name fails before any work
    started = time.perf_counter()
    n = settings.num_instances
    wants_events = "kv_events" in spec.reads
    clocks = [TraceClock() for _ in range(n)]
    coordinators = [
        fleet_coordinator(config, limits, settings, clock=clocks[i], events=wants_events) for i in range(n)
    ]
    tiers = settings.tiers if settings.tiers is not None and settings.tiers.enabled else None
    pool = None if tiers is None else build_pool(coordinators[0], tiers)  # one pool, every instance's
    instances = [
        EngineInstance(
            coordinators[i],
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_num_seqs=settings.max_num_seqs,
            step_time=settings.step_time,
            clock=clocks[i],
            index=i,
            on_finish=on_request,
            tiers=None if tiers is None else build_connector(coordinators[i], tiers, pool=pool),
        )
        for i in range(n)
    ]
    for instance in instances:
        instance.track_queued_hits = "loads" in spec.reads
        instance.record_requests = settings.per_request
        instance.fast_decode = settings.quiet_decode
    hasher = instances[0].coordinator.make_block_hasher(seed="kvspec-replay")
    hash_block = instances[0].coordinator.hash_block_size
    context = RouterContext(
        num_instances=n,
        block_size=hash_block,
        seed=settings.seed,
        options=dict(settings.router_options),
    )
    chosen = router if router is not None else build_router(spec, context)
    on_events = chosen.on_kv_events if wants_events and isinstance(chosen, ReadsKVEvents) else None
    view = _GuardedView(instances, spec)
    speedup = settings.speedup
    ordered = sorted(requests, key=lambda r: r.arrival_ms)
    if speedup != 1.0:
        ordered = [dataclasses.replace(r, arrival_ms=r.arrival_ms / speedup) for r in ordered]
    pending = deque(ordered)
    inbox: list[tuple[float, int, int, bytes]] = []  # (delivery ms, sequence, instance, payload)
    sequence = 0
    lag = settings.event_lag_ms
    wire = settings.event_wire
    refused_at_door = TimedReplayStats()
    busy = [False] * n
    while True:
        next_step = float("inf")
        stepper = -1
        for i, instance in enumerate(instances):
            if busy[i] and instance.now_ms < next_step:
                next_step = instance.now_ms
                stepper = i
        if pending and pending[0].arrival_ms <= next_step:
            item = pending.popleft()
            now = item.arrival_ms
            while inbox and inbox[0][0] <= now and on_events is not None:
                _, _, source, payload = heapq.heappop(inbox)
                on_events(source, payload)
            if instances[0].refuses(item):
                refused_at_door.requests += 1
                refused_at_door.refused += 1
                refused_at_door.prompt_tokens += item.input_length
                refused_at_door.prompt_blocks += cdiv(item.input_length, item.hash_block_size or hash_block)
                if on_request is not None:
                    on_request(item)
                continue
            request = trace_request(item, hasher)
            view._fresh()
            choice = chosen.route(
                RouteRequest(
                    request_id=request.request_id,
                    arrival_ms=now,
                    num_tokens=request.num_tokens,
                    block_hashes=request.block_hashes,
                    request=request,
                ),
                view,
            )
            picked: object = choice
            if type(picked) is not int or not 0 <= picked < n:
                raise RoutingError(
                    f"Router {settings.router!r} sent request {request.request_id} to instance {choice!r}; "
                    f"the fleet has instances 0..{n - 1}"
                )
            instances[choice].add(item, request, at_ms=now)
            busy[choice] = instances[choice].busy
            continue
        if stepper < 0:
            break
        instance = instances[stepper]
        instance.step(pending[0].arrival_ms if pending else float("inf"))
        busy[stepper] = instance.busy
        if on_events is not None:
            events = instance.take_events()
            if events:
                payload = encode_event_batch(events, ts=instance.now_ms / 1000.0, wire=wire)
                heapq.heappush(inbox, (instance.now_ms + lag, sequence, stepper, payload))
                sequence += 1
    for instance in instances:
        instance.coordinator.check_invariants()
    total = _merge([*(i.stats for i in instances), refused_at_door])
    seconds = total.simulated_ms / 1000.0
    rows = []
    for instance in instances:
        row = {"instance": instance.index, **_figures(instance.stats, seconds)}
        rows.append(row)
    per_instance = [row["requests"] for row in rows]
    prompt = [row["prompt_tokens"] for row in rows]
    summary = _figures(total, seconds)
    summary["refused_at_door"] = refused_at_door.refused
    summary["simulated_seconds"] = round(seconds, 3)
    summary["load_imbalance"] = (
        round(max(per_instance) / statistics.fmean(per_instance), 3) if any(per_instance) else 1.0
    )
    summary["prompt_token_imbalance"] = (
        round(max(prompt) / statistics.fmean(prompt), 3) if any(prompt) else 1.0
    )
    return FleetReport(
        settings={
            "num_instances": n,
            "router": settings.router,
            "router_options": dict(settings.router_options),
            "eviction_policy": settings.eviction_policy,
            "blocks_per_instance": config.num_blocks - 1,
            "block_size": instances[0].coordinator.scheduler_block_size,
            "max_num_batched_tokens": settings.max_num_batched_tokens,
            "max_num_seqs": settings.max_num_seqs,
            "step_time": repr(settings.step_time),
            "event_lag_ms": settings.event_lag_ms,
            "event_wire": settings.event_wire,
            "speedup": settings.speedup,
            "seed": settings.seed,
            **_tier_settings(tiers, pool),
        },
        total=summary,
        instances=rows,
        wall_seconds=round(time.perf_counter() - started, 3),
        requests=sorted(
            (
                {
                    "line": line,
                    "instance": instance.index,
                    "hit_tokens": hit,
                    "queue_ms": round(queued, 3),
                    "ttft_ms": round(ttft, 3),
                    "e2e_ms": round(e2e, 3),
                }
                for instance in instances
                for line, hit, queued, ttft, e2e in instance.stats.per_request
            ),
            key=lambda row: row["line"],
        ),
    )


__all__ = ["FleetReport", "FleetSettings", "fleet_coordinator", "run_fleet"]
