"""Sub-block prefix hits with copy on write (vLLM 0.34's partial hash hits), through kvspec's own API.

A Mamba "align" group whose block (4 or 8 tokens) is larger than the hash block (2 tokens) keys the state at
the prompt's last hash boundary even inside its block; a later request hits there and writes on into a
private copy of the shared block, and the request that computed the state moves the cache entry to a copy
instead (it goes on writing its own block). The numbers are vLLM 0.34.0's on the same calls
(tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py, which ``nox -s vllm034`` runs on kvspec).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from kvspec import KVCacheBlock, KVCacheCoordinator, MambaSpec, Request, SchedulerLimits
from kvspec.blocks.eviction import BlockUse, EvictionContext
from kvspec.contracts.manager import BlockCopy, BoundaryState
from kvspec.contracts.release import VLLM_0_23
from kvspec.errors import SchedulingError
from kvspec.eviction.registry import resolve_eviction_policy
from tests.helpers import full_spec, make_config, sw_spec

HASH = 2


def _mamba(block_size: int) -> MambaSpec:
    return MambaSpec(
        block_size=block_size, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align"
    )


def _coordinator(
    full_block: int = HASH,
    mamba_block: int = 2 * HASH,
    num_blocks: int = 24,
    allow: bool = True,
    **kwargs: object,
) -> KVCacheCoordinator:
    return KVCacheCoordinator(
        make_config([full_spec(full_block), _mamba(mamba_block)], num_blocks),
        SchedulerLimits(max_model_len=8192),
        hash_block_size=HASH,
        allow_partial_hash_hits=allow,
        **kwargs,  # type: ignore[arg-type]
    )


def _request(coord: KVCacheCoordinator, request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, tokens, block_hasher=coord.make_block_hasher(seed="tests"))


def _allocate(
    coord: KVCacheCoordinator, request: Request, num_new: int, hit: tuple[object, int] | None = None
) -> tuple[list[int], ...]:
    blocks, num_hit = (None, 0) if hit is None else hit
    new = coord.allocate_slots(request, num_new, num_hit, blocks)  # type: ignore[arg-type]
    assert new is not None
    coord.check_invariants()
    return tuple(list(g) for g in new.get_block_ids())


def _cached(coord: KVCacheCoordinator, request: Request, num_tokens: int, group: int) -> list[int]:
    """Blocks of ``group`` cached under the request's prefix of ``num_tokens`` tokens (its fine hash)."""
    hit = coord.block_pool.get_cached_block(request.block_hashes[num_tokens // HASH - 1], (group,))
    return [] if hit is None else [b.block_id for b in hit]


def test_sub_block_hits_apply_only_where_vllm_turns_them_on() -> None:
    on = _coordinator()
    assert on.partial_hash_hits and on.cache_hit_alignment_tokens == HASH
    assert on.scheduler_block_size == 2 * HASH
    # Opt-in: the engine must run the block copies.
    off = _coordinator(allow=False)
    assert not off.partial_hash_hits and off.cache_hit_alignment_tokens == 2 * HASH
    # The Mamba block is the hash block: nothing to hit inside it.
    assert not _coordinator(mamba_block=HASH).partial_hash_hits
    # A sliding window searches by its own block only, and that block is not the hash block.
    with_window = KVCacheCoordinator(
        make_config([full_spec(HASH), sw_spec(8, block_size=2 * HASH), _mamba(2 * HASH)], 24),
        SchedulerLimits(max_model_len=8192),
        hash_block_size=HASH,
        allow_partial_hash_hits=True,
    )
    assert not with_window.partial_hash_hits
    # vLLM 0.23 has no partial entries to hit.
    assert not _coordinator(profile=VLLM_0_23).partial_hash_hits


def test_a_hit_inside_a_mamba_block_writes_into_a_private_copy() -> None:
    coord = _coordinator()
    producer = _request(coord, "p", [0, 0, 1, 1, 2, 2, 3])
    hit = coord.get_computed_blocks(producer)
    assert hit[1] == 0
    _allocate(coord, producer, 6, hit)
    # The prompt's last hash boundary (6 tokens) ends inside Mamba block 1 (tokens 4-7): keyed there.
    state = coord.get_blocks("p").blocks[1][1]
    assert _cached(coord, producer, 6, 1) == [state.block_id] and state.block_hash_num_tokens == 6
    coord.free(producer)
    coord.new_step_starts()
    assert coord.take_block_copies() == ([], [])

    consumer = _request(coord, "c", [0, 0, 1, 1, 2, 2, 3, 3])
    blocks, num_hit = coord.get_computed_blocks(consumer)
    assert num_hit == 6
    assert [len(g) for g in blocks.blocks] == [3, 2] and blocks.blocks[1][1] is state
    # The 4 hit blocks leave the free queue, full attention takes 1 block for tokens 6-7, and Mamba 1 for
    # its copy (the full-attention hit ends on its own 2-token block: no copy there).
    assert coord.get_num_blocks_to_allocate("c", 8, blocks.blocks, 6, 8, 0, num_local_computed_tokens=6) == 6
    free_before = coord.num_free_blocks
    new = _allocate(coord, consumer, 2, (blocks, num_hit))
    copy_block = coord.get_blocks("c").blocks[1][1]
    assert new[1] == [copy_block.block_id] and copy_block is not state
    assert coord.num_free_blocks == free_before - 6
    copies, held = coord.take_block_copies()
    assert copies == [
        BlockCopy(kv_cache_group_id=1, src_block_id=state.block_id, dst_block_id=copy_block.block_id)
    ]
    assert held == [state, copy_block]
    # The shared state keeps its entry; the copy is published once the request fills it (8 tokens).
    assert state.block_hash_num_tokens == 6 and _cached(coord, consumer, 6, 1) == [state.block_id]
    assert copy_block.block_hash_num_tokens == 8
    assert (state.ref_cnt, copy_block.ref_cnt) == (1, 2)
    coord.release_copied_blocks(held)
    coord.check_invariants()
    assert (state.ref_cnt, copy_block.ref_cnt) == (0, 1)


def test_the_producer_keeps_its_block_and_moves_the_entry_to_a_copy() -> None:
    coord = _coordinator()
    producer = _request(coord, "p", [0, 0, 1, 1, 2, 2, 3])
    _allocate(coord, producer, 6, coord.get_computed_blocks(producer))
    state = coord.get_blocks("p").blocks[1][1]
    # Not offered yet: the next forward pass overwrites the block; its copy is offered once made.
    assert coord.take_boundary_states() == []
    producer.num_computed_tokens = 6
    producer.append_output_token_ids(3)
    coord.new_step_starts()
    new = _allocate(coord, producer, 1)
    # No new Mamba block for the runner (its block table is append-only): it writes on into its block...
    assert new[1] == [] and coord.get_blocks("p").blocks[1][1] is state
    copies, held = coord.take_block_copies()
    (copy,) = copies
    assert copy.src_block_id == state.block_id and copy.dst_block_id != state.block_id
    # ...and the cache entry now names the copy, which the queued copy fills.
    assert state.block_hash is None
    assert _cached(coord, producer, 6, 1) == [copy.dst_block_id]
    target = coord.block_pool.blocks[copy.dst_block_id]
    assert target.block_hash_num_tokens == 6
    assert coord.take_boundary_states() == [
        BoundaryState(request_id="p", kv_cache_group_id=1, block_id=copy.dst_block_id, num_tokens=6)
    ]
    assert (state.ref_cnt, target.ref_cnt) == (2, 1)
    coord.release_copied_blocks(held)
    coord.check_invariants()
    # A hit on the moved entry waits a step: the copy has not run yet in this one.
    sibling = _request(coord, "s", [0, 0, 1, 1, 2, 2, 3, 3])
    blocks, num_hit = coord.get_computed_blocks(sibling)
    assert num_hit == 6
    assert coord.allocate_slots(sibling, 2, num_hit, blocks) is None
    coord.new_step_starts()
    assert coord.allocate_slots(sibling, 2, num_hit, blocks) is not None
    coord.check_invariants()


def test_a_full_attention_hit_inside_its_block_is_copied_too() -> None:
    # Full attention of 4-token blocks beside 8-token Mamba blocks: both hits end at token 6, inside a block.
    coord = _coordinator(full_block=4, mamba_block=8)
    assert coord.partial_hash_hits
    producer = _request(coord, "p", list(range(7)))
    _allocate(coord, producer, 6, coord.get_computed_blocks(producer))
    full_tail = coord.get_blocks("p").blocks[0][1]
    assert _cached(coord, producer, 6, 0) == [full_tail.block_id]
    coord.free(producer)
    coord.new_step_starts()

    consumer = _request(coord, "c", [*range(7), 99])
    blocks, num_hit = coord.get_computed_blocks(consumer)
    assert num_hit == 6 and [len(g) for g in blocks.blocks] == [2, 1]
    # The 3 hit blocks leave the free queue and each group takes one block for its copy (the tokens to 8 fit).
    assert (
        coord.get_num_blocks_to_allocate("c", 8, blocks.blocks, 6, 8, 0, num_local_computed_tokens=6) == 3 + 2
    )
    _allocate(coord, consumer, 2, (blocks, num_hit))
    copies, held = coord.take_block_copies()
    assert [c.kv_cache_group_id for c in copies] == [0, 1]
    assert copies[0].src_block_id == full_tail.block_id
    assert coord.get_blocks("c").blocks[0][1].block_id == copies[0].dst_block_id
    coord.release_copied_blocks(held)
    coord.check_invariants()


def test_releasing_a_block_not_held_for_a_copy_changes_nothing() -> None:
    coord = _coordinator()
    producer = _request(coord, "p", [0, 0, 1, 1, 2, 2, 3])
    _allocate(coord, producer, 6, coord.get_computed_blocks(producer))
    coord.free(producer)
    coord.new_step_starts()
    consumer = _request(coord, "c", [0, 0, 1, 1, 2, 2, 3, 3])
    blocks, num_hit = coord.get_computed_blocks(consumer)
    _allocate(coord, consumer, 2, (blocks, num_hit))
    _, held = coord.take_block_copies()
    stranger = coord.get_blocks("c").blocks[0][0]
    with pytest.raises(SchedulingError, match="not held for a block copy"):
        coord.release_copied_blocks([*held, stranger])
    coord.check_invariants()  # nothing released
    with pytest.raises(SchedulingError, match="not held for a block copy"):
        coord.release_copied_blocks([held[0], held[0]])
    coord.release_copied_blocks(held)
    coord.check_invariants()


def test_a_freed_producer_hands_its_tail_state_over_only_if_nothing_passed_it() -> None:
    coord = _coordinator()
    producer = _request(coord, "p", [0, 0, 1, 1, 2, 2, 3])
    _allocate(coord, producer, 6, coord.get_computed_blocks(producer))
    state = coord.get_blocks("p").blocks[1][1]
    assert coord.finalize_partial_tails("p", 6, num_in_flight_tokens=1) == []
    # Taken once: a second call has nothing.
    assert coord.finalize_partial_tails("p", 6) == []

    other = _request(coord, "q", [5, 5, 1, 1, 2, 2, 3])
    _allocate(coord, other, 6, coord.get_computed_blocks(other))
    other_state = coord.get_blocks("q").blocks[1][1]
    assert coord.finalize_partial_tails("q", 7) == []  # a later token was computed into the block
    assert state is not other_state

    third = _request(coord, "r", [6, 6, 1, 1, 2, 2, 3])
    _allocate(coord, third, 6, coord.get_computed_blocks(third))
    third_state = coord.get_blocks("r").blocks[1][1]
    assert coord.finalize_partial_tails("r", 6) == [
        BoundaryState(request_id="r", kv_cache_group_id=1, block_id=third_state.block_id, num_tokens=6)
    ]


def test_shared_prefix_checkpoints_need_sub_block_hits_and_eagle() -> None:
    assert _coordinator(use_eagle=True, shared_prefix_checkpoints=True).shared_prefix_checkpoints_apply
    assert not _coordinator(shared_prefix_checkpoints=True).shared_prefix_checkpoints_apply
    assert not _coordinator(
        use_eagle=True, shared_prefix_checkpoints=True, allow=False
    ).shared_prefix_checkpoints_apply


@pytest.mark.parametrize("enabled", [True, False])
def test_a_junction_inside_the_prompt_chunk_keys_the_state_there(enabled: bool) -> None:
    # 8-token Mamba blocks; the EAGLE prompt boundary of 9 tokens is 6, the junction 4 lies below it.
    coord = _coordinator(mamba_block=8, use_eagle=True, shared_prefix_checkpoints=enabled)
    request = _request(coord, "j", list(range(9)))
    request.shared_prefix_boundary = 4
    _allocate(coord, request, 4)
    state = coord.get_blocks("j").blocks[1][0]
    assert (state.block_hash_num_tokens == 4) is enabled
    assert (_cached(coord, request, 4, 1) == [state.block_id]) is enabled


def test_a_junction_past_the_prompt_keys_nothing() -> None:
    coord = _coordinator(mamba_block=8, use_eagle=True, shared_prefix_checkpoints=True)
    request = _request(coord, "j", list(range(9)))
    _allocate(coord, request, 9)
    request.num_computed_tokens = 9
    for token in range(5):
        request.append_output_token_ids(100 + token)
    # During decode the running state block changes in place: a key at 12 would promise a state it holds
    # only after the step's forward pass.
    request.shared_prefix_boundary = 12
    _allocate(coord, request, 3)
    running = coord.get_blocks("j").blocks[1][-1]
    assert running.block_hash_num_tokens != 12
    assert _cached(coord, request, 12, 1) == []


class _RecordingPolicy:
    """kvspec's LFU policy, recording what it is told was cached."""

    def __init__(self, context: EvictionContext) -> None:
        factory = resolve_eviction_policy("lfu")
        assert factory is not None
        self.inner = factory(context)
        self.cached: list[tuple[int, str]] = []

    def add(self, block: KVCacheBlock) -> None:
        self.inner.add(block)

    def remove(self, block: KVCacheBlock) -> None:
        self.inner.remove(block)

    def pop_victim(self) -> KVCacheBlock:
        return self.inner.pop_victim()

    def __len__(self) -> int:
        return len(self.inner)

    def evictable_blocks(self) -> list[KVCacheBlock]:
        return self.inner.evictable_blocks()

    def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        self.cached.extend((b.block_id, use.request_id) for b in blocks)
        self.inner.on_cached(blocks, use)

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        self.inner.on_hit(blocks, use)


def test_an_eviction_policy_learns_of_the_moved_entry() -> None:
    coord = _coordinator(eviction_policy=_RecordingPolicy)
    policy = coord.block_pool.eviction_policy
    assert isinstance(policy, _RecordingPolicy)
    producer = _request(coord, "p", [0, 0, 1, 1, 2, 2, 3])
    _allocate(coord, producer, 6, coord.get_computed_blocks(producer))
    producer.num_computed_tokens = 6
    producer.append_output_token_ids(3)
    policy.cached.clear()
    coord.new_step_starts()
    _allocate(coord, producer, 1)
    (copy,), held = coord.take_block_copies()
    assert (copy.dst_block_id, "p") in policy.cached
    coord.release_copied_blocks(held)
    coord.free(producer)
    coord.check_invariants()
    # The moved entry is evictable like any cached block once free.
    assert copy.dst_block_id in [b.block_id for b in coord.block_pool.free_block_queue.get_all_free_blocks()]
