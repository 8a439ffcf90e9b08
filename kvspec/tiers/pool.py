"""A pool of KV blocks shared by a fleet's instances: Mooncake Store's rules.

Every instance of a fleet offers the blocks it computes (``prepare_store``: a Put of each key the pool
lacks; a key already held is only touched) and looks up and loads from the one pool. Mooncake Store evicts
by approximate LRU in batches: when a Put would leave the pool above its high-water mark
(``high_watermark`` of the capacity, 0.9 by default: Mooncake's ``-eviction_high_watermark_ratio``) or
cannot fit, it evicts ``eviction_ratio`` of the capacity (0.05: ``-eviction_ratio``), or what the Put needs
if more, taking the least recently used idle objects first (an object is used when it is put, loaded or
re-offered); objects pinned by a load in flight or not yet completed (Mooncake's leases and unfinished
Puts) are skipped. A Put that cannot be made room for is refused whole.

Per-request access order plays no part here (unlike the host tier's LRU): the pool sees Puts and Gets from
many engines, in time order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Final

from mypy_extensions import mypyc_attr

from kvspec.errors import TierConfigError, TierStateError
from kvspec.tiers.base import MEDIUM_CPU, LookupResult, OffloadKey, StorePlan, TierEvent, TierRequest

#: Mooncake Store's defaults.
HIGH_WATERMARK: Final = 0.9
EVICTION_RATIO: Final = 0.05


@mypyc_attr(allow_interpreted_subclasses=True)  # plugins may extend it in plain Python (compiled build)
class SharedPool:
    """Mooncake Store as a tier shared by instances (see the module docstring); ``medium`` "CPU" (pooled
    DRAM), reported by the engine as the pool tier."""

    def __init__(
        self,
        capacity_blocks: int,
        *,
        high_watermark: float = HIGH_WATERMARK,
        eviction_ratio: float = EVICTION_RATIO,
        medium: str = MEDIUM_CPU,
        events: bool = True,
    ) -> None:
        if type(capacity_blocks) is not int or capacity_blocks < 1:
            raise TierConfigError(
                f"A shared pool needs a capacity of at least one block, got {capacity_blocks!r}."
            )
        if not 0.0 < high_watermark <= 1.0:
            raise TierConfigError(f"high_watermark must be in (0, 1], got {high_watermark!r}.")
        if not 0.0 < eviction_ratio <= 1.0:
            raise TierConfigError(f"eviction_ratio must be in (0, 1], got {eviction_ratio!r}.")
        self.capacity_blocks: Final = capacity_blocks
        self._high = max(1, int(capacity_blocks * high_watermark))
        self._batch = max(1, int(capacity_blocks * eviction_ratio))
        #: The KV-event medium of its blocks and how many keys it can hold (fixed for its lifetime).
        self.medium: Final = medium
        #: key -> pins (-1: being written); least recently used first.
        self._objects: OrderedDict[OffloadKey, int] = OrderedDict()
        self._events: list[TierEvent] | None = [] if events else None
        #: Batch evictions run and objects they removed.
        self.evictions = 0
        self.evicted_blocks = 0

    @property
    def num_blocks(self) -> int:
        return len(self._objects)

    def lookup(self, key: OffloadKey, request: TierRequest, /) -> LookupResult:
        pins = self._objects.get(key)
        if pins is None:
            return LookupResult.MISS
        return LookupResult.HIT if pins >= 0 else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Collection[OffloadKey], request: TierRequest, /) -> None:
        objects = self._objects
        for key in keys:
            pins = objects.get(key)
            if pins is None or pins < 0:
                raise TierStateError(
                    f"prepare_load of key {key.hex()} that the shared pool does not hold ready."
                )
        for key in keys:
            objects[key] += 1
            objects.move_to_end(key)

    def complete_load(self, keys: Collection[OffloadKey], request: TierRequest, /) -> None:
        objects = self._objects
        for key in keys:
            pins = objects.get(key)
            if pins is None or pins <= 0:
                raise TierStateError(f"complete_load of key {key.hex()} that no prepare_load pinned.")
            objects[key] = pins - 1

    def _evict(self, want: int, need: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        """Up to ``want`` idle, unprotected objects, least recently used first; None (nothing removed) if
        fewer than ``need`` can go."""
        victims: list[OffloadKey] = []
        for key, pins in self._objects.items():
            if len(victims) == want:
                break
            if pins == 0 and key not in protected:
                victims.append(key)
        if len(victims) < need:
            return None
        for key in victims:
            del self._objects[key]
        if victims:
            self.evictions += 1
            self.evicted_blocks += len(victims)
        return victims

    def prepare_store(self, keys: Sequence[OffloadKey], request: TierRequest, /) -> StorePlan | None:
        objects = self._objects
        new = []
        for key in keys:
            if key in objects:
                objects.move_to_end(key)
            else:
                new.append(key)
        new = list(dict.fromkeys(new))
        if not new:
            return StorePlan(keys_to_store=(), evicted_keys=())
        after = len(objects) + len(new)
        evicted: list[OffloadKey] = []
        if after > self._high or after > self.capacity_blocks:
            need = max(after - self.capacity_blocks, 0)
            want = max(need, self._batch) if after > self._high else need
            victims = self._evict(want, need, set(keys))
            if victims is None:
                return None
            evicted = victims
            if evicted and self._events is not None:
                self._events.append(TierEvent(keys=tuple(evicted), medium=self.medium, removed=True))
        for key in new:
            objects[key] = -1
        return StorePlan(keys_to_store=tuple(new), evicted_keys=tuple(evicted))

    def complete_store(
        self, keys: Collection[OffloadKey], request: TierRequest, /, success: bool = True
    ) -> None:
        objects = self._objects
        done = []
        for key in keys:
            if objects.get(key) != -1:
                continue
            if success:
                objects[key] = 0
            else:
                del objects[key]
            done.append(key)
        if done and self._events is not None:
            self._events.append(
                TierEvent(
                    keys=tuple(done), medium=self.medium, removed=not success, metadata_only=not success
                )
            )

    def on_request_finished(self, request: TierRequest, /) -> None:
        return

    def take_events(self) -> list[TierEvent]:
        if self._events is None:
            return []
        events, self._events = self._events, []
        return events

    def reset(self) -> None:
        self._objects.clear()


__all__ = ["EVICTION_RATIO", "HIGH_WATERMARK", "SharedPool"]
