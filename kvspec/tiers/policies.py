"""The host tier's cache policies: which resident block to evict, as vLLM 0.34's CPU offloading orders them.

A policy holds the resident keys and their :class:`Chunk` (reference count: -1 while being written, 0 idle,
>0 pinned by loads) and decides evictions; the tier (:class:`kvspec.tiers.host.HostTier`) owns reference
counts, admission and events. Built in:

- ``lru``: recency by request. A request's first access to a resident key gives it the rank
  ``(request's rank, -end position)``, so within a request tails rank below heads; when the request
  finishes its keys are re-ranked tail to head with fresh ranks, so its head is the most recent. A store
  without a position takes a fresh rank. Eviction takes the lowest ``(rank, key)`` among idle keys.
- ``arc``: Adaptive Replacement Cache. New keys enter T1; a finished request's reused keys move from T1 to T2
  (or to T2's recent end); its stored-only keys keep their list and move to its recent end. Eviction takes
  from T1 while T1 holds at least ``target`` keys, else from T2 (else T1); evicted keys become ghosts (B1,
  B2, each at most the capacity); a store of a ghost moves the target (B1: up by max(1, |B2|/|B1|), B2:
  down by max(1, |B1|/|B2|)), once per key per request.

Both refuse (return None, changing nothing) an eviction they cannot complete with idle, unprotected keys.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from mypy_extensions import mypyc_attr

from kvspec.tiers.base import OffloadKey, TierRequest


class Chunk:
    """One resident block's slot: ``ref_cnt`` -1 while its store is in flight, else the loads pinning it;
    ``chunk_id``: its slot in the tier's memory."""

    __slots__ = ("chunk_id", "ref_cnt")

    def __init__(self, chunk_id: int) -> None:
        self.chunk_id = chunk_id
        self.ref_cnt = -1

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


class CachePolicy(Protocol):
    """What a host-tier cache policy implements (see the module docstring)."""

    def get(self, key: OffloadKey) -> Chunk | None: ...

    def insert(self, key: OffloadKey, chunk: Chunk, request: TierRequest) -> None: ...

    def remove(self, key: OffloadKey) -> None: ...

    def on_store_miss(self, keys: Sequence[OffloadKey], request: TierRequest) -> None: ...

    def on_request_access(self, keys: Sequence[OffloadKey], request: TierRequest) -> None: ...

    def on_request_finished(
        self,
        ordered_keys: Sequence[OffloadKey],
        inserted_only: set[OffloadKey],
        reused: set[OffloadKey],
        request: TierRequest,
    ) -> None: ...

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, Chunk]] | None: ...

    def clear(self) -> None: ...

    def mark_evictable(self, key: OffloadKey) -> None: ...

    def mark_non_evictable(self, key: OffloadKey) -> None: ...


class _Rank:
    """The LRU's per-request rank, kept in the request's state slot (one per policy and generation)."""

    __slots__ = ("generation", "owner", "rank")

    def __init__(self, owner: object, generation: int, rank: int) -> None:
        self.owner = owner
        self.generation = generation
        self.rank = rank


#: Ranks are one int, ``rank << 32 | (_TOP - position)``: ordered as vLLM's ``(rank, -position)`` tuples
#: (positions are token counts below 2**32), compared in one integer comparison.
_TOP = (1 << 32) - 1


