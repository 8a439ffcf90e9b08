"""vLLM 0.34's circular buffer (issue 19, item 2): one ring block per request from its first allocation to
its free, never cached nor hit, beside groups that cache and hit as usual."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvspec import CircularBufferManager, CircularBufferSpec, SchedulerLimits, SlidingWindowMLASpec
from kvspec.errors import SpecValidationError
from kvspec.testing import check_plugin
from tests.helpers import full_spec, make_coordinator, make_request

RING = CircularBufferSpec(block_size=32, num_kv_heads=2, head_size=16, dtype=torch.float16)


def test_one_ring_block_per_request_for_its_whole_life() -> None:
    coord = make_coordinator([full_spec(), RING], 64, max_model_len=1024)
    request = make_request(coord, "a", list(range(1, 101)))
    new = coord.allocate_slots(request, 64, 0, None)
    assert new is not None
    full_ids, ring_ids = (list(g) for g in new.get_block_ids())
    assert len(full_ids) == 4 and len(ring_ids) == 1  # 64 tokens: 4 full-attention blocks, one ring
    request.num_computed_tokens = 64
    for _ in range(3):  # the rest of the prompt, then decode far past the ring's capacity
        new = coord.allocate_slots(request, request.num_tokens - request.num_computed_tokens, 0, None)
        assert new is not None and list(new.get_block_ids()[1]) == []
        request.num_computed_tokens = request.num_tokens
        request.append_output_token_ids([7] * 40)
    assert [len(g) for g in coord.get_block_ids("a")] == [12, 1]  # 180 tokens computed: cdiv(180, 16) blocks
    assert list(coord.get_block_ids("a")[1]) == ring_ids
    coord.free(request)
    assert coord.block_pool.get_num_free_blocks() == 63


def test_the_other_group_hits_and_the_ring_is_fresh() -> None:
    coord = make_coordinator([full_spec(), RING], 64, max_model_len=1024)
    prompt = list(range(1, 65))
    first = make_request(coord, "a", [*prompt, 1])
    assert coord.allocate_slots(first, 65, 0, None) is not None
    first.num_computed_tokens = 65
    coord.cache_blocks(first, 65)
    second = make_request(coord, "b", [*prompt, 2])
    hit_blocks, hit = coord.get_computed_blocks(second)
    assert hit == 64 and [len(g) for g in hit_blocks.get_block_ids()] == [4, 0]
    new = coord.allocate_slots(second, 1, hit, hit_blocks)
    assert new is not None and len(new.get_block_ids()[1]) == 1
    assert coord.get_block_ids("b")[1] != coord.get_block_ids("a")[1]


def test_memory_bound_is_one_page_and_the_kit_passes() -> None:
    assert RING.max_memory_usage_bytes(SchedulerLimits(max_model_len=1 << 20)) == RING.page_size_bytes
    assert RING.kv_cache_traits().prefix_cacheable is False
    check_plugin(RING, CircularBufferManager)


def test_a_keys_only_ring_holds_half_the_bytes() -> None:
    """vLLM 0.34's compressor state stores keys only (``head_size_v=0``); None keeps a V beside each K."""
    keys_only = CircularBufferSpec(
        block_size=4, num_kv_heads=1, head_size=8, head_size_v=0, dtype=torch.bfloat16
    )
    both = CircularBufferSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
    assert (keys_only.page_size_bytes, both.page_size_bytes) == (4 * 8 * 2, 4 * 16 * 2)
    with pytest.raises(SpecValidationError, match="head_size_v must be None or an int >= 0"):
        CircularBufferSpec(block_size=4, num_kv_heads=1, head_size=8, head_size_v=-1, dtype=torch.bfloat16)


def test_hashes_are_taken_over_the_groups_that_are_cached() -> None:
    """A ring (or a replayed window) is never hit: its block size does not bound the hash block, which is
    the GCD of the cached groups' blocks (vLLM 0.34's hashing sizes)."""
    ring = CircularBufferSpec(block_size=24, num_kv_heads=1, head_size=8, dtype=torch.float16)
    coord = make_coordinator([full_spec(block_size=32), ring], 64, max_model_len=1024)
    assert (coord.scheduler_block_size, coord.hash_block_size) == (96, 32)


def test_a_replayed_window_is_left_out_of_caching_and_hits() -> None:
    """``SlidingWindowMLASpec(bounded_replay=True)``: the engine recomputes the window after a hit, so the
    group is not cached, not searched, and gets fresh blocks; ``prefix_replay_tokens`` is the window."""
    window = SlidingWindowMLASpec(
        block_size=16,
        num_kv_heads=1,
        head_size=8,
        dtype=torch.float16,
        sliding_window=32,
        bounded_replay=True,
    )
    assert window.kv_cache_traits().prefix_cacheable is False and window.prefix_replay_tokens == 32
    assert dataclasses.replace(window, bounded_replay=False).prefix_replay_tokens == 0
    coord = make_coordinator([full_spec(block_size=16), window], 64, max_model_len=1024)
    first = make_request(coord, "a", list(range(1, 66)))
    assert coord.allocate_slots(first, 65) is not None
    first.num_computed_tokens = 65
    second = make_request(coord, "b", [*range(1, 65), 9])
    hit_blocks, hit = coord.get_computed_blocks(second)
    assert hit == 64 and [len(g) for g in hit_blocks.get_block_ids()] == [4, 0]
    assert all(b.block_hash is None for b in coord.get_blocks("a").blocks[1])
    coord.check_invariants()
