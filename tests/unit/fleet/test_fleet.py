"""The fleet loop: one instance is the timed replay, requests are conserved, KV-aware routers find the
family's cache, events lag, and routers that misbehave stop the run with a clear error."""

from __future__ import annotations

import dataclasses

import pytest

from kvspec.contracts.spec import SchedulerLimits
from kvspec.engine.replay import replay_coordinator
from kvspec.engine.step_time import StepTimeModel
from kvspec.engine.timed_replay import replay_timed
from kvspec.engine.traces import TraceRequest
from kvspec.errors import FleetConfigError, RouterAccessError, RoutingError, UnknownRouterError
from kvspec.fleet import FleetSettings, RouterContext, RouteRequest, register_router, run_fleet
from kvspec.fleet.routers import KvCost
from kvspec.fleet.routing import FleetView
from tests.helpers import full_spec, make_config, sw_spec
from tests.unit.fleet.fleet_helpers import family_trace

LIMITS = SchedulerLimits(max_model_len=4096, max_num_batched_tokens=64)
STEP = StepTimeModel(base_ms=10.0, per_token_ms=0.1, per_request_ms=0.0)
#: f0 f1 f2 f0 f1 f2 ...: four instances in turn never see one family twice in a row.
ORDER = [0, 1, 2] * 6


def _settings(n: int, router: str, *, event_lag_ms: float = 0.0, speedup: float = 1.0) -> FleetSettings:
    return FleetSettings(
        num_instances=n,
        router=router,
        max_num_batched_tokens=64,
        max_num_seqs=8,
        step_time=STEP,
        event_lag_ms=event_lag_ms,
        speedup=speedup,
    )


def test_one_instance_behind_round_robin_is_the_timed_replay() -> None:
    trace = family_trace(ORDER * 2, gap_ms=7.0, output_length=5)  # overlapping requests, chunked prefill
    config = make_config([full_spec(16)], 40)
    alone = replay_timed(
        trace, replay_coordinator(config, LIMITS), max_num_batched_tokens=64, max_num_seqs=8, step_time=STEP
    )
    report = run_fleet(trace, config, LIMITS, _settings(1, "round_robin"))
    total = report.total
    assert alone.preemptions > 0  # the case exercises preemption too
    assert total["reused_tokens"] == alone.first_admission_hit_tokens
    assert total["preemptions"] == alone.preemptions and total["steps"] == alone.steps
    assert total["ttft_ms_mean"] == round(sum(alone.ttft_ms) / len(alone.ttft_ms), 1)
    assert total["e2e_ms_p99"] == report.instances[0]["e2e_ms_p99"]


@pytest.mark.parametrize(
    "router",
    [
        "round_robin",
        "random",
        "least_loaded",
        "power_of_two",
        "cache_aware",
        "precise_prefix",
        "kv_cost",
        "exact",
        "longest_prefix",
    ],
)
def test_every_request_is_routed_once_and_finishes(router: str) -> None:
    trace = family_trace(ORDER, gap_ms=3.0)
    report = run_fleet(trace, make_config([full_spec(16)], 60), LIMITS, _settings(3, router))
    rows = report.instances
    assert sum(r["requests"] for r in rows) == report.total["requests"] == len(trace)
    assert sum(r["finished"] for r in rows) == len(trace)
    assert sum(r["prompt_tokens"] for r in rows) == sum(t.input_length for t in trace)
    assert report.total["generated_tokens"] == 2 * len(trace)


def test_a_router_that_tracks_its_requests_hears_each_leave_the_instance_it_chose() -> None:
    log: list[tuple[str, int, str]] = []

    class Tracking:
        def __init__(self, context: RouterContext) -> None:
            self.n = context.num_instances
            self.turn = 0

        def route(self, request: RouteRequest, fleet: FleetView) -> int:
            self.turn += 1
            log.append(("routed", self.turn % self.n, request.request_id))
            return self.turn % self.n

        def on_request_done(self, instance: int, request_id: str) -> None:
            log.append(("done", instance, request_id))

    register_router("test.tracking", Tracking)
    trace = family_trace(ORDER, gap_ms=3.0)
    run_fleet(trace, make_config([full_spec(16)], 60), LIMITS, _settings(3, "test.tracking"))
    routed = sorted((i, rid) for what, i, rid in log if what == "routed")
    assert len(routed) == len(trace)
    assert sorted((i, rid) for what, i, rid in log if what == "done") == routed  # each once, where it ran
    last_route = max(n for n, entry in enumerate(log) if entry[0] == "routed")
    assert any(entry[0] == "done" for entry in log[:last_route])  # told as they finish, not at the end


