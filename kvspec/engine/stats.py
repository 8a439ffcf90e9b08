"""The figures of a timed replay, computed in one place: what one instance did (:class:`TimedReplayStats`:
raw counts, per-request times, tier counters) and every figure derived from them (hit and reuse ratios, latency
percentiles, throughput, reuse per tier), for the one-instance replay's summary and the fleet's report alike.
Units: tokens; trace blocks; milliseconds of simulated time; bytes."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvspec.tiers.connector import TierStats


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank rule (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_figures(values: list[float], name: str) -> dict[str, float]:
    """Mean and nearest-rank p50/p90/p99 of ``values`` (ms, one decimal), keyed ``{name}_mean`` and so on."""
    return {
        f"{name}_mean": round(statistics.fmean(values), 1) if values else 0.0,
        f"{name}_p50": round(percentile(values, 0.5), 1),
        f"{name}_p90": round(percentile(values, 0.9), 1),
        f"{name}_p99": round(percentile(values, 0.99), 1),
    }


@dataclass(kw_only=True, slots=True)
class TimedReplayStats:
    """What a timed replay (of one instance) did. Tokens; trace blocks; times in milliseconds of simulated
    time. ``queue_ms``: per request, arrival to its first admission (the step that starts its prompt)."""

    requests: int = 0
    finished: int = 0
    refused: int = 0
    prompt_tokens: int = 0
    prompt_blocks: int = 0
    generated_tokens: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    first_admission_hit_tokens: int = 0
    first_admission_hit_blocks: int = 0
    preemptions: int = 0
    steps: int = 0
    simulated_ms: float = 0.0
    ttft_ms: list[float] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)
    queue_ms: list[float] = field(default_factory=list)
    #: With ``per_group`` (a hybrid): per KV-cache group, the tokens its own search found at each request's
    #: first admission, and the requests whose hit it limited (see ``kvspec.engine.replay.count_group_hits``).
    group_hit_tokens: list[int] = field(default_factory=list)
    group_limited_requests: list[int] = field(default_factory=list)
    #: Per finished request (only when the instance records them): trace line, first admission's hit
    #: tokens, queueing, TTFT and end-to-end ms, in finishing order.
    per_request: list[tuple[int, int, float, float, float]] = field(default_factory=list)
    #: What the offload tiers gave and moved (None without tiers). Their hits are part of ``hit_tokens``
    #: and ``first_admission_hit_tokens`` (tokens a request did not compute); the GPU's share is the rest.
    tiers: TierStats | None = None

    @property
    def token_hit_rate(self) -> float:
        """Hit tokens over prompt tokens looked up, readmissions included."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    @property
    def prompt_hit_rate(self) -> float:
        """Hit tokens at each request's first admission over every prompt token (the pure replay's figure)."""
        return self.first_admission_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        """Trace blocks a first admission's hit reaches into over every prompt's trace blocks."""
        return self.first_admission_hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    @property
    def gpu_first_hit_tokens(self) -> int:
        """First-admission hit tokens the GPU cache gave (the rest came from tiers)."""
        tiers = 0 if self.tiers is None else sum(self.tiers.first_hit_tokens.values())
        return self.first_admission_hit_tokens - tiers

    def tier_figures(self) -> dict[str, float | int]:
        """Reuse per tier at first admissions (GPU, then each tier: tokens and share of prompt tokens), the
        bytes each tier loaded and stored, the blocks it evicted, and the load time charged; empty without
        tiers."""
        tiers = self.tiers
        if tiers is None:
            return {}
        prompt = self.prompt_tokens or 1
        gpu = self.gpu_first_hit_tokens
        row: dict[str, float | int] = {"gpu_reused_tokens": gpu, "gpu_reuse_ratio": round(gpu / prompt, 4)}
        for name in sorted(set(tiers.first_hit_tokens) | set(tiers.stored_blocks) | set(tiers.loaded_blocks)):
            tokens = tiers.first_hit_tokens.get(name, 0)
            row[f"{name}_reused_tokens"] = tokens
            row[f"{name}_reuse_ratio"] = round(tokens / prompt, 4)
            row[f"{name}_loaded_bytes"] = tiers.loaded_bytes.get(name, 0)
            row[f"{name}_stored_bytes"] = tiers.stored_bytes.get(name, 0)
            row[f"{name}_evicted_blocks"] = tiers.evicted_blocks.get(name, 0)
        row["load_ms_total"] = round(tiers.load_ms, 1)
        return row

    def figures(self, seconds: float) -> dict[str, Any]:
        """The fleet's figures of these stats over ``seconds`` of simulated time: counts, reuse ratios,
        latency percentiles (ms), throughput (tokens/s) and, with tiers, reuse per tier."""
        return {
            "requests": self.requests,
            "finished": self.finished,
            "refused": self.refused,
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.first_admission_hit_tokens,
            "reuse_ratio": round(self.prompt_hit_rate, 4),
            "prompt_blocks": self.prompt_blocks,
            "reused_blocks": self.first_admission_hit_blocks,
            "block_reuse_ratio": round(self.block_hit_rate, 4),
            "generated_tokens": self.generated_tokens,
            "preemptions": self.preemptions,
            "steps": self.steps,
            **latency_figures(self.ttft_ms, "ttft_ms"),
            **latency_figures(self.e2e_ms, "e2e_ms"),
            **latency_figures(self.queue_ms, "queue_ms"),
            "output_tokens_per_s": round(self.generated_tokens / seconds, 1) if seconds else 0.0,
            "total_tokens_per_s": round((self.prompt_tokens + self.generated_tokens) / seconds, 1)
            if seconds
            else 0.0,
            **self.tier_figures(),
            **self.group_figures(),
        }

    def group_figures(self) -> dict[str, Any]:
        """Per group (when counted): each group's own reuse ratio at first admission, the requests it
        limited, the groups that limited the most; empty when not counted."""
        return per_group_figures(
            self.group_hit_tokens, self.group_limited_requests, self.prompt_tokens, "group_reuse_ratios"
        )

    def summary(self) -> dict[str, float | int]:
        """The one-instance replay's summary (``kvspec replay-trace``): counts, hit rates, median and p99
        latencies, and with tiers the reuse per tier."""
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
            "ttft_ms_p99": round(percentile(self.ttft_ms, 0.99), 1),
            "e2e_ms_median": round(statistics.median(self.e2e_ms), 1) if self.e2e_ms else 0.0,
            "e2e_ms_p99": round(percentile(self.e2e_ms, 0.99), 1),
            **self.tier_figures(),
        }


