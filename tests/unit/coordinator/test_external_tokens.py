"""Tokens a connector loads (external computed tokens) beside a local prefix hit, in a hybrid model: every
group's hit blocks are taken before any group allocates blocks for the external tokens (vLLM 0.34's
two-phase attachment, vLLM issue #33775). Taking them group by group let an earlier group's allocation
evict a later group's hit block from the free queue and hand the same block out twice."""

from __future__ import annotations

import pytest
import torch

from kvspec import (
    CircularBufferSpec,
    KVCacheBlocks,
    KVCacheCoordinator,
    SchedulerLimits,
    UnsupportedConfigurationError,
)
from tests.helpers import full_spec, make_config, make_coordinator, make_request, sw_spec


def _flat(coord: object, request_id: str) -> list[int]:
    return [b for group in coord.get_block_ids(request_id) for b in group]  # type: ignore[attr-defined]


def test_external_blocks_never_take_another_groups_hit_blocks() -> None:
    coord = make_coordinator([full_spec(), sw_spec(4096)], 40)
    head = coord.block_pool.free_block_queue.get_all_free_blocks()[:10]
    # Hit blocks at the free queue's head (evictable, ref count 0): group 1's sit right behind group 0's.
    hits = KVCacheBlocks((head[:5], head[5:]))
    request = make_request(coord, "r", [0] * (8 * 16))
    free_before = coord.num_free_blocks
    new = coord.allocate_slots(request, 16, 5 * 16, hits, 0, num_external_computed_tokens=2 * 16)
    assert new is not None
    flat = _flat(coord, "r")
    assert len(set(flat)) == len(flat) == 16, coord.get_block_ids("r")
    full, window = coord.get_block_ids("r")
    assert full[:5] == [b.block_id for b in head[:5]] and window[:5] == [b.block_id for b in head[5:]]
    # 10 hit blocks leave the queue, 2 x (2 external + 1 new) fresh ones are taken after them.
    assert coord.num_free_blocks == free_before - 16
    assert all(coord.block_pool.blocks[i].ref_cnt == 1 for i in flat)
    coord.check_invariants()


def test_a_ring_group_takes_one_block_and_the_hybrid_still_attaches_in_two_phases() -> None:
    """Full attention, a sliding window and a circular buffer, with a connector's tokens: the ring takes its
    one block, and the hit blocks of both attention groups are taken before any external allocation (a
    ring in the model used to turn the two-phase attachment off, as its manager replaced
    allocate_new_computed_blocks whole)."""
    ring = CircularBufferSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16)
    coord = make_coordinator([full_spec(), sw_spec(4096), ring], 40)
    head = coord.block_pool.free_block_queue.get_all_free_blocks()[:10]
    request = make_request(coord, "r", [0] * (8 * 16))
    free_before = coord.num_free_blocks
    new = coord.allocate_slots(
        request, 16, 5 * 16, KVCacheBlocks((head[:5], head[5:], [])), 0, num_external_computed_tokens=2 * 16
    )
    assert new is not None
    full, window, ring_blocks = coord.get_block_ids("r")
    flat = full + window + ring_blocks
    assert len(set(flat)) == len(flat) == 17, coord.get_block_ids("r")
    assert full[:5] == [b.block_id for b in head[:5]] and window[:5] == [b.block_id for b in head[5:]]
    assert len(ring_blocks) == 1
    assert coord.num_free_blocks == free_before - 17
    coord.check_invariants()
    coord.free(request)
    coord.check_invariants()


def test_a_single_group_takes_its_hit_then_its_external_blocks() -> None:
    coord = make_coordinator([full_spec()], 20)
    head = coord.block_pool.free_block_queue.get_all_free_blocks()[:3]
    request = make_request(coord, "r", [0] * (6 * 16))
    assert (
        coord.allocate_slots(
            request, 16, 3 * 16, KVCacheBlocks((head,)), 0, num_external_computed_tokens=2 * 16
        )
        is not None
    )
    (blocks,) = coord.get_block_ids("r")
    assert blocks[:3] == [b.block_id for b in head] and len(set(blocks)) == len(blocks) == 6
    coord.check_invariants()


