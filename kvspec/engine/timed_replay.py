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

import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvspec.coordinator import KVCacheCoordinator
from kvspec.engine.replay import PromptAdmission, TraceClock, trace_request
from kvspec.engine.scheduler import Scheduler, SchedulerOutput
from kvspec.engine.traces import TraceRequest
from kvspec.errors import SchedulingError

#: Generated token ids: ``_GENERATED_BASE + (line * _OUTPUT_SPAN + i) % _GENERATED_RANGE`` for the i-th token
#: of the request on trace line ``line``: distinct across requests of any real trace, above every prompt
#: token Mooncake's hash ids give (their largest is under 10**8), and below 2**32 (token ids hash as uint32).
_GENERATED_BASE = 3_000_000_000
_GENERATED_RANGE = 1_000_000_000
_OUTPUT_SPAN = 65_536


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimeModel:
    """One step's duration in milliseconds: ``base_ms + per_token_ms * tokens + per_request_ms * requests``
    (tokens: computed this step, prefill and decode; requests: in the batch)."""

    base_ms: float = 6.0
    per_token_ms: float = 0.06
    per_request_ms: float = 0.01

    def __post_init__(self) -> None:
        for name in ("base_ms", "per_token_ms", "per_request_ms"):
            value = getattr(self, name)
            if not value >= 0:
                raise SchedulingError(f"StepTimeModel.{name} must be >= 0 (milliseconds), got {value!r}")
        if self.base_ms + self.per_token_ms + self.per_request_ms <= 0:
            raise SchedulingError("StepTimeModel: a step must take some time (all three costs are 0)")

    def step_ms(self, output: SchedulerOutput) -> float:
        return (
            self.base_ms + self.per_token_ms * output.num_tokens + self.per_request_ms * len(output.scheduled)
        )

    @classmethod
    def parse(cls, text: str) -> StepTimeModel:
        """``"BASE,PER_TOKEN,PER_REQUEST"`` in milliseconds (the CLI's ``--step-time``)."""
        parts = text.split(",")
        try:
            base, per_token, per_request = (float(p) for p in parts)
        except ValueError:
            raise SchedulingError(
                f"--step-time {text!r}: give three numbers in milliseconds, BASE,PER_TOKEN,PER_REQUEST "
                "(e.g. 6,0.06,0.01)"
            ) from None
        return cls(base_ms=base, per_token_ms=per_token, per_request_ms=per_request)


