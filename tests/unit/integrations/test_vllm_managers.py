"""kvspec's managers behind vLLM 0.34.0's manager and pool signatures (``vllm_style(cls, "0.34.0")``,
``Vllm034BlockPool``), as vLLM's own test_single_type_kv_cache_manager.py builds them (no vLLM needed)."""

from __future__ import annotations

import pytest
import torch

from kvspec import CircularBufferManager, CircularBufferSpec, SlidingWindowManager, SlidingWindowSpec
from kvspec.blocks.hashing import BlockHash, make_block_hash_with_group_id
from kvspec.integrations.vllm_kv_cache_manager import Vllm034BlockPool
from kvspec.integrations.vllm_managers import Vllm034StyleManager, VllmStyleManager, vllm_style

A = dict(num_kv_heads=1, head_size=8, dtype=torch.float16)


def test_the_034_pool_runs_the_034_rules() -> None:
    pool = Vllm034BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=2)
    assert pool.coarse_hash_is_last_fine and pool.free_unhashed_first and pool.hash_block_size == 2


def test_a_hit_search_takes_the_pools_finer_hashes_and_returns_its_length() -> None:
    """A 4-token sliding-window block over 2-token hashes: each block is keyed by the last fine hash of its
    span; the 0.34 form returns the blocks and the hit's tokens."""
    spec = SlidingWindowSpec(block_size=4, sliding_window=8, **A)  # type: ignore[arg-type]
    pool = Vllm034BlockPool(num_gpu_blocks=20, enable_caching=True, hash_block_size=2)
    hashes = [BlockHash(str(i).encode()) for i in range(4)]
    for fine, block in zip((hashes[1], hashes[3]), pool.blocks[10:12], strict=True):
        pool.cached_block_hash_to_block.insert(make_block_hash_with_group_id(fine, 0), block)
    manager = vllm_style(SlidingWindowManager, "0.34.0")
    blocks, tokens = manager.find_longest_cache_hit(hashes, 8, [0], pool, spec, False, 2)
    assert tokens == 8 and blocks[0] == pool.blocks[10:12]
    # The 0.23 form (no finer hashes, blocks only) is a different class over the same manager.
    assert vllm_style(SlidingWindowManager) is not manager and issubclass(manager, Vllm034StyleManager)
    assert not issubclass(vllm_style(SlidingWindowManager), Vllm034StyleManager)
    assert issubclass(vllm_style(SlidingWindowManager), VllmStyleManager)


def test_a_ring_takes_one_block_for_external_tokens_and_is_never_zeroed() -> None:
    ring = CircularBufferSpec(block_size=4, **A)  # type: ignore[arg-type]
    pool = Vllm034BlockPool(num_gpu_blocks=10, enable_caching=True, hash_block_size=4)
    manager = vllm_style(CircularBufferManager, "0.34.0")(
        ring, pool, True, 0, 4, needs_kv_cache_zeroing=True, max_admission_blocks_per_request=1
    )
    free = pool.get_num_free_blocks()
    manager.allocate_external_computed_blocks("r", 16, 4)
    assert len(manager.req_to_blocks["r"]) == 1 and pool.get_num_free_blocks() == free - 1
    assert not manager.records_new_block_ids and manager.take_new_block_ids() == []
    assert manager.allocate_new_blocks("r", 20, 20) == []
    assert manager.get_num_blocks_to_allocate("r", 40, [], 20, 20, 40) == 0
    manager.free("r")
    assert pool.get_num_free_blocks() == free


def test_the_034_pool_takes_partial_entries_in_vllms_form_and_names_their_secondary_keys() -> None:
    """vLLM 0.34's ``cache_partial_block(..., block_size)`` and ``cached_block_hashes_by_block``: a tail
    entry on a block without a hash becomes its hash (no secondary key); once the block is full its entry
    comes back as a secondary key, listed per block until the block is evicted."""
    from kvspec import Request
    from kvspec.blocks.hashing import BlockHasher
    from kvspec.errors import BlockPoolError

    pool = Vllm034BlockPool(num_gpu_blocks=6, enable_caching=True, hash_block_size=2)
    r = Request("r", list(range(7)), block_hasher=BlockHasher(2))
    first, tail = pool.get_new_blocks(2)
    pool.cache_full_blocks(r, [first, tail], 0, 1, 4, 0)
    key = pool.cache_partial_block(request=r, block=tail, num_tokens=6, kv_cache_group_id=0, block_size=4)
    assert key == make_block_hash_with_group_id(r.block_hashes[2], 0) and tail.block_hash == key
    assert pool.cached_block_hashes_by_block == {}
    r.append_output_token_ids([7])
    pool.cache_full_blocks(r, [first, tail], 1, 2, 4, 0)  # promoted: the tail entry is dropped
    assert pool.get_cached_block(r.block_hashes[2], [0]) is None
    pool.cache_partial_block(request=r, block=tail, num_tokens=6, kv_cache_group_id=0, block_size=4)
    assert pool.cached_block_hashes_by_block == {tail.block_id: {key}}
    assert pool.get_cached_block(r.block_hashes[2], [0]) == [tail]
    pool.cached_block_hashes_by_block[tail.block_id].clear()  # a copy: the pool's map is untouched
    assert pool.cached_block_hashes_by_block == {tail.block_id: {key}}
    pool.evict_blocks({tail.block_id})
    assert pool.cached_block_hashes_by_block == {} and pool.get_cached_block(r.block_hashes[2], [0]) is None
    with pytest.raises(BlockPoolError, match=r"group block size \(3 tokens\) must be a multiple"):
        pool.cache_partial_block(request=r, block=first, num_tokens=2, kv_cache_group_id=0, block_size=3)
    pool.check_invariants()