@mypyc_attr(allow_interpreted_subclasses=True)  # plugins may extend it in plain Python (compiled build)
class LRUPolicy:
    """Least recently used, by request (see the module docstring). Idle keys sit in a heap of
    ``(rank, key)`` entries (``rank`` encodes vLLM's ``(rank, -position)``); an entry is stale once its key
    is pinned, re-ranked or gone."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._chunks: dict[OffloadKey, Chunk] = {}
        self._ranks: dict[OffloadKey, int] = {}
        self._idle: set[OffloadKey] = set()
        self._heap: list[tuple[int, OffloadKey]] = []
        self._next = 0
        self._generation = 0

    def _request_rank(self, request: TierRequest) -> int:
        state = request.get_state(_Rank)
        if state is None or state.owner is not self or state.generation != self._generation:
            self._next += 1
            state = _Rank(self, self._generation, self._next)
            request.set_state(state)
        return state.rank

    def _fresh(self) -> int:
        """The next rank, as vLLM's ``(next, 0)``: after every rank given so far."""
        self._next += 1
        return self._next << 32 | _TOP

    def _push(self, key: OffloadKey) -> None:
        heapq.heappush(self._heap, (self._ranks[key], key))

    def _compact(self) -> None:
        """Drop stale entries once they outnumber the live ones."""
        if len(self._heap) > max(64, 2 * len(self._idle)):
            ranks = self._ranks
            self._heap = [(ranks[k], k) for k in self._idle]
            heapq.heapify(self._heap)

    def get(self, key: OffloadKey) -> Chunk | None:
        return self._chunks.get(key)

    def insert(self, key: OffloadKey, chunk: Chunk, request: TierRequest) -> None:
        self._chunks[key] = chunk
        position = request.position(key)
        if position is None:
            self._ranks[key] = self._fresh()
        else:
            self._ranks[key] = self._request_rank(request) << 32 | (_TOP - position)
        if chunk.ref_cnt == 0:
            self._idle.add(key)
            self._push(key)
            self._compact()

    def remove(self, key: OffloadKey) -> None:
        del self._chunks[key]
        self._ranks.pop(key, None)
        self._idle.discard(key)

    def on_store_miss(self, keys: Sequence[OffloadKey], request: TierRequest) -> None:
        return

    def on_request_access(self, keys: Sequence[OffloadKey], request: TierRequest) -> None:
        rank = self._request_rank(request) << 32
        ranks = self._ranks
        chunks = self._chunks
        idle = self._idle
        pushed = False
        for key in keys:
            position = request.position(key)
            if position is None or key not in chunks:
                continue
            new = rank | (_TOP - position)
            if ranks[key] >= new:
                continue  # a later position of this request already ranks it
            ranks[key] = new
            if key in idle:
                heapq.heappush(self._heap, (new, key))
                pushed = True
        if pushed:
            self._compact()

    def on_request_finished(
        self,
        ordered_keys: Sequence[OffloadKey],
        inserted_only: set[OffloadKey],
        reused: set[OffloadKey],
        request: TierRequest,
    ) -> None:
        ranks = self._ranks
        chunks = self._chunks
        idle = self._idle
        updated = []
        for key in reversed(ordered_keys):  # tail first: the head ends the most recent
            if key not in chunks:
                continue
            self._next += 1
            rank = self._next << 32 | _TOP
            ranks[key] = rank
            if key in idle:
                updated.append((rank, key))
        if not updated:
            return
        if len(updated) >= max(64, len(idle) // 4):
            # Rebuilding is linear: cheaper than many pushes (vLLM rebuilds at the same point).
            self._heap = [(ranks[k], k) for k in idle]
            heapq.heapify(self._heap)
        else:
            heap = self._heap
            for entry in updated:
                heapq.heappush(heap, entry)
            self._compact()

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, Chunk]] | None:
        if n == 0:
            return []
        chosen: list[tuple[int, OffloadKey]] = []
        chosen_keys: set[OffloadKey] = set()
        kept: list[tuple[int, OffloadKey]] = []
        heap = self._heap
        idle = self._idle
        ranks = self._ranks
        while heap and len(chosen) < n:
            entry = heapq.heappop(heap)
            rank, key = entry
            if key not in idle or ranks.get(key) != rank or key in chosen_keys:
                continue  # stale: pinned, re-ranked, gone, or a duplicate of a chosen entry
            if key in protected:
                kept.append(entry)
                continue
            chosen.append(entry)
            chosen_keys.add(key)
        for entry in kept:
            heapq.heappush(heap, entry)
        if len(chosen) < n:
            for entry in chosen:
                heapq.heappush(heap, entry)
            return None
        evicted = []
        for _, key in chosen:
            idle.remove(key)
            del ranks[key]
            evicted.append((key, self._chunks.pop(key)))
        self._compact()
        return evicted

    def clear(self) -> None:
        self._chunks.clear()
        self._ranks.clear()
        self._idle.clear()
        self._heap.clear()
        self._next = 0
        self._generation += 1

    def mark_evictable(self, key: OffloadKey) -> None:
        self._idle.add(key)
        self._push(key)
        self._compact()

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._idle.remove(key)


