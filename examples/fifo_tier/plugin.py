"""A tier plugin: host memory that evicts in arrival order (FIFO), the simplest tier an engine can run.

Register it, check it with the kit, and run it as the host tier (``TierSettings(host_tier="example.fifo")``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from kvspec.errors import TierStateError
from kvspec.tiers import LookupResult, StorePlan, TierContext, TierEvent, TierRequest, register_tier


class FifoTier:
    """Keys in arrival order; each maps to its pins (-1 while its store is in flight)."""

    medium = "CPU"

    def __init__(self, context: TierContext) -> None:
        self.capacity_blocks = context.capacity_blocks
        self._held: OrderedDict[bytes, int] = OrderedDict()
        self._events: list[TierEvent] = []

    @property
    def num_blocks(self) -> int:
        return len(self._held)

    def lookup(self, key: bytes, request: TierRequest) -> LookupResult:
        pins = self._held.get(key)
        return (
            LookupResult.MISS if pins is None else LookupResult.HIT if pins >= 0 else LookupResult.HIT_PENDING
        )

    def prepare_load(self, keys: Collection[bytes], request: TierRequest) -> None:
        if any(self._held.get(k, -1) < 0 for k in keys):
            raise TierStateError("prepare_load of a key the FIFO tier does not hold ready")
        for key in keys:
            self._held[key] += 1

    def complete_load(self, keys: Collection[bytes], request: TierRequest) -> None:
        for key in keys:
            self._held[key] -= 1

    def prepare_store(self, keys: Sequence[bytes], request: TierRequest) -> StorePlan | None:
        new = [k for k in dict.fromkeys(keys) if k not in self._held]
        short = len(self._held) + len(new) - self.capacity_blocks
        victims = [k for k, pins in self._held.items() if pins == 0 and k not in keys][: max(short, 0)]
        if len(victims) < short:
            return None
        for key in victims:
            del self._held[key]
        if victims:
            self._events.append(TierEvent(keys=tuple(victims), medium=self.medium, removed=True))
        self._held.update((k, -1) for k in new)
        return StorePlan(keys_to_store=tuple(new), evicted_keys=tuple(victims))

    def complete_store(self, keys: Collection[bytes], request: TierRequest, success: bool = True) -> None:
        done = tuple(k for k in keys if self._held.get(k) == -1)
        for key in done:
            if success:
                self._held[key] = 0
            else:
                del self._held[key]
        if done:
            self._events.append(
                TierEvent(keys=done, medium=self.medium, removed=not success, metadata_only=not success)
            )

    def on_request_finished(self, request: TierRequest) -> None:
        return

    def take_events(self) -> list[TierEvent]:
        events, self._events = self._events, []
        return events

    def reset(self) -> None:
        self._held.clear()


def register() -> None:
    register_tier("example.fifo", FifoTier, description="host memory, first in first out")
