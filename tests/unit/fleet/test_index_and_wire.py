"""The KV-event index reads vLLM's wire (both shapes) and keeps per-instance residency exact."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.blocks.event_wire import decode_event_batch, encode_event_batch
from kvspec.blocks.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvspec.errors import EventWireError
from kvspec.fleet.index import KVEventIndex


def _stored(hashes: list[bytes], kind: str | None = "full_attention", group: int = 0) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=list(range(4 * len(hashes))),
        block_size=4,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=group,
        kv_cache_spec_kind=kind,
        kv_cache_spec_sliding_window=None if kind != "sliding_window" else 8,
    )


H = [bytes([i]) * 4 for i in range(8)]


@pytest.mark.parametrize("wire", ["0.34", "0.23"])
def test_encoded_batches_decode_back_field_for_field(wire: str) -> None:
    events: list[KVCacheEvent] = [
        _stored(H[:3]),
        BlockRemoved(block_hashes=[H[1]], medium="GPU", group_idx=0),
        AllBlocksCleared(),
    ]
    payload = encode_event_batch(events, ts=1.5, wire=wire)
    raw: Any = msgspec.msgpack.decode(payload)
    first: Any = raw[1][0]
    if wire == "0.34":
        assert first["type"] == "BlockStored" and "lora_name" not in first  # defaults left out
    else:
        assert first[0] == "BlockStored" and len(first) == 12  # the tag, then 11 positional fields
    batch = decode_event_batch(payload)
    stored, removed, cleared = batch.events
    assert batch.ts == 1.5
    assert stored.block_hashes == tuple(H[:3]) and stored.token_ids == tuple(range(12))  # type: ignore[union-attr]
    assert stored.kv_cache_spec_kind == "full_attention" and stored.group_idx == 0  # type: ignore[union-attr]
    assert removed.block_hashes == (H[1],) and type(cleared).__name__ == "WireAllBlocksCleared"  # type: ignore[union-attr]


def test_034_maps_are_written_in_vllms_field_order_with_nones_left_out() -> None:
    stored = dataclasses.replace(_stored(H[:2]), extra_keys=[None, ("lora-a",)], lora_id=None)
    events: list[KVCacheEvent] = [
        stored,
        BlockRemoved(block_hashes=[H[1]], medium="GPU"),
        BlockRemoved(block_hashes=[H[0]], medium="CPU", group_idx=2),
        AllBlocksCleared(),
    ]
    expected = [
        2.5,
        [
            {
                "type": "BlockStored",
                "block_hashes": H[:2],
                "parent_block_hash": None,  # the first six are written even when None
                "token_ids": list(range(8)),
                "block_size": 4,
                "lora_id": None,
                "medium": "GPU",
                "extra_keys": [None, ["lora-a"]],
                "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            },
            {"type": "BlockRemoved", "block_hashes": [H[1]], "medium": "GPU"},
            {"type": "BlockRemoved", "block_hashes": [H[0]], "medium": "CPU", "group_idx": 2},
            {"type": "AllBlocksCleared"},
        ],
        None,
    ]
    # Byte for byte: the same keys in the same order as the maps above.
    assert encode_event_batch(events, ts=2.5) == msgspec.msgpack.encode(expected)


@pytest.mark.parametrize("wire", ["0.34", "0.23"])
def test_the_index_tracks_stores_removals_and_clears(wire: str) -> None:
    index = KVEventIndex(3)
    index.apply(0, encode_event_batch([_stored(H[:4])], ts=0, wire=wire))
    index.apply(1, encode_event_batch([_stored(H[:2]), _stored([H[5]])], ts=0, wire=wire))
    assert index.overlap(H[:4]) == [4, 2, 0]
    index.apply(0, encode_event_batch([BlockRemoved(block_hashes=[H[1]], medium="GPU")], ts=0, wire=wire))
    assert index.overlap(H[:4]) == [1, 2, 0]  # consecutive from block 0: block 2 and 3 no longer count
    assert index.overlap([H[5]]) == [0, 1, 0] and index.overlap([H[6]]) == [0, 0, 0]
    index.apply(1, encode_event_batch([AllBlocksCleared()], ts=0, wire=wire))
    assert index.overlap(H[:4]) == [1, 0, 0] and not index.held(1)
    assert set(index.holders) == {H[0], H[2], H[3]}


@pytest.mark.parametrize("wire", ["0.34", "0.23"])
def test_stores_after_a_clear_in_one_batch_are_kept(wire: str) -> None:
    index = KVEventIndex(2)
    index.apply(0, encode_event_batch([_stored(H[:2]), AllBlocksCleared(), _stored(H[4:6])], ts=0, wire=wire))
    assert index.held(0) == set(H[4:6]) and index.overlap(H[4:6]) == [2, 0]
    assert index.overlap(H[:2]) == [0, 0] and index.num_events == 3
    index.apply(0, encode_event_batch([BlockRemoved(block_hashes=[H[4]], medium="GPU")], ts=0, wire=wire))
    assert index.held(0) == {H[5]} and H[4] not in index.holders


def test_two_groups_storing_one_hash_keep_it_until_both_remove_it() -> None:
    index = KVEventIndex(1)
    index.apply(0, encode_event_batch([_stored(H[:2], group=0), _stored(H[:2], group=1)], ts=0))
    index.apply(0, encode_event_batch([BlockRemoved(block_hashes=[H[0]], medium="GPU", group_idx=0)], ts=0))
    assert index.overlap(H[:2]) == [2]
    index.apply(0, encode_event_batch([BlockRemoved(block_hashes=[H[0]], medium="GPU", group_idx=1)], ts=0))
    assert index.overlap(H[:2]) == [0]
    # A clear forgets the repeats too: after it, one store is undone by one removal.
    index.apply(0, encode_event_batch([_stored(H[1:3], group=0), _stored(H[1:3], group=1)], ts=0))
    index.apply(0, encode_event_batch([AllBlocksCleared(), _stored([H[2]])], ts=0))
    index.apply(0, encode_event_batch([BlockRemoved(block_hashes=[H[2]], medium="GPU")], ts=0))
    assert index.held(0) == set() and not index.holders


@pytest.mark.parametrize("kind", ["sliding_window", "mamba"])
def test_stores_of_groups_that_keep_no_whole_prefix_are_ignored(kind: str) -> None:
    """llm-d-router#2362: a window or Mamba group's stores would claim prefixes it cannot serve."""
    index = KVEventIndex(1)
    index.apply(0, encode_event_batch([_stored(H[:3], kind=kind)], ts=0))
    assert index.overlap(H[:3]) == [0] and index.num_events == 1
    index.apply(0, encode_event_batch([_stored(H[:3], kind=None)], ts=0))  # no kind named: trusted
    assert index.overlap(H[:3]) == [3]


