"""A fleet run's report, assembled in one place: the settings, the figures of the whole fleet and of each
instance (``TimedReplayStats.figures``, :mod:`kvspec.engine.stats`), and per request when asked. Units as
there: tokens, trace blocks, milliseconds of simulated time, bytes."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvspec.engine.instance import EngineInstance
from kvspec.engine.stats import TimedReplayStats, merge_stats
from kvspec.tiers.settings import TierSettings


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


def tier_settings(tiers: TierSettings | None, pool: object) -> dict[str, Any]:
    """The tier settings a report prints (empty without tiers); ``pool`` the shared pool built from them."""
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


def fleet_report(
    instances: Sequence[EngineInstance],
    refused_at_door: TimedReplayStats,
    *,
    settings: dict[str, Any],
    wall_seconds: float,
) -> FleetReport:
    """The report of a finished fleet run: the fleet's figures (every instance's stats and the requests
    refused at the door, merged) over the longest instance's simulated time, one row per instance, the
    balance of requests and prompt tokens across instances (max over mean; 1.0 when nothing ran), and the
    per-request rows the instances recorded, in trace order."""
    total = merge_stats([*(i.stats for i in instances), refused_at_door])
    seconds = total.simulated_ms / 1000.0
    rows = [{"instance": instance.index, **instance.stats.figures(seconds)} for instance in instances]
    summary = total.figures(seconds)
    summary["refused_at_door"] = refused_at_door.refused
    summary["simulated_seconds"] = round(seconds, 3)
    summary["load_imbalance"] = _imbalance([row["requests"] for row in rows])
    summary["prompt_token_imbalance"] = _imbalance([row["prompt_tokens"] for row in rows])
    return FleetReport(
        settings=settings,
        total=summary,
        instances=rows,
        wall_seconds=round(wall_seconds, 3),
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


def _imbalance(values: list[int]) -> float:
    return round(max(values) / statistics.fmean(values), 3) if any(values) else 1.0


__all__ = ["FleetReport", "fleet_report", "tier_settings"]
