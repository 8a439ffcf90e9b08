"""Block residency metrics: how long sampled blocks live, sit idle, and how often they are reused.

A ``BlockPool`` given a collector (``BlockPool.metrics_collector``) reports three moments per block:
allocated (taken from the free queue for new content), accessed (a prefix hit takes a reference) and
evicted (its content is dropped: the block is reallocated or explicitly evicted). A sampled block's
residency runs from allocation to eviction; its sample is the lifetime, the idle time since the last
access (or since allocation) and the gaps between its last few accesses. Times are ``time.monotonic_ns``
(nanoseconds) inside, seconds in the samples. The names are vLLM 0.23's (``KVCacheMetricsCollector``,
``BlockMetricsState``), so a vLLM scheduler's collector and kvspec's are interchangeable on either pool.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol, cast

from kvspec.errors import UnsupportedConfigurationError

__all__ = [
    "ACCESS_HISTORY",
    "BlockMetricsObserver",
    "BlockMetricsState",
    "KVCacheEvictionEvent",
    "KVCacheMetricsCollector",
]

#: Accesses remembered per block (the reuse gaps of a sample come from these).
ACCESS_HISTORY = 4
_NS = 1_000_000_000


class _HasBlockId(Protocol):
    @property
    def block_id(self) -> int: ...


class BlockMetricsObserver(Protocol):
    """What a ``BlockPool`` calls when it has a ``metrics_collector``."""

    def on_block_allocated(self, block: _HasBlockId) -> None: ...

    def on_block_accessed(self, block: _HasBlockId) -> None: ...

    def on_block_evicted(self, block: _HasBlockId) -> None: ...

    def reset(self) -> None: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class KVCacheEvictionEvent:
    """One sampled block's residency, reported when its content was evicted (seconds)."""

    lifetime_seconds: float
    idle_seconds: float
    reuse_gaps_seconds: tuple[float, ...]


class BlockMetricsState:
    """One sampled block since its allocation: birth and last access (ns), the last accesses (ns)."""

    __slots__ = ("access_history", "birth_time_ns", "last_access_ns")

    def __init__(self) -> None:
        now = time.monotonic_ns()
        self.birth_time_ns = now
        self.last_access_ns = now
        self.access_history: deque[int] = deque(maxlen=ACCESS_HISTORY)

    def record_access(self) -> None:
        now = time.monotonic_ns()
        self.last_access_ns = now
        self.access_history.append(now)

    def get_lifetime_seconds(self) -> float:
        return (time.monotonic_ns() - self.birth_time_ns) / _NS

    def get_idle_time_seconds(self) -> float:
        return (time.monotonic_ns() - self.last_access_ns) / _NS

    def get_reuse_gaps_seconds(self) -> list[float]:
        """Gaps between consecutive remembered accesses (at most ACCESS_HISTORY - 1)."""
        h = list(self.access_history)
        return [(b - a) / _NS for a, b in itertools.pairwise(h)]


class KVCacheMetricsCollector:
    """Samples a fraction ``sample_rate`` (0 < rate <= 1) of allocations and reports their residency."""

    def __init__(self, sample_rate: float = 0.01) -> None:
        rate = cast(object, sample_rate)  # checked as given: a bool or a string is refused too
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise UnsupportedConfigurationError(
                f"KVCacheMetricsCollector.sample_rate must be in (0, 1] (a fraction of allocations), "
                f"got {sample_rate!r}."
            )
        self.sample_rate = float(sample_rate)
        self.block_metrics: dict[int, BlockMetricsState] = {}
        self._events: list[KVCacheEvictionEvent] = []

    def should_sample_block(self) -> bool:
        return self.sample_rate >= 1.0 or random.random() < self.sample_rate

    def on_block_allocated(self, block: _HasBlockId) -> None:
        if self.should_sample_block():
            self.block_metrics[block.block_id] = BlockMetricsState()

    def on_block_accessed(self, block: _HasBlockId) -> None:
        state = self.block_metrics.get(block.block_id)
        if state is not None:
            state.record_access()

    def on_block_evicted(self, block: _HasBlockId) -> None:
        state = self.block_metrics.pop(block.block_id, None)
        if state is not None:
            self._events.append(
                KVCacheEvictionEvent(
                    lifetime_seconds=state.get_lifetime_seconds(),
                    idle_seconds=state.get_idle_time_seconds(),
                    reuse_gaps_seconds=tuple(state.get_reuse_gaps_seconds()),
                )
            )

    def reset(self) -> None:
        """Forget every tracked block (the prefix cache was reset); samples already taken stay."""
        self.block_metrics.clear()

    def drain_events(self) -> list[KVCacheEvictionEvent]:
        events, self._events = self._events, []
        return events