@dataclass(kw_only=True, slots=True)
class TimedReplayStats:
    """What a timed replay did. Tokens; times in milliseconds of simulated time."""

    requests: int = 0
    finished: int = 0
    refused: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    first_admission_hit_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    simulated_ms: float = 0.0
    ttft_ms: list[float] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)

    @property
    def token_hit_rate(self) -> float:
        """Hit tokens over prompt tokens looked up, readmissions included."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    @property
    def prompt_hit_rate(self) -> float:
        """Hit tokens at each request's first admission over every prompt token (the pure replay's figure)."""
        return self.first_admission_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def summary(self) -> dict[str, float | int]:
        def pct(values: list[float], q: float) -> float:
            if not values:
                return 0.0
            ordered = sorted(values)
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

        return {
            "requests": self.requests,
            "finished": self.finished,
            "refused": self.refused,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "token_hit_rate": round(self.token_hit_rate, 4),
            "prompt_hit_rate": round(self.prompt_hit_rate, 4),
            "preemptions": self.preemptions,
            "steps": self.steps,
            "simulated_seconds": round(self.simulated_ms / 1000, 3),
            "ttft_ms_median": round(statistics.median(self.ttft_ms), 1) if self.ttft_ms else 0.0,
            "ttft_ms_p99": pct(self.ttft_ms, 0.99),
            "e2e_ms_median": round(statistics.median(self.e2e_ms), 1) if self.e2e_ms else 0.0,
            "e2e_ms_p99": pct(self.e2e_ms, 0.99),
        }


def replay_timed(
    requests: Iterable[TraceRequest],
    coordinator: KVCacheCoordinator,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    step_time: StepTimeModel | None = None,
    clock: TraceClock | None = None,
    on_finish: Callable[[TraceRequest], None] | None = None,
) -> TimedReplayStats:
    """Replay ``requests`` at their arrival times (``arrival_ms``, non-decreasing order not required) through
    kvspec's FCFS scheduler over ``coordinator`` (prefix caching on, holding no request); returns the
    figures. ``clock`` (the coordinator's ``eviction_clock``) follows the simulated time in seconds.

    A request longer than ``max_model_len`` (prompt and output) is refused on arrival, one that does not fit
    the empty cache when its turn comes is refused then; both are counted. The coordinator holds no request afterwards."""
    model = StepTimeModel() if step_time is None else step_time
    if max_num_batched_tokens < coordinator.scheduler_block_size:
        raise SchedulingError(
            f"max_num_batched_tokens {max_num_batched_tokens} is below the scheduler block "
            f"({coordinator.scheduler_block_size} tokens)"
        )
    scheduler = Scheduler(
        coordinator, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs
    )
    hasher = coordinator.make_block_hasher(seed="kvspec-replay")
    admission = PromptAdmission(coordinator, chunk_tokens=max_num_batched_tokens)
    pending = deque(sorted(requests, key=lambda r: r.arrival_ms))  # stable: trace order among equals
    stats = TimedReplayStats()
    items: dict[str, TraceRequest] = {}
    generated: dict[str, int] = {}
    admitted_once: set[str] = set()
    now = 0.0
    while pending or scheduler.has_unfinished():
        while pending and pending[0].arrival_ms <= now:
            item = pending.popleft()
            stats.requests += 1
            stats.prompt_tokens += item.input_length
            if admission.refuses(item, output_tokens=max(1, item.output_length)):
                stats.refused += 1  # too long for the model or the whole cache: turned away on arrival
                continue
            request = trace_request(item, hasher)
            items[request.request_id] = item
            generated[request.request_id] = 0
            scheduler.add_request(request)
        if not scheduler.has_unfinished():
            now = pending[0].arrival_ms  # idle until the next arrival
            continue
        if clock is not None:
            clock.now = now / 1000.0
        output = scheduler.schedule()
        stats.preemptions += len(output.preempted)
        if not output.scheduled:
            # Nothing runs and the first waiting request does not fit the empty cache: an engine refuses it.
            refused = scheduler.waiting.popleft()
            coordinator.free(refused)
            stats.refused += 1
            continue
        stats.steps += 1
        now += model.step_ms(output)
        for scheduled in output.scheduled:
            request = scheduled.request
            rid = request.request_id
            if scheduled.resumed:  # an admission: its hit is num_computed
                query = request.num_tokens
                stats.query_tokens += query
                stats.hit_tokens += scheduled.num_computed
                if rid not in admitted_once:
                    admitted_once.add(rid)
                    stats.first_admission_hit_tokens += scheduled.num_computed
            request.num_computed_tokens = scheduled.num_computed + scheduled.num_new_tokens
            if request.num_computed_tokens < request.num_tokens:
                continue  # chunked prefill continues next step
            item = items[rid]
            count = generated[rid]
            if count == 0:
                stats.ttft_ms.append(now - item.arrival_ms)
            request.append_output_token_ids(
                _GENERATED_BASE + (item.line * _OUTPUT_SPAN + count) % _GENERATED_RANGE
            )
            generated[rid] = count + 1
            stats.generated_tokens += 1
            if count + 1 >= max(1, item.output_length):
                scheduler.finish(request)
                stats.finished += 1
                stats.e2e_ms.append(now - item.arrival_ms)
                if on_finish is not None:
                    on_finish(item)
    stats.simulated_ms = now
    return stats