def test_round_robin_deals_the_requests_in_turn() -> None:
    report = run_fleet(
        family_trace(ORDER), make_config([full_spec(16)], 60), LIMITS, _settings(4, "round_robin")
    )
    assert [r["requests"] for r in report.instances] == [5, 5, 4, 4]


@pytest.mark.parametrize("router", ["cache_aware", "precise_prefix", "kv_cost", "exact", "exact_prefix"])
def test_kv_aware_routers_send_each_family_to_its_cache(router: str) -> None:
    """18 requests of 3 families, 6 shared blocks (96 tokens) each, one at a time: after a family's
    first request, each one hits all 96 shared tokens, where round robin scatters the families."""
    config = make_config([full_spec(16)], 60)
    trace = family_trace(ORDER)
    aware = run_fleet(trace, config, LIMITS, _settings(4, router)).total
    spread = run_fleet(trace, config, LIMITS, _settings(4, "round_robin")).total
    assert aware["reused_tokens"] == (len(trace) - 3) * 96
    assert aware["reused_blocks"] == (len(trace) - 3) * 6
    assert spread["reused_tokens"] < aware["reused_tokens"]


def test_longest_prefix_herds_traffic_that_shares_a_first_block() -> None:
    """Every request of the three families starts with one common block (as every request of Mooncake's
    conversation trace does): after the first request only instance 0 holds it, so ties to the lowest
    index send everything there and the fleet caches like one instance. With random ties the first
    request of each family may land elsewhere, but then its family follows it."""
    config = make_config([full_spec(16)], 200)
    trace = [
        dataclasses.replace(r, hash_ids=(7, *(r.hash_ids or ())), input_length=r.input_length + 16)
        for r in family_trace(ORDER)
    ]
    herded = run_fleet(trace, config, LIMITS, _settings(4, "longest_prefix"))
    assert [r["requests"] for r in herded.instances] == [len(trace), 0, 0, 0]
    one = run_fleet(trace, config, LIMITS, _settings(1, "round_robin")).total
    assert (
        herded.total["reused_tokens"] == one["reused_tokens"] == 16 * (len(trace) - 1) + 96 * (len(trace) - 3)
    )


class _Spy(KvCost):
    """kv_cost that records, per request, what its event index says each instance holds."""

    seen: list[list[int]]

    def __init__(self, context: RouterContext) -> None:
        super().__init__(context)
        self.seen = []

    def route(self, request: RouteRequest, fleet: FleetView) -> int:
        self.seen.append(self.index.overlap(request.block_hashes))
        return 0


@pytest.mark.parametrize(
    ("lag_ms", "overlap"), [(0.0, [6, 0]), (27.0, [6, 0]), (30.0, [4, 0]), (43.0, [4, 0]), (44.5, [0, 0])]
)
def test_kv_events_reach_the_router_after_the_lag(lag_ms: float, overlap: list[int]) -> None:
    """The first request's 128-token prompt runs in two 64-token steps of 16.4 ms each: blocks 0-3 are
    published at 16.4 ms, blocks 4-7 at 32.8 ms. The sibling arrives at 60 ms: a router that gets events
    ``lag_ms`` late sees both stores, the first only, or none (its 6 shared blocks span both)."""
    trace = family_trace([0, 0], gap_ms=60.0)
    spy = _Spy(RouterContext(num_instances=2, block_size=16))
    run_fleet(
        trace,
        make_config([full_spec(16)], 60),
        LIMITS,
        _settings(2, "kv_cost", event_lag_ms=lag_ms),
        router=spy,
    )
    assert spy.seen == [[0, 0], overlap]


def test_a_router_that_picks_a_missing_instance_stops_the_run() -> None:
    class Off:
        def __init__(self, context: RouterContext) -> None:
            self.n = context.num_instances

        def route(self, request: RouteRequest, fleet: FleetView) -> int:
            return self.n

    register_router("test.off_by_one", Off)
    with pytest.raises(
        RoutingError,
        match=r"'test.off_by_one' sent request trace-0 to instance 2; the fleet has instances 0..1",
    ):
        run_fleet(
            family_trace([0]), make_config([full_spec(16)], 60), LIMITS, _settings(2, "test.off_by_one")
        )


@pytest.mark.parametrize(("method", "declared"), [("loads", "loads"), ("cache", "cache")])
def test_a_router_reading_what_it_did_not_declare_stops_the_run(method: str, declared: str) -> None:
    class Nosy:
        def __init__(self, context: RouterContext) -> None:
            pass

        def route(self, request: RouteRequest, fleet: FleetView) -> int:
            if method == "loads":
                fleet.loads()
            else:
                fleet.cache_hit(0, request)
            return 0

    register_router("test.nosy", Nosy)
    with pytest.raises(RouterAccessError, match=rf"'test.nosy' .* did not declare reads=\('{declared}',\)"):
        run_fleet(family_trace([0]), make_config([full_spec(16)], 60), LIMITS, _settings(2, "test.nosy"))


