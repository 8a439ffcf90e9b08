"""Where each block is cached, learnt only from the instances' KV events (llm-d's and Dynamo's index).

:class:`KVEventIndex` reads publisher payloads in vLLM's wire format (0.34's tagged maps, 0.23's positional
arrays), keeps ``block hash -> instances`` (a bitmask; a hash stored by several full-attention groups of one
instance is counted, so the last removal clears it), and answers the longest *consecutive* prefix each instance holds from block 0.

Hybrid models: only stores of groups whose declared kind keeps every block of a prefix count
(``full_attention`` and its MLA and sink variants, or events that name no kind), as llm-d-router#2362's fix
does; a sliding-window or Mamba group's stores would claim prefixes those groups cannot serve. So the index
knows full attention's residency, and a hybrid's real hit (bounded by its other groups) can be shorter:
that is the gap kvspec's ``exact`` router closes.

Groups kept apart: every group of one instance publishes the same hash for the same tokens (block hashes
do not name their group), so a removal is applied only if its group is tracked: a window or Mamba group's
removal of a hash (its own copy evicted, under sparse retention long before the attention group's) never
clears what full attention holds. The index learns each group's kind from its stores.

Offloaded media: stores and removals naming a medium other than "GPU" (vLLM's offloading connector's
"CPU" and "STORAGE" events) are kept apart, per medium, and read only by :meth:`KVEventIndex.weighted_overlap`,
which scores each block by the best medium an instance holds it on (llm-d: GPU 1.0, CPU 0.8; Dynamo's
credits: device 1.0, host 0.75, disk 0.25). A fleet without tiers never fills them: :meth:`overlap` and its
speed are as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import msgspec

from kvspec.errors import EventWireError
from kvspec.fleet.index_events import (
    REMOVED_MEDIUM_AT,
    STORED_GROUP_AT,
    STORED_KIND_AT,
    STORED_MEDIUM_AT,
    ClearedRead,
    MapBatch,
    RemovedRead,
    StoredRead,
)
from kvspec.intmath import cdiv

#: Group kinds whose stores say "this prefix is servable" (llm-d's accepted kinds).
PREFIX_KINDS: Final = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


class KVEventIndex:
    """Block residency of ``num_instances`` instances, fed by :meth:`apply`. Invariant: ``holders[h]`` is the
    bitmask of the instances holding hash ``h`` (bit ``i``: instance ``i``; never 0: a hash no instance holds
    has no entry); ``_repeats[(h, i)]`` counts the stores of ``h`` by instance ``i`` beyond its first (one
    hash stored by several full-attention groups), so a removal clears the bit only with the last of them."""

    __slots__ = (
        "_decode",
        "_decode_maps",
        "_repeats",
        "group_holders",
        "group_windows",
        "groups",
        "holders",
        "num_events",
        "num_instances",
        "offloaded",
        "untracked_groups",
    )

    def __init__(self, num_instances: int, *, groups: bool = False) -> None:
        self._decode = msgspec.msgpack.Decoder().decode
        # 0.32/0.34 maps decode straight into the few fields read (token ids are skipped, not built);
        # anything else (0.23's arrays, a malformed payload) takes the general path below.
        self._decode_maps: Callable[[bytes], MapBatch] = msgspec.msgpack.Decoder(MapBatch).decode
        self.num_instances = num_instances
        # A bitmask per hash rather than a set or a dict of instances: a store, a removal and a prefix walk
        # are then a dict lookup and an integer operation each, per block.
        self.holders: dict[Any, int] = {}
        self._repeats: dict[tuple[Any, int], int] = {}
        self.num_events = 0
        #: Per offloaded medium ("CPU", "STORAGE"): hash -> bitmask of instances, as ``holders`` (a tier
        #: keeps one copy per key, so a store of a held hash by another group of the instance is ignored).
        self.offloaded: dict[str, dict[Any, int]] = {}
        #: Groups (``group_idx``) whose stores named a kind that keeps no whole prefix (window, Mamba): their
        #: removals are not applied, so one of their hashes never clears a tracked group's copy.
        self.untracked_groups: set[int] = set()
        #: ``groups``: also keep the untracked groups' residency, each group apart (``group_holders[g]``:
        #: hash -> bitmask, as ``holders``; ``group_windows[g]``: its window in tokens, None for a Mamba
        #: state), for :meth:`hybrid_overlap`. Off: those stores and removals cost nothing.
        self.groups = groups
        self.group_holders: dict[int, dict[Any, int]] = {}
        self.group_windows: dict[int, int | None] = {}

    def held(self, instance: int) -> set[Any]:
        """The hashes ``instance`` holds (a scan of the index: for tests and reports, not the hot path)."""
        bit = 1 << instance
        return {h for h, mask in self.holders.items() if mask & bit}

    def apply(self, instance: int, payload: bytes) -> None:
        """One publisher payload ``[ts, events, dp_rank]`` of ``instance``."""
        try:
            batch = self._decode_maps(payload)
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass
        else:
            self._apply_events(instance, batch[1])
            return
        try:
            raw = self._decode(payload)
        except Exception as exc:
            raise EventWireError(
                f"instance {instance}: a KV event payload that is not msgpack: {exc}"
            ) from None
        if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
            raise EventWireError(f"instance {instance}: a KV event batch is [ts, events, dp_rank]")
        # The general path reads each event into the typed form the maps decode to, then applies them
        # all; a bad event is refused before any of its batch is applied.
        events: list[StoredRead | RemovedRead | ClearedRead] = []
        for event in raw[1]:
            if isinstance(event, dict):
                kind = event.get("type")
                if kind == "BlockStored":
                    events.append(
                        StoredRead(
                            event.get("block_hashes", []),
                            event.get("kv_cache_spec_kind"),
                            event.get("medium", "GPU"),
                            event.get("group_idx"),
                            event.get("kv_cache_spec_sliding_window"),
                        )
                    )
                elif kind == "BlockRemoved":
                    events.append(
                        RemovedRead(
                            event.get("block_hashes", []), event.get("group_idx"), event.get("medium", "GPU")
                        )
                    )
                elif kind == "AllBlocksCleared":
                    events.append(ClearedRead())
                else:
                    raise EventWireError(f"instance {instance}: unknown KV event type {kind!r}")
            elif isinstance(event, list) and event:
                kind = event[0]
                if kind == "BlockStored":
                    spec_kind = event[STORED_KIND_AT] if len(event) > STORED_KIND_AT else None
                    medium = event[STORED_MEDIUM_AT] if len(event) > STORED_MEDIUM_AT else "GPU"
                    group = event[STORED_GROUP_AT] if len(event) > STORED_GROUP_AT else None
                    window = event[STORED_KIND_AT + 1] if len(event) > STORED_KIND_AT + 1 else None
                    events.append(StoredRead(event[1], spec_kind, medium, group, window))
                elif kind == "BlockRemoved":
                    medium = event[REMOVED_MEDIUM_AT] if len(event) > REMOVED_MEDIUM_AT else "GPU"
                    events.append(RemovedRead(event[1], event[3] if len(event) > 3 else None, medium))
                elif kind == "AllBlocksCleared":
                    events.append(ClearedRead())
                else:
                    raise EventWireError(f"instance {instance}: unknown KV event type {kind!r}")
            else:
                raise EventWireError(f"instance {instance}: a KV event must be a map or an array")
        self._apply_events(instance, events)

    def _apply_events(self, instance: int, events: list[StoredRead | RemovedRead | ClearedRead]) -> None:
        """``instance``'s events in order, in one loop (a fleet applies every step's events; vLLM sends one
        BlockRemoved per evicted hash). A store counts only for kinds that keep a whole prefix; a removal
        of a hash the instance does not hold (an untracked group's) is ignored."""
        holders = self.holders
        repeats = self._repeats
        untracked = self.untracked_groups
        bit = 1 << instance
        self.num_events += len(events)
        for item in events:
            if type(item) is RemovedRead:
                group = item.group_idx
                if untracked and group is not None and group in untracked:
                    # A window or Mamba group's own copy of a hash full attention may hold too.
                    if self.groups and (item.medium == "GPU" or item.medium is None):
                        self._group_removed(instance, group, item)
                    continue
                if item.medium != "GPU" and item.medium is not None:
                    self._apply_offloaded(instance, item)
                    continue
                for h in item.block_hashes:
                    mask = holders.get(h, 0)
                    if not mask & bit:
                        continue  # a removal of a group the index does not track (sliding window, Mamba)
                    if repeats:
                        key = (h, instance)
                        more = repeats.get(key)
                        if more is not None:
                            if more > 1:
                                repeats[key] = more - 1
                            else:
                                del repeats[key]
                            continue
                    mask ^= bit
                    if mask:
                        holders[h] = mask
                    else:
                        del holders[h]
            elif type(item) is StoredRead:
                kind = item.kv_cache_spec_kind
                if kind is not None and kind not in PREFIX_KINDS:
                    if item.group_idx is not None:
                        untracked.add(item.group_idx)
                        if self.groups and (item.medium == "GPU" or item.medium is None):
                            self._group_stored(instance, item)
                    continue
                if item.medium != "GPU" and item.medium is not None:
                    self._apply_offloaded(instance, item)
                    continue
                for h in item.block_hashes:
                    mask = holders.get(h, 0)
                    if mask & bit:
                        key = (h, instance)
                        repeats[key] = repeats.get(key, 0) + 1
                    else:
                        holders[h] = mask | bit
            else:
                self._cleared(instance)

    def _apply_offloaded(self, instance: int, item: StoredRead | RemovedRead | ClearedRead) -> None:
        """A store or removal on an offloaded medium (the tiers' events: one copy per key)."""
        bit = 1 << instance
        if type(item) is StoredRead:  # of a prefix kind: the caller checked
            _add_holder(self.offloaded.setdefault(str(item.medium), {}), item.block_hashes, bit)
        elif type(item) is RemovedRead:
            _drop_holder(self.offloaded.get(str(item.medium), {}), item.block_hashes, bit)

    def weighted_overlap(self, block_hashes: Sequence[Any], weights: dict[str, float]) -> list[float]:
        """Per instance, the sum over its consecutive blocks from block 0 of the best weight among the media
        holding each block (``weights`` per medium, "GPU" included; a medium without a weight counts 0 and
        does not extend a prefix); an instance drops out at the first block no weighted medium holds (llm-d's
        tier-weighted longest prefix). Without offloaded entries: :meth:`overlap` times the GPU weight."""
        gpu = weights.get("GPU", 1.0)
        layers = [
            (w, self.offloaded[m]) for m, w in weights.items() if m != "GPU" and m in self.offloaded and w > 0
        ]
        if not layers:
            return [d * gpu for d in self.overlap(block_hashes)]
        if gpu > 0:
            layers.append((gpu, self.holders))
        layers.sort(key=lambda pair: -pair[0])  # the best medium holding a block scores it
        score = [0.0] * self.num_instances
        alive = (1 << self.num_instances) - 1
        for h in block_hashes:
            placed = 0
            for weight, held in layers:
                new = held.get(h, 0) & alive & ~placed
                if new:
                    placed |= new
                    while new:
                        low = new & -new
                        score[low.bit_length() - 1] += weight
                        new ^= low
            alive = placed
            if not alive:
                break
        return score

    def _cleared(self, instance: int) -> None:
        bit = 1 << instance
        _drop_holder(self.holders, self.held(instance), bit)
        for key in [key for key in self._repeats if key[1] == instance]:
            del self._repeats[key]
        for held in self.group_holders.values():
            _drop_holder(held, [h for h, mask in held.items() if mask & bit], bit)

    def _group_stored(self, instance: int, item: StoredRead) -> None:
        group = item.group_idx
        assert group is not None
        held = self.group_holders.get(group)
        if held is None:
            held = self.group_holders[group] = {}
            # A Mamba group keeps one state per block boundary; any other untracked kind is read as a
            # window (its event names it; none named: one block).
            self.group_windows[group] = (
                None if item.kv_cache_spec_kind == "mamba" else item.kv_cache_spec_sliding_window or 1
            )
        _add_holder(held, item.block_hashes, 1 << instance)

    def _group_removed(self, instance: int, group: int, item: RemovedRead) -> None:
        held = self.group_holders.get(group)
        if held is not None:
            _drop_holder(held, item.block_hashes, 1 << instance)

    def hybrid_overlap(self, block_hashes: Sequence[Any], block_size: int) -> list[int]:
        """Per instance, the longest prefix (blocks of ``block_size`` tokens, from block 0) every group can
        serve, from events alone (llm-d's two-phase idea): full attention's consecutive prefix (:meth:`overlap`),
        then the largest boundary at or below it where each window group holds the blocks its window reads
        (the last ``cdiv(window - 1, block_size)`` before the boundary) and each Mamba group holds the state
        at the boundary (the block ending there). Needs ``groups``; without untracked groups it is
        :meth:`overlap`."""
        depth = self.overlap(block_hashes)
        if not self.group_holders:
            return depth
        rules: list[tuple[dict[Any, int], int | None]] = []
        for group, held in self.group_holders.items():
            window = self.group_windows[group]
            rules.append((held, None if window is None else max(1, cdiv(window - 1, block_size))))
        for instance, full in enumerate(depth):
            if full:
                depth[instance] = _hybrid_depth(block_hashes, full, 1 << instance, rules)
        return depth

    def overlap(self, block_hashes: Sequence[Any]) -> list[int]:
        """Per instance, how many of ``block_hashes`` it holds consecutively from block 0."""
        depth = [0] * self.num_instances
        holders = self.holders
        alive = holders.get(block_hashes[0], 0) if block_hashes else 0
        if not alive:
            return depth
        for position, h in enumerate(block_hashes):
            still = alive & holders.get(h, 0)
            if still != alive:
                _set_depth(depth, alive ^ still, position)
                if not still:
                    return depth
                alive = still
        _set_depth(depth, alive, len(block_hashes))
        return depth


def _add_holder(held: dict[Any, int], hashes: Iterable[Any], bit: int) -> None:
    """Set ``bit`` (one instance) on each of ``hashes`` in a hash -> bitmask map."""
    for h in hashes:
        held[h] = held.get(h, 0) | bit


def _drop_holder(held: dict[Any, int], hashes: Iterable[Any], bit: int) -> None:
    """Clear ``bit`` on each of ``hashes``; a hash no instance holds any longer leaves the map."""
    keep = ~bit
    for h in hashes:
        mask = held.get(h, 0) & keep
        if mask:
            held[h] = mask
        else:
            held.pop(h, None)


def _hybrid_depth(
    block_hashes: Sequence[Any], full: int, bit: int, rules: list[tuple[dict[Any, int], int | None]]
) -> int:
    """The largest boundary ``p <= full`` (blocks) at which every rule holds for the instance of ``bit``: a
    state rule (None) holds the block ending at ``p``; a window rule of ``n`` blocks holds the ``n`` before
    ``p`` (fewer near block 0); 0 when none does."""
    # Per window rule, the run of consecutive held blocks ending at each position (0-based, < full).
    runs: list[list[int]] = []
    states: list[dict[Any, int]] = []
    needs: list[int] = []
    for held, need in rules:
        if need is None:
            states.append(held)
            continue
        run = [0] * full
        length = 0
        for position in range(full):
            length = length + 1 if held.get(block_hashes[position], 0) & bit else 0
            run[position] = length
        runs.append(run)
        needs.append(need)
    for p in range(full, 0, -1):
        h = block_hashes[p - 1]
        if all(held.get(h, 0) & bit for held in states) and all(
            run[p - 1] >= min(need, p) for run, need in zip(runs, needs)
        ):
            return p
    return 0


def _set_depth(depth: list[int], instances: int, value: int) -> None:
    """``depth[i] = value`` for each instance ``i`` whose bit is set in ``instances``."""
    while instances:
        low = instances & -instances
        depth[low.bit_length() - 1] = value
        instances ^= low


__all__ = ["PREFIX_KINDS", "KVEventIndex"]