@pytest.mark.parametrize("wire", ["0.34", "0.23"])
def test_a_window_or_mamba_removal_never_clears_full_attentions_copy_of_a_hash(wire: str) -> None:
    """Issue 52 (Infera#98): every group of an instance publishes one hash for the same tokens; under sparse
    retention the window and Mamba groups drop their copies long before full attention does. Their removals
    must not clear the attention group's blocks (they did: the index saw a removal of a hash it held)."""
    index = KVEventIndex(1)
    stores = [_stored(H[:3], group=0), _stored(H[:3], kind="sliding_window", group=1)]
    index.apply(0, encode_event_batch([*stores, _stored([H[2]], kind="mamba", group=2)], ts=0, wire=wire))
    assert index.untracked_groups == {1, 2}
    removals = [
        BlockRemoved(block_hashes=H[:2], medium="GPU", group_idx=1),
        BlockRemoved(block_hashes=[H[2]], medium="GPU", group_idx=2),
    ]
    index.apply(0, encode_event_batch(removals, ts=0, wire=wire))
    assert index.overlap(H[:3]) == [3] and index.held(0) == set(H[:3])
    # The attention group's own removal still applies.
    index.apply(
        0, encode_event_batch([BlockRemoved(block_hashes=[H[1]], medium="GPU", group_idx=0)], ts=0, wire=wire)
    )
    assert index.overlap(H[:3]) == [1]


def _state(hashes: list[bytes], group: int = 2) -> BlockStored:
    return dataclasses.replace(_stored(hashes, kind="mamba", group=group), kv_cache_spec_sliding_window=None)