def test_exact_sees_what_sliding_window_retention_keeps_and_events_do_not() -> None:
    """A full + sliding-window hybrid under sparse retention: the window group keeps only the blocks a hit
    can end on, so a sibling prompt sharing 6 blocks cannot hit them all, though full attention's stores
    (all the KV-event index knows) say it could. kvspec's probe reports the real, shorter hit."""
    config = make_config([full_spec(16), sw_spec(32)], 80)
    limits = SchedulerLimits(max_model_len=4096, max_num_batched_tokens=64)
    probes: list[tuple[list[int], list[int]]] = []

    class Both(KvCost):
        def route(self, request: RouteRequest, fleet: FleetView) -> int:
            index = self.index.overlap(request.block_hashes)
            probes.append((index, [fleet.cache_hit(i, request) // 16 for i in range(fleet.num_instances)]))
            return 0

    register_router("test.both", Both, reads=("loads", "kv_events", "cache"))
    run_fleet(family_trace([0, 0]), config, limits, _settings(1, "test.both"))
    (_, _), (index, real) = probes
    assert index == [6]
    assert real[0] < 6


def test_bad_fleet_settings_are_refused() -> None:
    with pytest.raises(FleetConfigError, match="at least 1 instance"):
        FleetSettings(num_instances=0)
    with pytest.raises(FleetConfigError, match="speedup"):
        FleetSettings(num_instances=1, speedup=0.0)
    with pytest.raises(FleetConfigError, match="event_lag_ms"):
        FleetSettings(num_instances=1, event_lag_ms=float("nan"))
    with pytest.raises(
        UnknownRouterError, match="Unknown router 'nope'; registered: cache_aware, consistent_hash, exact"
    ):
        run_fleet([], make_config([full_spec(16)], 8), LIMITS, FleetSettings(num_instances=1, router="nope"))


def test_speedup_compresses_arrivals() -> None:
    trace = family_trace(ORDER, gap_ms=100.0)
    config = make_config([full_spec(16)], 60)
    slow = run_fleet(trace, config, LIMITS, _settings(2, "round_robin")).total
    fast = run_fleet(trace, config, LIMITS, _settings(2, "round_robin", speedup=10.0)).total
    assert fast["simulated_seconds"] < slow["simulated_seconds"] / 5
    assert fast["queue_ms_mean"] >= slow["queue_ms_mean"]


def test_a_request_over_the_context_is_refused_at_the_door_and_counted() -> None:
    """A 5,000-token prompt on a 4,096-token model is turned away before routing: it counts in the
    totals (a request, its prompt tokens and trace blocks, nothing reused) and reaches no instance."""
    trace = family_trace([0, 0])
    trace.append(
        TraceRequest(
            line=2,
            arrival_ms=2500.0,
            input_length=5000,
            output_length=1,
            hash_ids=tuple(range(313)),
            hash_block_size=16,
        )
    )
    report = run_fleet(trace, make_config([full_spec(16)], 60), LIMITS, _settings(2, "kv_cost"))
    total = report.total
    assert (total["requests"], total["finished"], total["refused"], total["refused_at_door"]) == (3, 2, 1, 1)
    assert total["prompt_tokens"] == 2 * 128 + 5000 and total["prompt_blocks"] == 2 * 8 + 313
    assert sum(row["requests"] for row in report.instances) == 2


@pytest.mark.parametrize("n", [1, 2])
def test_per_group_names_the_window_that_limits_the_hits(n: int) -> None:
    """Issue 52: a full + sliding-window hybrid under sparse retention, per_group on. Each group's own reuse
    is at least the fleet's (the hit is where every group can resume), the window's equals it and limits
    the hits full attention alone would have taken; the run's other figures are those of a run without it."""
    config = make_config([full_spec(16), sw_spec(32)], 80)
    trace = family_trace([0, 0, 1, 0, 1, 1])
    plain = run_fleet(trace, config, LIMITS, _settings(n, "round_robin")).total
    counted = run_fleet(
        trace, config, LIMITS, dataclasses.replace(_settings(n, "round_robin"), per_group=True)
    ).total
    groups = ("group_reuse_ratios", "group_limited_requests", "limiting_groups")
    assert {k: v for k, v in counted.items() if k not in groups and k != "wall_seconds"} == {
        k: v for k, v in plain.items() if k != "wall_seconds"
    }
    full, window = counted["group_reuse_ratios"]
    assert full > window == counted["reuse_ratio"]
    assert counted["group_limited_requests"][0] == 0 < counted["group_limited_requests"][1]
    assert counted["limiting_groups"] == [1]
    assert not any(k in plain for k in groups)
