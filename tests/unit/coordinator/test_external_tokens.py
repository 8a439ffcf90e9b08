"""Tokens a connector loads (external computed tokens) beside a local prefix hit, in a hybrid model: every
group's hit blocks are taken before any group allocates blocks for the external tokens (vLLM 0.34's
two-phase attachment, vLLM issue #33775). Taking them group by group let an earlier group's allocation
evict a later group's hit block from the free queue and hand the same block out twice."""

from __future__ import annotations

from kvspec import KVCacheBlocks
from tests.helpers import full_spec, make_coordinator, make_request, sw_spec


def _flat(coord: object, request_id: str) -> list[int]:
    return [b for group in coord.get_block_ids(request_id) for b in group]  # type: ignore[attr-defined]


def test_external_blocks_never_take_another_groups_hit_blocks() -> None:
    coord = make_coordinator([full_spec(), sw_spec(4096)], 40)
    head = coord.block_pool.free_block_queue.get_all_free_blocks()[:10]
    # Hit blocks at the free queue's head (evictable, ref count 0): group 1's sit right behind group 0's.
    hits = KVCacheBlocks((head[:5], head[5:]))
    request = make_request(coord, "r", [0] * (8 * 16))
    free_before = coord.num_free_blocks
    new = coord.allocate_slots(request, 16, 5 * 16, hits, 0, 2 * 16)
    assert new is not None
    flat = _flat(coord, "r")
    assert len(set(flat)) == len(flat) == 16, coord.get_block_ids("r")
    full, window = coord.get_block_ids("r")
    assert full[:5] == [b.block_id for b in head[:5]] and window[:5] == [b.block_id for b in head[5:]]
    # 10 hit blocks leave the queue, 2 x (2 external + 1 new) fresh ones are taken after them.
    assert coord.num_free_blocks == free_before - 16
    assert all(coord.block_pool.blocks[i].ref_cnt == 1 for i in flat)
    coord.check_invariants()


def test_a_single_group_takes_its_hit_then_its_external_blocks() -> None:
    coord = make_coordinator([full_spec()], 20)
    head = coord.block_pool.free_block_queue.get_all_free_blocks()[:3]
    request = make_request(coord, "r", [0] * (6 * 16))
    assert coord.allocate_slots(request, 16, 3 * 16, KVCacheBlocks((head,)), 0, 2 * 16) is not None
    (blocks,) = coord.get_block_ids("r")
    assert blocks[:3] == [b.block_id for b in head] and len(set(blocks)) == len(blocks) == 6
    coord.check_invariants()
