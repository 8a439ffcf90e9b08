"""The per-instance host-memory tier: vLLM 0.34's CPU offloading manager, block for block.

``HostTier(capacity_blocks, policy="lru" | "arc", store_threshold=1)`` holds at most ``capacity_blocks``
keys (one group's block each; a byte capacity becomes blocks through :func:`kvspec.tiers.sizes`). Its rules,
those of vLLM's ``CPUOffloadingManager``:

- A store takes the offered keys the tier lacks. With ``store_threshold`` >= 2 a key is taken only once it
  has been offered that many times (by different requests: a request's re-offers count once), counted in
  a tracker of at most ``max_tracker_size`` keys that forgets the least recently offered first (never a
  key of the offer being counted).
- To make room it evicts, through the policy, idle keys that are not part of the offer. If it cannot free
  enough (too many pinned, being written, or offered) the store is refused (``None``) and nothing changes
  but the offer's counting.
- A taken key is not ready (``lookup`` says ``HIT_PENDING``) until ``complete_store``; a failed store
  releases it with a ``metadata_only`` removal event.
- Loads pin keys until ``complete_load``.
- Each request's first access to a key (a load, or an offer of a ready key or of a key it stores) is
  recorded for the policy; ``on_request_finished`` commits them, grouped by KV-cache group and ordered by
  end position.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from typing import Final

from mypy_extensions import mypyc_attr

from kvspec.errors import TierConfigError, TierStateError, UnknownTierError
from kvspec.tiers.base import (
    MEDIUM_CPU,
    LookupResult,
    OffloadKey,
    StorePlan,
    TierEvent,
    TierRequest,
    key_group,
)
from kvspec.tiers.policies import CACHE_POLICIES, CachePolicy, Chunk, order_by_position

#: vLLM 0.34's default size of the store-threshold tracker (keys).
MAX_TRACKER_SIZE: Final = 64_000


class _Access:
    """One request's accesses to one tier (vLLM's ``_RequestCacheAccess``)."""

    __slots__ = (
        "counted",
        "finished",
        "generation",
        "groups",
        "inserted",
        "owner",
        "reused",
        "seen",
        "store_miss",
    )

    def __init__(self, owner: object, generation: int) -> None:
        self.owner = owner
        self.generation = generation
        self.groups: dict[int, list[OffloadKey]] = {}
        self.seen: set[OffloadKey] = set()
        self.inserted: set[OffloadKey] = set()
        self.reused: set[OffloadKey] = set()
        self.store_miss: set[OffloadKey] = set()
        self.counted: set[OffloadKey] = set()
        self.finished = False


@mypyc_attr(allow_interpreted_subclasses=True)  # plugins may extend it in plain Python (compiled build)
class HostTier:
    """Host memory below one instance's GPU cache (see the module docstring). ``capacity_blocks`` >= 1."""

    def __init__(
        self,
        capacity_blocks: int,
        *,
        policy: str = "lru",
        store_threshold: int = 1,
        max_tracker_size: int = MAX_TRACKER_SIZE,
        medium: str = MEDIUM_CPU,
        events: bool = True,
    ) -> None:
        if type(capacity_blocks) is not int or capacity_blocks < 1:
            raise TierConfigError(
                f"A host tier needs a capacity of at least one block, got {capacity_blocks!r}; give more "
                "host memory or a smaller block."
            )
        if type(store_threshold) is not int or store_threshold < 1:
            raise TierConfigError(f"store_threshold must be an int >= 1, got {store_threshold!r}.")
        if type(max_tracker_size) is not int or max_tracker_size < 1:
            raise TierConfigError(f"max_tracker_size must be an int >= 1, got {max_tracker_size!r}.")
        make = CACHE_POLICIES.get(policy)
        if make is None:
            raise UnknownTierError(
                f"Unknown host-tier cache policy {policy!r}; known: {', '.join(sorted(CACHE_POLICIES))}."
            )
        #: The KV-event medium of its blocks and how many keys it can hold (fixed for its lifetime).
        self.medium: Final = medium
        self.capacity_blocks: Final = capacity_blocks
        self.policy_name = policy
        self._policy: CachePolicy = make(capacity_blocks)
        self._get = self._policy.get  # bound once: every lookup calls it
        self._allocated = 0
        self._free: list[int] = []
        self._idle = 0  # resident, ready, unpinned
        self._writing = 0
        self._events: list[TierEvent] | None = [] if events else None
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self._counts: OrderedDict[OffloadKey, int] | None = OrderedDict() if store_threshold >= 2 else None
        self._generation = 0
        #: Offered keys the threshold turned away (each key once per request).
        self.stores_skipped = 0

    # -- what a connector reads -----------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self._allocated - len(self._free)

    # -- per-request bookkeeping ----------------------------------------------------------------

    def _access(self, request: TierRequest) -> _Access:
        state = request.get_state(_Access)
        if state is None or state.owner is not self or state.generation != self._generation:
            state = _Access(self, self._generation)
            request.set_state(state)
        return state

    def _record(
        self, keys: Iterable[OffloadKey], request: TierRequest, reused: Iterable[OffloadKey] = ()
    ) -> None:
        state = self._access(request)
        new = []
        for key in keys:
            if key in state.seen:
                continue
            if state.finished:
                raise TierStateError(
                    f"Request {request.request_id!r} offered or loaded a key after it finished."
                )
            state.groups.setdefault(key_group(key), []).append(key)
            state.seen.add(key)
            new.append(key)
        if new:
            self._policy.on_request_access(new, request)
        state.reused.update(k for k in reused if k not in state.inserted)

    def _count_offer(self, keys: Sequence[OffloadKey], counted: set[OffloadKey]) -> None:
        counts = self._counts
        assert counts is not None
        offered: set[OffloadKey] = set()
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                if key not in counted:
                    counts[key] += 1
                offered.add(key)
        unprotected = len(counts) - len(offered)
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[key] = 1

    # -- the OffloadTier calls ------------------------------------------------------------------

    def lookup(self, key: OffloadKey, request: TierRequest, /) -> LookupResult:
        chunk = self._get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.ref_cnt >= 0 else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Collection[OffloadKey], request: TierRequest, /) -> None:
        chunks = []
        for key in keys:
            chunk = self._policy.get(key)
            if chunk is None or not chunk.is_ready:
                raise TierStateError(
                    f"prepare_load of key {key.hex()} that the {self.medium} tier does not hold ready; "
                    "look it up first (lookup must say HIT)."
                )
            chunks.append(chunk)
        for key, chunk in zip(keys, chunks, strict=True):
            if chunk.ref_cnt == 0:
                self._policy.mark_non_evictable(key)
                self._idle -= 1
            chunk.ref_cnt += 1
        self._record(keys, request, reused=keys)

    def complete_load(self, keys: Collection[OffloadKey], request: TierRequest, /) -> None:
        for key in keys:
            chunk = self._policy.get(key)
            if chunk is None or chunk.ref_cnt <= 0:
                raise TierStateError(f"complete_load of key {key.hex()} that no prepare_load pinned.")
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self._idle += 1
                self._policy.mark_evictable(key)

    def prepare_store(self, keys: Sequence[OffloadKey], request: TierRequest, /) -> StorePlan | None:
        keys = list(keys)
        state = self._access(request)
        if self._counts is not None:
            self._count_offer(keys, state.counted)
        to_store: list[OffloadKey] = []
        ready: list[OffloadKey] = []
        for key in keys:
            chunk = self._policy.get(key)
            if chunk is None:
                to_store.append(key)
            elif chunk.is_ready:
                ready.append(key)
        if self._counts is not None:
            admitted = []
            for key in to_store:
                if self._counts.get(key, 0) >= self.store_threshold:
                    admitted.append(key)
                elif key not in state.counted:
                    self.stores_skipped += 1
            to_store = admitted
            state.counted.update(keys)
        misses = [k for k in to_store if k not in state.store_miss]
        if misses:
            self._policy.on_store_miss(misses, request)  # ARC learns from its ghosts before insert
            state.store_miss.update(misses)
        recorded = set(to_store)
        recorded.update(ready)
        self._record((k for k in keys if k in recorded), request, reused=ready)
        if not to_store:
            return StorePlan(keys_to_store=(), evicted_keys=())
        free = len(self._free) + self.capacity_blocks - self._allocated
        short = len(to_store) - free
        evicted: list[OffloadKey] = []
        if short > 0:
            if short > self._idle:
                return None
            victims = self._policy.evict(short, set(keys))
            if victims is None:
                return None
            self._idle -= len(victims)
            for key, chunk in victims:
                self._free.append(chunk.chunk_id)
                evicted.append(key)
            if self._events is not None:
                self._events.append(TierEvent(keys=tuple(evicted), medium=self.medium, removed=True))
        fresh = min(len(to_store), self.capacity_blocks - self._allocated)
        for i, key in enumerate(to_store):
            if i < fresh:
                chunk = Chunk(self._allocated)
                self._allocated += 1
            else:
                chunk = Chunk(self._free.pop())
            self._policy.insert(key, chunk, request)
        self._writing += len(to_store)
        state.inserted.update(to_store)
        return StorePlan(keys_to_store=tuple(to_store), evicted_keys=tuple(evicted))

    def complete_store(
        self, keys: Collection[OffloadKey], request: TierRequest, /, success: bool = True
    ) -> None:
        done: list[OffloadKey] = []
        for key in keys:
            chunk = self._policy.get(key)
            if chunk is None or chunk.is_ready:
                continue
            self._writing -= 1
            if success:
                chunk.ref_cnt = 0
                self._idle += 1
                self._policy.mark_evictable(key)
            else:
                self._policy.remove(key)
                self._free.append(chunk.chunk_id)
            done.append(key)
        if done and self._events is not None:
            if success:
                self._events.append(TierEvent(keys=tuple(done), medium=self.medium, removed=False))
            else:
                self._events.append(
                    TierEvent(keys=tuple(done), medium=self.medium, removed=True, metadata_only=True)
                )

    def on_request_finished(self, request: TierRequest, /) -> None:
        state = request.get_state(_Access)
        if state is None or state.owner is not self or state.generation != self._generation or state.finished:
            return
        state.finished = True
        ordered: list[OffloadKey] = []
        for group in sorted(state.groups):
            ordered.extend(order_by_position(state.groups[group], request))
        ordered = order_by_position(ordered, request)
        self._policy.on_request_finished(ordered, state.inserted - state.reused, state.reused, request)

    def take_events(self) -> list[TierEvent]:
        if self._events is None:
            return []
        events, self._events = self._events, []
        out = []
        for event in events:
            if event.metadata_only:
                # a retry may already hold the key again: only the keys still absent are announced
                keys = tuple(k for k in event.keys if self._policy.get(k) is None)
                if not keys:
                    continue
                event = TierEvent(keys=keys, medium=event.medium, removed=True, metadata_only=True)
            out.append(event)
        return out

    def reset(self) -> None:
        self._policy.clear()
        self._get = self._policy.get
        self._generation += 1
        self._idle = 0
        self._writing = 0
        self._free.clear()
        self._allocated = 0


__all__ = ["MAX_TRACKER_SIZE", "HostTier"]