@pytest.mark.parametrize("wire", ["0.34", "0.23"])
def test_groups_kept_apart_give_the_prefix_every_group_can_serve(wire: str) -> None:
    """Issue 52's group-aware index (``groups=True``): full attention holds blocks 0-5 on both instances; a
    window of 8 tokens (blocks of 4: the 2 blocks before a boundary) and a Mamba state group decide where a
    hybrid hit can end. A Mamba state and an attention block of one hash are separate entries."""
    index = KVEventIndex(2, groups=True)
    window = _stored(H[2:4], kind="sliding_window", group=1)  # window 8: blocks 2-3 before boundary 4
    batch0 = [_stored(H[:6]), window, _state([H[1], H[3]])]
    batch1 = [_stored(H[:6]), _stored(H[4:6], kind="sliding_window", group=1), _state([H[1]])]
    index.apply(0, encode_event_batch(batch0, ts=0, wire=wire))
    index.apply(1, encode_event_batch(batch1, ts=0, wire=wire))
    assert index.overlap(H[:6]) == [6, 6]
    # Instance 0: boundary 4 has the window (blocks 2, 3) and a state (block 3). Instance 1: its window sits
    # at 6 but no state there; boundary 2 has a state, but its window (blocks 0, 1) is not held.
    assert index.hybrid_overlap(H[:6], 4) == [4, 0]
    assert index.group_windows == {1: 8, 2: None}
    # The Mamba group drops its state of H[3]: the attention block of the same hash stays.
    index.apply(
        0, encode_event_batch([BlockRemoved(block_hashes=[H[3]], medium="GPU", group_idx=2)], ts=0, wire=wire)
    )
    assert index.overlap(H[:6]) == [6, 6] and index.hybrid_overlap(H[:6], 4) == [0, 0]
    # A state stored under a hash full attention does not hold claims no attention prefix.
    index.apply(1, encode_event_batch([_state([H[7]])], ts=0, wire=wire))
    assert index.overlap([H[7]]) == [0, 0] and index.hybrid_overlap([H[7]], 4) == [0, 0]
    # A clear drops the instance from every group.
    index.apply(0, encode_event_batch([AllBlocksCleared()], ts=0, wire=wire))
    assert all(not mask & 1 for held in index.group_holders.values() for mask in held.values())


def test_a_window_reads_the_tokens_before_the_boundary_not_the_boundary_itself() -> None:
    """A 9-token window at 4-token blocks: the token after a hit at boundary 4 (token 16) reads tokens 8-15,
    two blocks (cdiv(9 - 1, 4)), not three."""
    index = KVEventIndex(1, groups=True)
    window = dataclasses.replace(
        _stored(H[2:4], kind="sliding_window", group=1), kv_cache_spec_sliding_window=9
    )
    index.apply(0, encode_event_batch([_stored(H[:4]), window], ts=0))
    assert index.group_windows == {1: 9} and index.hybrid_overlap(H[:4], 4) == [4]


def test_without_groups_the_index_keeps_no_group_residency() -> None:
    index = KVEventIndex(1)
    index.apply(0, encode_event_batch([_stored(H[:2]), _state([H[1]])], ts=0))
    assert index.group_holders == {} and index.hybrid_overlap(H[:2], 4) == [2]


def test_a_bad_payload_names_the_instance() -> None:
    index = KVEventIndex(2)
    with pytest.raises(EventWireError, match="instance 1: a KV event payload that is not msgpack"):
        index.apply(1, b"\xc1")
    with pytest.raises(EventWireError, match=r"instance 0: unknown KV event type 'Bogus'"):
        index.apply(0, msgspec.msgpack.encode([0.0, [{"type": "Bogus"}], None]))
    with pytest.raises(EventWireError, match="instance 0: a KV event batch is"):
        index.apply(0, msgspec.msgpack.encode({"ts": 0}))
    with pytest.raises(EventWireError, match=r"unknown KV event wire format '0\.99'"):
        encode_event_batch([], ts=0, wire="0.99")


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["store", "remove", "clear"]),
        st.integers(0, 2),  # instance
        st.integers(0, 1),  # group
        st.lists(st.integers(0, 5), min_size=1, max_size=4),  # hashes
    ),
    max_size=30,
)