def _zeroing_coordinator(zero: tuple[bool, ...] | None) -> KVCacheCoordinator:
    return KVCacheCoordinator(
        make_config([full_spec(), sw_spec(4096)], 40),
        SchedulerLimits(max_model_len=8192),
        zero_new_blocks=zero,
    )


@pytest.mark.parametrize("skip", [(), (0,), (1,), (0, 1)])
def test_blocks_for_an_asynchronous_load_are_not_reported_for_zeroing(skip: tuple[int, ...]) -> None:
    """vLLM 0.34: the groups an asynchronous load writes (``skip_zeroing_group_ids``) do not report their
    external-token blocks for zeroing (zeroing would race the load); the blocks for new tokens still are."""
    coord = _zeroing_coordinator(
        (True, True)
    )  # every attention group zeroes, as 0.34 when the model needs it
    request = make_request(coord, "r", [0] * (4 * 16))
    new = coord.allocate_slots(
        request, 16, 0, None, 0, num_external_computed_tokens=2 * 16, skip_zeroing_group_ids=skip
    )
    assert new is not None
    reported = set(coord.take_new_block_ids())
    for gid, ids in enumerate(coord.get_block_ids("r")):
        external, fresh = set(ids[:2]), set(ids[2:])
        assert fresh <= reported
        assert (external & reported) == (set() if gid in skip else external)
    coord.check_invariants()


def test_zeroing_follows_the_engine_policy_over_the_traits() -> None:
    """By default the spec's ``zero_new_blocks`` trait decides (full attention yes, sliding window no, as
    vLLM 0.23); ``zero_new_blocks=`` sets it per group; a list of the wrong length is refused."""
    for zero, expected in ((None, (True, False)), ((False, True), (False, True))):
        coord = _zeroing_coordinator(zero)
        request = make_request(coord, "r", [0] * 32)
        assert coord.allocate_slots(request, 32) is not None
        reported = set(coord.take_new_block_ids())
        assert tuple(set(ids) <= reported for ids in coord.get_block_ids("r")) == expected
        assert tuple(bool(set(ids) & reported) for ids in coord.get_block_ids("r")) == expected
    with pytest.raises(UnsupportedConfigurationError, match="zero_new_blocks has 1 entries for 2"):
        _zeroing_coordinator((True,))


def _mamba_coordinator(num_blocks: int) -> KVCacheCoordinator:
    from kvspec import MambaSpec
    from kvspec.planning.config import KVCacheConfig, KVCacheGroupSpec

    mamba = MambaSpec(block_size=16, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align")
    groups = (
        KVCacheGroupSpec(layer_names=("attn",), kv_cache_spec=full_spec()),
        KVCacheGroupSpec(layer_names=("mamba",), kv_cache_spec=mamba),
    )
    return KVCacheCoordinator(
        KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=(), kv_cache_groups=groups),
        SchedulerLimits(max_model_len=4096, mamba_cache_mode="align"),
        enable_caching=True,
    )


@pytest.mark.parametrize("spare", [0, 1])
def test_an_external_load_past_a_mamba_hit_counts_the_loaded_states_block(spare: int) -> None:
    """An admission with 8 blocks of external tokens and one block to compute: full attention takes 9
    blocks, Mamba two (the loaded state's block behind null placeholders, and the running state's). The
    count says so: with one block short the admission waits (None, nothing taken) instead of the pool
    raising half-way (vLLM 0.34 counts one Mamba block here)."""
    coord = _mamba_coordinator(1 + 10 + spare)  # the null block, then 10 or 11 usable
    request = make_request(coord, "r", [7] * (10 * 16))
    free = coord.num_free_blocks
    new = coord.allocate_slots(request, 16, 0, None, 0, num_external_computed_tokens=8 * 16)
    if not spare:
        assert new is None and coord.num_free_blocks == free
        assert coord.get_block_ids("r") == ([], [])
    else:
        assert new is not None and coord.num_free_blocks == free - 11
        full, mamba = coord.get_block_ids("r")
        assert len(full) == 9 and len([b for b in mamba if b != 0]) == 2
    coord.check_invariants()
