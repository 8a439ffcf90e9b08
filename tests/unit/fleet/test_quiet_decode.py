"""Quiet decode (steps that start and fill no block run as bookkeeping) gives exactly the figures, events and
block pool of one step at a time, on random traces and fleets."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.contracts.spec import SchedulerLimits
from kvspec.coordinator import KVCacheCoordinator
from kvspec.engine.instance import EngineInstance
from kvspec.engine.replay import TraceClock, replay_coordinator, trace_request
from kvspec.engine.step_time import DynoSimStepTime, StepTimeModel
from kvspec.engine.traces import TraceRequest
from kvspec.fleet import FleetSettings, run_fleet
from tests.helpers import full_spec, make_config, sw_spec

LIMITS = SchedulerLimits(max_model_len=4096, max_num_batched_tokens=64)


@st.composite
def traces(draw: st.DrawFn) -> list[TraceRequest]:
    count = draw(st.integers(1, 14))
    rows = []
    now = 0.0
    for i in range(count):
        now += draw(st.integers(0, 300))  # whole ms: arrivals often fall exactly on a step's start
        family = draw(st.integers(0, 3))
        own = draw(st.integers(1, 5))
        ids = tuple(1000 * (family + 1) + b for b in range(draw(st.integers(0, 4)))) + tuple(
            100_000 + 100 * i + b for b in range(own)
        )
        length = 16 * len(ids) - draw(st.integers(0, 15))
        rows.append(
            TraceRequest(
                line=i,
                arrival_ms=now,
                input_length=length,
                output_length=draw(st.integers(1, 90)),
                hash_ids=ids,
                hash_block_size=16,
            )
        )
    return rows


def _run(trace: list[TraceRequest], fast: bool, blocks: int, model: Any) -> tuple[object, ...]:
    clock = TraceClock()
    coordinator = KVCacheCoordinator(
        make_config([full_spec(16)], blocks),
        LIMITS,
        enable_kv_cache_events=True,
        eviction_policy="lfu",
        eviction_clock=clock,
    )
    events: list[tuple[float, object]] = []
    instance = EngineInstance(
        coordinator, max_num_batched_tokens=64, max_num_seqs=4, step_time=model, clock=clock
    )
    instance.fast_decode = fast
    instance.record_requests = True
    hasher = coordinator.make_block_hasher(seed="kvspec-replay")
    pending = list(trace)
    while pending or instance.busy:
        while pending and (pending[0].arrival_ms <= instance.now_ms or not instance.busy):
            item = pending.pop(0)
            instance.add(
                item, None if instance.refuses(item) else trace_request(item, hasher), at_ms=item.arrival_ms
            )
        if instance.busy:
            instance.step(pending[0].arrival_ms if pending else float("inf"))
            events.extend((instance.now_ms, event) for event in instance.take_events())
    coordinator.check_invariants()
    pool = coordinator.block_pool
    cached = sorted((b.block_id, b.block_hash) for b in pool.blocks if b.block_hash is not None)
    free_order = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    return (instance.stats, cached, free_order, clock.now, events)


@settings(max_examples=60, deadline=None)
@given(trace=traces(), blocks=st.integers(12, 40), dynosim=st.booleans())
def test_quiet_decode_is_one_step_at_a_time(trace: list[TraceRequest], blocks: int, dynosim: bool) -> None:
    # Whole-ms steps (the second model) put step starts exactly on arrivals.
    model = DynoSimStepTime() if dynosim else StepTimeModel(base_ms=1.0, per_token_ms=0.0, per_request_ms=0.0)
    assert _run(trace, True, blocks, model) == _run(trace, False, blocks, model)


def test_quiet_decode_takes_fewer_python_steps_on_a_long_decode() -> None:
    """One request decoding 200 tokens in 16-token blocks: the steps that start or fill a block run one at a
    time, the 14 between each pair together; the figures count every step."""
    trace = [
        TraceRequest(
            line=0, arrival_ms=0.0, input_length=40, output_length=200, hash_ids=(1, 2, 3), hash_block_size=16
        )
    ]
    fast = _run(trace, True, 40, StepTimeModel())
    slow = _run(trace, False, 40, StepTimeModel())
    assert fast == slow
    assert fast[0].steps == 1 + 199  # type: ignore[attr-defined]


def test_a_window_or_state_group_turns_quiet_decode_off() -> None:
    full = replay_coordinator(make_config([full_spec(16)], 20), LIMITS)
    hybrid = replay_coordinator(make_config([full_spec(16), sw_spec(32)], 20), LIMITS)
    assert full.quiet_decode_block_sizes() == (16,)
    assert hybrid.quiet_decode_block_sizes() is None


@settings(max_examples=15, deadline=None)
@given(trace=traces(), router=st.sampled_from(["round_robin", "kv_cost", "precise_prefix", "exact"]))
def test_fleets_are_the_same_with_quiet_decode(trace: list[TraceRequest], router: str) -> None:
    config = make_config([full_spec(16)], 30)
    runs = []
    for quiet in (True, False):
        settings_ = FleetSettings(
            num_instances=3,
            router=router,
            max_num_batched_tokens=64,
            max_num_seqs=4,
            per_request=True,
            quiet_decode=quiet,
        )
        runs.append(run_fleet(trace, config, LIMITS, settings_))
    fast, slow = runs
    assert (fast.total, fast.instances, fast.requests) == (slow.total, slow.instances, slow.requests)