@given(ops=_OPS, wire=st.sampled_from(["0.34", "0.23"]))
@settings(max_examples=150, deadline=None)
def test_the_index_agrees_with_a_model_of_counts_per_instance(
    ops: list[tuple[str, int, int, list[int]]], wire: str
) -> None:
    """Against a plain model (per instance, how many groups hold each hash): every prefix walk and every
    instance's hashes agree after each event, repeats and clears included."""
    index = KVEventIndex(3)
    model: list[dict[bytes, int]] = [{}, {}, {}]
    for op, instance, group, ids in ops:
        hashes = [H[i] for i in ids]
        event: KVCacheEvent
        if op == "store":
            event = _stored(hashes, group=group)
            for h in hashes:
                model[instance][h] = model[instance].get(h, 0) + 1
        elif op == "remove":
            event = BlockRemoved(block_hashes=hashes, medium="GPU", group_idx=group)
            for h in hashes:
                if model[instance].get(h, 0) > 1:
                    model[instance][h] -= 1
                else:
                    model[instance].pop(h, None)
        else:
            event = AllBlocksCleared()
            model[instance] = {}
        index.apply(instance, encode_event_batch([event], ts=0, wire=wire))
        for i in range(3):
            assert index.held(i) == set(model[i])
        for start in range(len(H)):
            walk = [H[(start + k) % len(H)] for k in range(4)]
            expected = []
            for held in model:
                depth = 0
                while depth < len(walk) and walk[depth] in held:
                    depth += 1
                expected.append(depth)
            assert index.overlap(walk) == expected


def _medium(hashes: list[bytes], medium: str, *, removed: bool = False) -> KVCacheEvent:
    if removed:
        return BlockRemoved(block_hashes=hashes, medium=medium, group_idx=0)
    return dataclasses.replace(_stored(hashes), medium=medium, token_ids=[], block_size=0)


@pytest.mark.parametrize("wire", ["0.34", "0.23"])
def test_offloaded_blocks_count_their_tiers_weight_and_extend_a_prefix(wire: str) -> None:
    """Instance 0 holds blocks 0-1 on the GPU and 2-3 in host memory only; instance 1 all four on the GPU.
    llm-d's weights: 0 scores 1 + 1 + 0.8 + 0.8, 1 scores 4; GPU-only overlap ignores host copies."""
    index = KVEventIndex(2)
    index.apply(0, encode_event_batch([_stored(H[:2]), _medium(H[:4], "CPU")], ts=0.0, wire=wire))
    index.apply(1, encode_event_batch([_stored(H[:4])], ts=0.0, wire=wire))
    assert index.overlap(H[:4]) == [2, 4]
    assert index.weighted_overlap(H[:4], {"GPU": 1.0, "CPU": 0.8}) == pytest.approx([3.6, 4.0])
    # A removal on the CPU medium leaves the GPU copies; the prefix then ends at block 2 for instance 0.
    index.apply(0, encode_event_batch([_medium([H[2]], "CPU", removed=True)], ts=1.0, wire=wire))
    assert index.weighted_overlap(H[:4], {"GPU": 1.0, "CPU": 0.8}) == pytest.approx([2.0, 4.0])
    # A GPU removal of a block the host still holds: it counts at the host's weight.
    index.apply(
        0,
        encode_event_batch([BlockRemoved(block_hashes=[H[1]], medium="GPU", group_idx=0)], ts=2.0, wire=wire),
    )
    assert index.weighted_overlap(H[:4], {"GPU": 1.0, "CPU": 0.8}) == pytest.approx([1.8, 4.0])
    assert index.weighted_overlap(H[:4], {"GPU": 1.0}) == [1.0, 4.0]  # an unweighted medium extends nothing


def test_offloaded_stores_of_groups_that_cannot_serve_a_prefix_are_ignored() -> None:
    index = KVEventIndex(1)
    window_store = dataclasses.replace(_stored(H[:2], kind="sliding_window"), medium="CPU")
    index.apply(0, encode_event_batch([window_store], ts=0.0))
    assert index.weighted_overlap(H[:2], {"GPU": 1.0, "CPU": 0.8}) == [0.0]
