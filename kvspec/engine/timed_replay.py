"""Timed replay: a trace's requests arrive at their timestamps and run through a continuous-batching
scheduler (chunked prefill, decode, preemption by recompute) on a simulated clock.

What the pure cache replay leaves out: requests overlap, so running requests hold blocks that the cache
cannot keep, a preempted request recomputes its prompt (and looks its prefix up again), and a prefix is hit
only if it is still cached when the request is admitted, which depends on how long requests wait.

The clock advances by a stated step-time model (:class:`StepTimeModel`, milliseconds): a fixed cost per
step, a cost per token the step computes (prefill and decode alike) and a cost per request in the batch.
Its defaults are illustrative (an 8B model on one recent GPU, order of magnitude), not a calibration: pass
your own. Decode generates one token per step per running request; generated tokens are distinct per
request (they are hashed and cached as vLLM caches decode blocks). No model runs: only the KV cache.

Figures: prefix hits counted at every admission (a preempted request's readmission too, as vLLM's prefix
cache stats count it), time to first token and end-to-end latency per request (arrival to the step that
produces the token), preemptions, steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from kvspec.coordinator import KVCacheCoordinator
from kvspec.engine.instance import EngineInstance, TimedReplayStats
from kvspec.engine.replay import TraceClock, trace_request
from kvspec.engine.step_time import DynoSimStepTime, StepBatch, StepTime, StepTimeModel
from kvspec.engine.traces import TraceRequest
from kvspec.tiers.settings import TierSettings


def replay_timed(
    requests: Iterable[TraceRequest],
    coordinator: KVCacheCoordinator,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    step_time: StepTime | None = None,
    clock: TraceClock | None = None,
    on_finish: Callable[[TraceRequest], None] | None = None,
    tiers: TierSettings | None = None,
) -> TimedReplayStats:
    """Replay ``requests`` at their arrival times (``arrival_ms``, non-decreasing order not required) through
    kvspec's FCFS scheduler over ``coordinator`` (prefix caching on, holding no request); returns the
    figures. ``clock`` (the coordinator's ``eviction_clock``) follows the simulated time in seconds.

    A request longer than ``max_model_len`` (prompt and output) is refused on arrival, one that does not fit
    the empty cache when its turn comes is refused then; both are counted. The coordinator holds no request
    afterwards. One :class:`~kvspec.engine.instance.EngineInstance`; arrivals at or before a step's start
    join that step.

    ``tiers``: offload tiers under the GPU cache (host memory, a pool; see kvspec.tiers): hits they give
    are loaded, not computed, and their transfer time is charged (``stats.tiers`` says what moved)."""
    from kvspec.engine.offload import build_connector

    instance = EngineInstance(
        coordinator,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        step_time=step_time,
        clock=clock,
        on_finish=on_finish,
        tiers=None if tiers is None else build_connector(coordinator, tiers),
    )
    hasher = coordinator.make_block_hasher(seed="kvspec-replay")
    pending = deque(sorted(requests, key=lambda r: r.arrival_ms))  # stable: trace order among equals
    while pending or instance.busy:
        now = instance.now_ms
        while pending and (pending[0].arrival_ms <= now or not instance.busy):
            item = pending.popleft()
            request = None if instance.refuses(item) else trace_request(item, hasher)
            instance.add(item, request, at_ms=item.arrival_ms)
            now = instance.now_ms
        if instance.busy:
            instance.step(pending[0].arrival_ms if pending else float("inf"))
    return instance.stats


__all__ = [
    "DynoSimStepTime",
    "StepBatch",
    "StepTime",
    "StepTimeModel",
    "TimedReplayStats",
    "replay_timed",
]
