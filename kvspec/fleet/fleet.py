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
import functools
import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvspec.blocks.event_wire import encode_event_batch
from kvspec.contracts.release import DEFAULT_EVENT_RELEASE, EVENT_RELEASES, profile_for_event_wire
from kvspec.contracts.spec import SchedulerLimits
from kvspec.coordinator import KVCacheCoordinator
from kvspec.engine.instance import EngineInstance, InstanceLoad
from kvspec.engine.offload import build_connector, build_pool
from kvspec.engine.replay import PLANNED_RETENTION, TraceClock, trace_request
from kvspec.engine.stats import TimedReplayStats
from kvspec.engine.step_time import StepTime, StepTimeModel
from kvspec.engine.traces import TraceRequest
from kvspec.errors import FleetConfigError, RoutingError
from kvspec.eviction import resolve_eviction_policy
from kvspec.fleet.registry import build_router, resolve_router
from kvspec.fleet.report import FleetReport, fleet_report, tier_settings
from kvspec.fleet.routing import (
    ReadsKVEvents,
    Router,
    RouterContext,
    RouteRequest,
    RouterSpec,
    TracksRequests,
    require_read,
)
from kvspec.intmath import cdiv
from kvspec.planning.config import KVCacheConfig
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
    event_wire: str = DEFAULT_EVENT_RELEASE
    speedup: float = 1.0
    seed: int = 0
    retention_interval: int | None = PLANNED_RETENTION
    #: Keep one row per request in the report (``FleetReport.requests``).
    per_request: bool = False
    #: Run quiet decode steps as bookkeeping where the layout allows (the same figures; off to compare).
    quiet_decode: bool = True
    #: Offload tiers: host memory per instance and one pool all instances share (None: the GPU cache only).
    tiers: TierSettings | None = None
    #: Count each KV-cache group's own hit at every first admission (``FleetReport`` then gives each group's
    #: reuse and the groups that limited the hits; one more search per admission).
    per_group: bool = False

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
        if self.event_wire not in EVENT_RELEASES:
            raise FleetConfigError(
                f"event_wire must be a vLLM release ({', '.join(EVENT_RELEASES)}), got {self.event_wire!r}"
            )


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
    instances, tiers, pool = _start_instances(config, limits, settings, spec, on_request)
    context = RouterContext(
        num_instances=settings.num_instances,
        block_size=instances[0].coordinator.hash_block_size,
        seed=settings.seed,
        options=dict(settings.router_options),
    )
    chosen = router if router is not None else build_router(spec, context)
    ordered = sorted(requests, key=lambda r: r.arrival_ms)
    if settings.speedup != 1.0:
        ordered = [dataclasses.replace(r, arrival_ms=r.arrival_ms / settings.speedup) for r in ordered]
    refused_at_door = _Replay(instances, chosen, spec, settings, on_request).run(ordered)
    for instance in instances:
        instance.coordinator.check_invariants()
    return fleet_report(
        instances,
        refused_at_door,
        settings=_settings_row(settings, config, instances, tiers, pool),
        wall_seconds=time.perf_counter() - started,
    )


def _start_instances(
    config: KVCacheConfig,
    limits: SchedulerLimits,
    settings: FleetSettings,
    spec: RouterSpec,
    on_request: Callable[[TraceRequest], None] | None,
) -> tuple[list[EngineInstance], TierSettings | None, object]:
    """The fleet's instances, each on its own clock, with the tiers (one shared pool) when enabled."""
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
            per_group=settings.per_group,
        )
        for i in range(n)
    ]
    for instance in instances:
        instance.track_queued_hits = "loads" in spec.reads
        instance.record_requests = settings.per_request
        instance.fast_decode = settings.quiet_decode
    return instances, tiers, pool