def limiting_groups(limited: Sequence[int]) -> tuple[int, ...]:
    """The groups that limited the most hits, from each group's count of limited requests (several when they
    limited the same requests, as the layers of one kind split into groups do); empty when none did."""
    most = max(limited, default=0)
    return tuple(g for g, n in enumerate(limited) if n == most) if most else ()


def per_group_figures(
    hit_tokens: Sequence[int], limited: Sequence[int], prompt_tokens: int, rate_name: str
) -> dict[str, Any]:
    """A per-group count's figures (empty when not counted): each group's own hit tokens over the prompt
    tokens under ``rate_name``, the requests each limited, and the :func:`limiting_groups`. The pure replay
    and the timed one name the rate differently (a hit rate, a reuse ratio at first admission)."""
    if not hit_tokens:
        return {}
    return {
        rate_name: [round(t / prompt_tokens, 4) if prompt_tokens else 0.0 for t in hit_tokens],
        "group_limited_requests": list(limited),
        "limiting_groups": list(limiting_groups(limited)),
    }


#: The per-group counts: lists summed element by element when instances merge, not joined.
_PER_GROUP = frozenset({"group_hit_tokens", "group_limited_requests"})


def merge_stats(parts: Sequence[TimedReplayStats]) -> TimedReplayStats:
    """The stats of several instances as one: counts and lists summed, the simulated time the longest."""
    total = TimedReplayStats()
    tiers = [part.tiers for part in parts if part.tiers is not None]
    if tiers:
        total.tiers = TierStats.merged(tiers)
    for part in parts:
        for f in dataclasses.fields(TimedReplayStats):
            value = getattr(part, f.name)
            if f.name == "tiers":
                continue
            if f.name in _PER_GROUP:  # one count per group: summed group by group
                summed = getattr(total, f.name)
                summed.extend([0] * (len(value) - len(summed)))
                for g, count in enumerate(value):
                    summed[g] += count
            elif isinstance(value, list):
                getattr(total, f.name).extend(value)
            elif f.name == "simulated_ms":
                total.simulated_ms = max(total.simulated_ms, value)
            else:
                setattr(total, f.name, getattr(total, f.name) + value)
    return total


__all__ = [
    "TimedReplayStats",
    "latency_figures",
    "limiting_groups",
    "merge_stats",
    "per_group_figures",
    "percentile",
]
