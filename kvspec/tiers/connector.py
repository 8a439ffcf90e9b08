"""An engine's offloading connector: how the GPU cache reaches its tiers (kvspec's model of vLLM 0.34's
``OffloadingConnector``, scheduler side).

One connector per engine instance, over an ordered list of tiers (:class:`TierSlot`: the instance's host
tier first, then a pool the fleet shares). Its rules:

**Which groups offload** is a stated choice per group family (:data:`FAMILIES`): ``full`` (full attention:
every block of the prefix), ``window`` (sliding window / chunked attention: the blocks inside the window at
the hit's end) and ``state`` (recurrent states: the state at the hit's end). A family left out is never
stored, so a model with such a group gets no hit beyond its GPU hit from any tier.

**Hits** (:meth:`TierConnector.find_hit`), after the GPU's prefix hit of ``h`` tokens: the hit extends to
the largest end ``e`` (a multiple of every group's block size, at most the prompt less its last token) such
that every full-attention group has each block from ``h`` to ``e`` in some tier, every window group the
blocks from ``h`` inside its window ending at ``e`` (``cdiv(window - 1, block)`` blocks, as vLLM's sliding
window hit needs), and every state group the block ending at ``e``. A key is taken from the first tier
holding it ready. The ``e - h`` tokens are the request's external computed tokens: loaded, not computed.

**Loads** pin the keys at admission (:meth:`begin_load`, which returns the transfer time the step is
charged: per tier one transfer of its bytes) and unpin them when the step ends.

**Stores** are write-through, as vLLM's: after each step every newly full block of an offloaded group that
the request computed (not those its hits gave it) is offered to every tier (one ``prepare_store`` per tier
per request per step; a refused offer is retried on the request's next step) and completes by the step's
end. Their transfer overlaps the step's compute (:meth:`end_step` returns its time; the engine keeps the
step at least that long).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from math import lcm
from typing import Final

from kvspec.errors import TierConfigError
from kvspec.intmath import cdiv
from kvspec.tiers.base import LookupResult, OffloadKey, OffloadTier, TierEvent, TierRequest, offload_key
from kvspec.tiers.transfer import TransferModel

#: The group families a connector may offload.
FAMILIES: Final = ("full", "window", "state")


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupOffload:
    """One KV-cache group as the connector sees it: ``index`` (its group id), ``family`` (one of
    :data:`FAMILIES`), ``block_size`` (tokens per block, a multiple of the hash block), ``window_blocks``
    (window groups: blocks a hit needs at its end), ``block_bytes`` (one block of the group, all its
    layers), ``offloaded`` (whether its family is offloaded)."""

    index: int
    family: str
    block_size: int
    block_bytes: int
    window_blocks: int = 0
    offloaded: bool = True

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise TierConfigError(f"Group family {self.family!r} is not one of {', '.join(FAMILIES)}.")


@dataclass(frozen=True, kw_only=True, slots=True)
class TierSlot:
    """A tier in a connector's list: its ``name`` in reports ("host", "pool", a plugin's), the tier, its
    link to the GPU, and whether other instances share it (a shared tier's events are not this instance's:
    they are not published with its KV events)."""

    name: str
    tier: OffloadTier
    link: TransferModel
    shared: bool = False


@dataclass(kw_only=True, slots=True)
class TierStats:
    """What the connector moved, per tier name: prompt tokens hit (at first admission: tokens a request did
    not compute because this tier held them; readmissions in ``hit_tokens``), blocks and bytes loaded and
    stored, blocks the tier evicted to make room, offers refused."""

    first_hit_tokens: dict[str, int] = field(default_factory=dict)
    hit_tokens: dict[str, int] = field(default_factory=dict)
    loaded_blocks: dict[str, int] = field(default_factory=dict)
    loaded_bytes: dict[str, int] = field(default_factory=dict)
    stored_blocks: dict[str, int] = field(default_factory=dict)
    stored_bytes: dict[str, int] = field(default_factory=dict)
    evicted_blocks: dict[str, int] = field(default_factory=dict)
    refused_stores: dict[str, int] = field(default_factory=dict)
    load_ms: float = 0.0

    def add(self, counter: dict[str, int], name: str, value: int) -> None:
        counter[name] = counter.get(name, 0) + value

    @staticmethod
    def merged(parts: Sequence[TierStats]) -> TierStats:
        """The sum of ``parts`` (a fleet's instances)."""
        total = TierStats()
        for part in parts:
            for name in _COUNTERS:
                mine = getattr(total, name)
                for tier, value in getattr(part, name).items():
                    mine[tier] = mine.get(tier, 0) + value
            total.load_ms += part.load_ms
        return total

    def summary(self) -> dict[str, dict[str, int] | float]:
        row: dict[str, dict[str, int] | float] = {name: dict(getattr(self, name)) for name in _COUNTERS}
        row["load_ms"] = round(self.load_ms, 3)
        return row


#: TierStats' per-tier counters (every field but ``load_ms``).
_COUNTERS: Final = (
    "first_hit_tokens",
    "hit_tokens",
    "loaded_blocks",
    "loaded_bytes",
    "stored_blocks",
    "stored_bytes",
    "evicted_blocks",
    "refused_stores",
)


class _Plan:
    """A request's pending load: keys per tier slot and the hit tokens each slot gives."""

    __slots__ = ("keys", "tokens")

    def __init__(self, num_slots: int) -> None:
        self.keys: list[list[OffloadKey]] = [[] for _ in range(num_slots)]
        self.tokens = [0] * num_slots


class _RequestState:
    __slots__ = ("context", "loading", "stored")

    def __init__(self, request_id: str, num_groups: int, num_slots: int) -> None:
        self.context = TierRequest(request_id)
        # Per tier, per group: the blocks offered and taken (or covered by hits); a tier that refused an
        # offer is offered those blocks again next step, the others are not.
        self.stored = [[0] * num_groups for _ in range(num_slots)]
        self.loading: _Plan | None = None


class TierConnector:
    """One instance's way to its tiers (see the module docstring). ``groups``: the coordinator's groups in
    order; ``hash_block_size``: tokens per block hash (every group's block size is a multiple)."""

    def __init__(
        self, groups: Sequence[GroupOffload], slots: Sequence[TierSlot], *, hash_block_size: int
    ) -> None:
        if not slots:
            raise TierConfigError("A tier connector needs at least one tier.")
        names = [s.name for s in slots]
        if len(set(names)) != len(names):
            raise TierConfigError(f"Tier names must differ, got {names}.")
        for g in groups:
            if g.block_size % hash_block_size:
                raise TierConfigError(
                    f"Group {g.index}'s block size {g.block_size} is not a multiple of the hash block "
                    f"({hash_block_size} tokens)."
                )
        self.groups = tuple(groups)
        self.slots = tuple(slots)
        self.hash_block_size = hash_block_size
        self.unit = lcm(*(g.block_size for g in groups)) if groups else hash_block_size
        self.active = bool(groups) and all(g.offloaded for g in groups)
        self.stats = TierStats()
        #: Whether the engine publishes this connector's events (else :meth:`end_step` drops them).
        self.publish = False
        self._requests: dict[str, _RequestState] = {}
        self._group_bytes = {g.index: g.block_bytes for g in groups}
        # Per group, the 4 bytes its keys end with (vLLM's make_offload_key), and each tier's lookup, bound
        # once: a hit search looks up every block past the GPU hit.
        self._suffix = {g.index: offload_key(b"", g.index) for g in groups}
        self._lookups = [slot.tier.lookup for slot in slots]
        self._full = [g for g in groups if g.family == "full"]
        self._others = [g for g in groups if g.family != "full"]

    # -- keys -----------------------------------------------------------------------------------

    def _key(self, hashes: Sequence[bytes], group: GroupOffload, block: int) -> OffloadKey | None:
        """Group ``group``'s ``block``-th block's key (its last hash block's chained hash), None past the
        request's hashed blocks."""
        last = (block + 1) * (group.block_size // self.hash_block_size) - 1
        return hashes[last] + self._suffix[group.index] if last < len(hashes) else None

    def _where(self, key: OffloadKey, context: TierRequest) -> int:
        """The first tier slot holding ``key`` ready, -1 if none."""
        hit = LookupResult.HIT
        i = 0
        for lookup in self._lookups:
            if lookup(key, context) is hit:
                return i
            i += 1
        return -1

    def _state(self, request_id: str) -> _RequestState:
        state = self._requests.get(request_id)
        if state is None:
            state = self._requests[request_id] = _RequestState(request_id, len(self.groups), len(self.slots))
        return state

    # -- hits and loads -------------------------------------------------------------------------

    def find_hit(self, request_id: str, hashes: Sequence[bytes], gpu_hit: int, max_tokens: int) -> int:
        """Tokens past the GPU hit ``gpu_hit`` that the tiers give (0 if none), at most ``max_tokens`` in
        all; the keys to load are kept for :meth:`begin_load`. Records nothing in the tiers."""
        state = self._state(request_id)
        found, plan = self._search(state.context, hashes, gpu_hit, max_tokens)
        state.loading = plan
        return found

    def probe(self, hashes: Sequence[bytes], gpu_hit: int, max_tokens: int) -> int:
        """What :meth:`find_hit` would give now, remembering nothing (a router's exact probe)."""
        return self._search(TierRequest("probe"), hashes, gpu_hit, max_tokens)[0]

    def _search(
        self, context: TierRequest, hashes: Sequence[bytes], gpu_hit: int, max_tokens: int
    ) -> tuple[int, _Plan | None]:
        if not self.active or max_tokens <= gpu_hit:
            return 0, None
        hb = self.hash_block_size
        limit = min(max_tokens, len(hashes) * hb)
        # Full attention: each group's run of held blocks from the GPU hit on.
        end = limit
        where_full: list[list[int]] = []
        num_hashes = len(hashes)
        where = self._where
        for g in self._full:
            first = gpu_hit // g.block_size
            tiers: list[int] = []
            block = first
            per = g.block_size // hb
            suffix = self._suffix[g.index]
            while (block + 1) * g.block_size <= end:
                last = (block + 1) * per - 1
                if last >= num_hashes:
                    break
                at = where(hashes[last] + suffix, context)
                if at < 0:
                    break
                tiers.append(at)
                block += 1
            end = min(end, block * g.block_size)
            where_full.append(tiers)
        end = end // self.unit * self.unit
        # Windows and states: the largest end, down from there, each group can serve.
        presence: list[dict[int, int]] = [{} for _ in self._others]
        found = 0
        e = end
        while e > gpu_hit:
            if all(
                self._serves(g, e, gpu_hit, hashes, context, presence[i]) for i, g in enumerate(self._others)
            ):
                found = e
                break
            e -= self.unit
        if found <= gpu_hit:
            return 0, None
        plan = _Plan(len(self.slots))
        for g, tiers in zip(self._full, where_full, strict=True):
            first = gpu_hit // g.block_size
            for block in range(first, found // g.block_size):
                key = self._key(hashes, g, block)
                assert key is not None
                at = tiers[block - first]
                plan.keys[at].append(key)
                context.set_position(key, (block + 1) * g.block_size)
        for i, g in enumerate(self._others):
            for block in self._needed(g, found, gpu_hit):
                key = self._key(hashes, g, block)
                assert key is not None
                at = presence[i][block]
                plan.keys[at].append(key)
                context.set_position(key, (block + 1) * g.block_size)
        # Tokens per tier: by the first full-attention group's blocks (else by the tier most keys come from).
        if self._full:
            lead = self._full[0]
            for at in where_full[0][: found // lead.block_size - gpu_hit // lead.block_size]:
                plan.tokens[at] += lead.block_size
        else:
            counts = [len(k) for k in plan.keys]
            plan.tokens[counts.index(max(counts))] += found - gpu_hit
        extra = found - gpu_hit - sum(plan.tokens)
        if extra:  # the lead group's blocks may not tile the span exactly: the rest goes to its top tier
            plan.tokens[max(range(len(plan.tokens)), key=plan.tokens.__getitem__)] += extra
        return found - gpu_hit, plan

    @staticmethod
    def _needed(group: GroupOffload, end: int, gpu_hit: int) -> range:
        """The blocks of a window or state group a hit ending at ``end`` loads (those past the GPU hit)."""
        last = end // group.block_size
        if group.family == "state":
            return range(last - 1, last)
        first = max(gpu_hit // group.block_size, last - group.window_blocks)
        return range(first, last)

    def _serves(
        self,
        group: GroupOffload,
        end: int,
        gpu_hit: int,
        hashes: Sequence[bytes],
        context: TierRequest,
        presence: dict[int, int],
    ) -> bool:
        for block in self._needed(group, end, gpu_hit):
            at = presence.get(block)
            if at is None:
                key = self._key(hashes, group, block)
                at = presence[block] = -1 if key is None else self._where(key, context)
            if at < 0:
                return False
        return True

    def begin_load(self, request_id: str, *, first_admission: bool) -> float:
        """Pin the keys :meth:`find_hit` planned for ``request_id`` and count them; the milliseconds the
        loads take (one transfer per tier). 0 without a plan."""
        state = self._requests.get(request_id)
        plan = None if state is None else state.loading
        if plan is None or state is None:
            return 0.0
        stats = self.stats
        ms = 0.0
        for slot, keys, tokens in zip(self.slots, plan.keys, plan.tokens, strict=True):
            if not keys:
                continue
            slot.tier.prepare_load(keys, state.context)
            nbytes = sum(self._bytes_of(k) for k in keys)
            ms += slot.link.load_ms(nbytes)
            stats.add(stats.loaded_blocks, slot.name, len(keys))
            stats.add(stats.loaded_bytes, slot.name, nbytes)
            stats.add(stats.hit_tokens, slot.name, tokens)
            if first_admission:
                stats.add(stats.first_hit_tokens, slot.name, tokens)
        stats.load_ms += ms
        return ms

    def _bytes_of(self, key: OffloadKey) -> int:
        return self._group_bytes.get(int.from_bytes(key[-4:], "big"), 0)

    def admitted(self, request_id: str, num_computed: int) -> None:
        """The request was admitted with ``num_computed`` tokens (GPU and tier hits): its blocks below are
        not offered again (vLLM's chunk-level offloading)."""
        state = self._state(request_id)
        covered = [num_computed // g.block_size for g in self.groups]
        state.stored = [list(covered) for _ in self.slots]

    def dropped(self, request_id: str) -> None:
        """The request's admission did not happen this step (no room): forget its plan."""
        state = self._requests.get(request_id)
        if state is not None:
            state.loading = None

    # -- the end of a step -------------------------------------------------------------------------

    def end_step(self, requests: Sequence[tuple[str, Sequence[bytes], int]]) -> float:
        """After a step: unpin its loads and offer each ``(request id, block hashes, computed tokens)``'s
        newly full blocks to every tier; the milliseconds the stores take (one transfer per tier per
        request)."""
        stats = self.stats
        link_ms = [0.0] * len(self.slots)
        for request_id, hashes, computed in requests:
            state = self._requests.get(request_id)
            if state is None:
                continue
            plan = state.loading
            if plan is not None:
                state.loading = None
                for slot, keys in zip(self.slots, plan.keys, strict=True):
                    if keys:
                        slot.tier.complete_load(keys, state.context)
            last: list[int] | None = None
            offer: list[OffloadKey] = []
            for s, slot in enumerate(self.slots):
                stored = state.stored[s]
                if stored != last:  # the same blocks as the previous tier's offer, most often
                    offer = self._offer(state, hashes, computed, stored)
                    last = list(stored)
                if not offer:
                    continue
                result = slot.tier.prepare_store(offer, state.context)
                if result is None:
                    stats.add(stats.refused_stores, slot.name, len(offer))
                    continue
                for i, g in enumerate(self.groups):
                    stored[i] = max(stored[i], self._full_blocks(g, hashes, computed))
                if result.evicted_keys:
                    stats.add(stats.evicted_blocks, slot.name, len(result.evicted_keys))
                if result.keys_to_store:
                    nbytes = sum(self._bytes_of(k) for k in result.keys_to_store)
                    stats.add(stats.stored_blocks, slot.name, len(result.keys_to_store))
                    stats.add(stats.stored_bytes, slot.name, nbytes)
                    link_ms[s] += slot.link.store_ms(nbytes)
                    slot.tier.complete_store(result.keys_to_store, state.context)
        if not self.publish:
            for slot in self.slots:
                slot.tier.take_events()
        return max(link_ms)  # each tier's link carries its stores one after another; the links overlap

    def _full_blocks(self, group: GroupOffload, hashes: Sequence[bytes], computed: int) -> int:
        """Blocks of ``group`` that ``computed`` tokens fill and the request's hashes cover."""
        return min(computed // group.block_size, len(hashes) * self.hash_block_size // group.block_size)

    def _offer(
        self, state: _RequestState, hashes: Sequence[bytes], computed: int, stored: list[int]
    ) -> list[OffloadKey]:
        """The offloaded groups' full blocks of ``computed`` tokens past ``stored``, group by group."""
        offer: list[OffloadKey] = []
        for i, g in enumerate(self.groups):
            if not g.offloaded:
                continue
            for block in range(stored[i], self._full_blocks(g, hashes, computed)):
                key = self._key(hashes, g, block)
                assert key is not None
                state.context.set_position(key, (block + 1) * g.block_size)
                offer.append(key)
        return offer

    def finished(self, request_id: str) -> None:
        """The request is done (or refused): its accesses are committed to every tier's order."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return
        for slot in self.slots:
            slot.tier.on_request_finished(state.context)

    def take_events(self) -> list[TierEvent]:
        """This instance's tiers' events since the last call (a shared tier's are drained and dropped)."""
        out: list[TierEvent] = []
        for slot in self.slots:
            events = slot.tier.take_events()
            if not slot.shared:
                out.extend(events)
        return out


def window_blocks(window_tokens: int, block_size: int) -> int:
    """Blocks a sliding-window hit needs at its end: ``cdiv(window - 1, block)`` (vLLM's rule)."""
    return max(1, cdiv(window_tokens - 1, block_size))


__all__ = ["FAMILIES", "GroupOffload", "TierConnector", "TierSlot", "TierStats", "window_blocks"]