@mypyc_attr(allow_interpreted_subclasses=True)  # plugins may extend it in plain Python (compiled build)
class ARCPolicy:
    """Adaptive Replacement Cache (see the module docstring): T1 (seen once), T2 (reused), ghosts B1 and
    B2, and the adaptive target size of T1."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target = 0.0
        self.t1: OrderedDict[OffloadKey, Chunk] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, Chunk] = OrderedDict()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    def get(self, key: OffloadKey) -> Chunk | None:
        found = self.t1.get(key)
        return found if found is not None else self.t2.get(key)

    def insert(self, key: OffloadKey, chunk: Chunk, request: TierRequest) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: OffloadKey) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def on_store_miss(self, keys: Sequence[OffloadKey], request: TierRequest) -> None:
        for key in reversed(keys):
            if key in self.b1:
                self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(key)

    def on_request_access(self, keys: Sequence[OffloadKey], request: TierRequest) -> None:
        return

    def on_request_finished(
        self,
        ordered_keys: Sequence[OffloadKey],
        inserted_only: set[OffloadKey],
        reused: set[OffloadKey],
        request: TierRequest,
    ) -> None:
        for key in reversed(ordered_keys):
            if key in inserted_only:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in reused:
                if key in self.t1:
                    self.t2[key] = self.t1.pop(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, Chunk]] | None:
        if n == 0:
            return []
        t1_left = len(self.t1)
        t1 = iter(self.t1.items())
        t2 = iter(self.t2.items())

        def idle(entries: Iterator[tuple[OffloadKey, Chunk]]) -> tuple[OffloadKey, Chunk] | None:
            for key, chunk in entries:
                if chunk.ref_cnt == 0 and key not in protected:
                    return key, chunk
            return None

        picked: list[tuple[OffloadKey, Chunk, bool]] = []
        for _ in range(n):
            found: tuple[OffloadKey, Chunk] | None = None
            from_t1 = False
            if t1_left >= int(self.target):
                found = idle(t1)
                from_t1 = found is not None
            if found is None:
                found = idle(t2)
            if found is None:
                found = idle(t1)
                from_t1 = True
                if found is None:
                    return None
            if from_t1:
                t1_left -= 1
            picked.append((found[0], found[1], from_t1))
        evicted = []
        for key, chunk, from_t1 in picked:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            evicted.append((key, chunk))
        for ghosts in (self.b1, self.b2):
            for _ in range(len(ghosts) - self.capacity):
                ghosts.popitem(last=False)
        return evicted

    def clear(self) -> None:
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.target = 0.0

    def mark_evictable(self, key: OffloadKey) -> None:
        return

    def mark_non_evictable(self, key: OffloadKey) -> None:
        return


#: The built-in policies by name: a factory from the capacity in blocks.
CACHE_POLICIES: dict[str, Callable[[int], CachePolicy]] = {"lru": LRUPolicy, "arc": ARCPolicy}


def order_by_position(keys: Iterable[OffloadKey], request: TierRequest) -> list[OffloadKey]:
    """``keys`` head to tail by end position when every key has one, else as given (vLLM's
    ``order_request_keys``)."""
    ordered = list(keys)
    positions = {k: p for k in ordered if (p := request.position(k)) is not None}
    if len(positions) == len(ordered):
        ordered.sort(key=positions.__getitem__)
    return ordered


__all__ = ["ARCPolicy", "CACHE_POLICIES", "CachePolicy", "Chunk", "LRUPolicy", "order_by_position"]