class _Replay:
    """The fleet's event loop: the earliest of the next arrival (routed, or refused at the door) and the
    earliest busy instance's step runs next; KV events reach the router ``event_lag_ms`` after the step that
    made them, in vLLM's wire format."""

    def __init__(
        self,
        instances: list[EngineInstance],
        router: Router,
        spec: RouterSpec,
        settings: FleetSettings,
        on_request: Callable[[TraceRequest], None] | None,
    ) -> None:
        self.instances = instances
        self.router = router
        self.name = settings.router
        self.view = _GuardedView(instances, spec)
        self.on_request = on_request
        self.on_events = (
            router.on_kv_events if "kv_events" in spec.reads and isinstance(router, ReadsKVEvents) else None
        )
        if isinstance(router, TracksRequests):
            for i, instance in enumerate(instances):
                instance.on_done = functools.partial(router.on_request_done, i)
        self.lag = settings.event_lag_ms
        self.wire = profile_for_event_wire(settings.event_wire).events.wire
        self.hasher = instances[0].coordinator.make_block_hasher(seed="kvspec-replay")
        self.hash_block = instances[0].coordinator.hash_block_size
        self.inbox: list[tuple[float, int, int, bytes]] = []  # (delivery ms, sequence, instance, payload)
        self.sequence = 0
        self.refused_at_door = TimedReplayStats()

    def run(self, ordered: list[TraceRequest]) -> TimedReplayStats:
        """Replay ``ordered`` (by arrival) to the end; the requests refused at the door, as stats."""
        instances = self.instances
        pending = deque(ordered)
        busy = [False] * len(instances)
        while True:
            next_step = float("inf")
            stepper = -1
            for i, instance in enumerate(instances):
                if busy[i] and instance.now_ms < next_step:
                    next_step = instance.now_ms
                    stepper = i
            if pending and pending[0].arrival_ms <= next_step:
                item = pending.popleft()
                choice = self._arrive(item)
                if choice is not None:
                    busy[choice] = instances[choice].busy
                continue
            if stepper < 0:
                return self.refused_at_door
            instance = instances[stepper]
            instance.step(pending[0].arrival_ms if pending else float("inf"))
            busy[stepper] = instance.busy
            if self.on_events is not None:
                events = instance.take_events()
                if events:
                    payload = encode_event_batch(events, ts=instance.now_ms / 1000.0, wire=self.wire)
                    heapq.heappush(self.inbox, (instance.now_ms + self.lag, self.sequence, stepper, payload))
                    self.sequence += 1

    def _arrive(self, item: TraceRequest) -> int | None:
        """Deliver the events due, then route ``item`` (None: refused at the door)."""
        now = item.arrival_ms
        while self.inbox and self.inbox[0][0] <= now and self.on_events is not None:
            _, _, source, payload = heapq.heappop(self.inbox)
            self.on_events(source, payload)
        instances = self.instances
        if instances[0].refuses(item):
            door = self.refused_at_door
            door.requests += 1
            door.refused += 1
            door.prompt_tokens += item.input_length
            door.prompt_blocks += cdiv(item.input_length, item.hash_block_size or self.hash_block)
            if self.on_request is not None:
                self.on_request(item)
            return None
        request = trace_request(item, self.hasher)
        self.view._fresh()
        choice = self.router.route(
            RouteRequest(
                request_id=request.request_id,
                arrival_ms=now,
                num_tokens=request.num_tokens,
                block_hashes=request.block_hashes,
                request=request,
            ),
            self.view,
        )
        picked: object = choice
        if type(picked) is not int or not 0 <= picked < len(instances):
            raise RoutingError(
                f"Router {self.name!r} sent request {request.request_id} to instance {choice!r}; "
                f"the fleet has instances 0..{len(instances) - 1}"
            )
        instances[choice].add(item, request, at_ms=now)
        return choice


def _settings_row(
    settings: FleetSettings,
    config: KVCacheConfig,
    instances: list[EngineInstance],
    tiers: TierSettings | None,
    pool: object,
) -> dict[str, Any]:
    """The settings a report prints: what the run was given, as plain values."""
    return {
        "num_instances": settings.num_instances,
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
        **tier_settings(tiers, pool),
    }


__all__ = ["FleetReport", "FleetSettings", "fleet_coordinator", "run_fleet"]
