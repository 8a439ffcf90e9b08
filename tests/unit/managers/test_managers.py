"""Single-type managers: hit searches, skipped-block freeing and allocation predictions (vLLM §9.2)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvspec import (
    BlockHasher,
    BlockPool,
    ChunkedLocalAttentionManager,
    ChunkedLocalAttentionSpec,
    CrossAttentionManager,
    CrossAttentionSpec,
    FullAttentionSpec,
    HitQuery,
    KVCacheBlock,
    ManagerContext,
    Request,
    SingleTypeKVCacheManager,
    SlidingWindowManager,
    SlidingWindowSpec,
    UnsupportedConfigurationError,
)
from kvspec.blocks.hashing import BlockHash
from kvspec.contracts.traits import traits_of
from kvspec.errors import SchedulingError, SpecValidationError
from tests.helpers import ids

BS = 2


def sw_manager(window: int = 4, num_blocks: int = 100, cap: int | None = 10**9) -> SlidingWindowManager:
    spec = SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=window
    )
    pool = BlockPool(num_blocks, hash_block_size=BS)
    return SlidingWindowManager(ManagerContext.for_spec(spec, pool, max_admission_blocks_per_request=cap))


def chunked_manager(chunk: int = 4, num_blocks: int = 100) -> ChunkedLocalAttentionManager:
    spec = ChunkedLocalAttentionSpec(
        block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32, attention_chunk_size=chunk
    )
    pool = BlockPool(num_blocks, hash_block_size=BS)
    return ChunkedLocalAttentionManager(
        ManagerContext.for_spec(spec, pool, max_admission_blocks_per_request=10**9)
    )


def query(
    manager: SingleTypeKVCacheManager, hashes: list[BlockHash], max_length: int, use_eagle: bool = False
) -> HitQuery:
    return HitQuery(
        block_hashes=hashes,
        max_length=max_length,
        kv_cache_group_ids=(0,),
        block_pool=manager.block_pool,
        kv_cache_spec=manager.kv_cache_spec,
        traits=manager.traits,
        use_eagle=use_eagle,
        alignment_tokens=BS,
    )


def cache_pattern(pool: BlockPool, pattern: list[bool]) -> list[BlockHash]:
    """Insert a cached block for every True position; return the hashes of all positions."""
    hashes = [BlockHash(i.to_bytes(8, "big")) for i in range(len(pattern))]
    for i, cached in enumerate(pattern):
        if cached:
            (block,) = pool.get_new_blocks(1)
            key = hashes[i] + (0).to_bytes(4, "big")
            block.block_hash = key
            pool.cached_block_hash_to_block.insert(key, block)
    return hashes


@pytest.mark.parametrize(
    ("pattern", "tail", "expected_blocks", "expected_real"),
    [
        ([True, True, False, True, False, False, True, True, False, True, True, True], 0, 12, [10, 11]),
        ([True, True, False, True, False, False, True, True, False, False, False, False], 0, 8, [6, 7]),
        ([True, True, False, True, False, False, True, True, False, True, False, False], 1, 8, [6, 7]),
        ([False, True, True, False], 0, 3, [1, 2]),
        ([True, False, True, False], 0, 1, [0]),  # no window-long run: the run starting at block 0
        ([False, False, False], 1, 0, []),
        ([True], 1, 1, [0]),
    ],
)
def test_sliding_window_possible_cached_prefix(
    pattern: list[bool], tail: int, expected_blocks: int, expected_real: list[int]
) -> None:
    manager = sw_manager(window=4)
    pool = manager.block_pool
    hashes = cache_pattern(pool, pattern)
    (hit,) = SlidingWindowManager.find_longest_cache_hit(
        query(manager, hashes, len(pattern) * BS + tail)
    ).blocks
    assert len(hit) == expected_blocks
    assert [i for i, b in enumerate(hit) if not b.is_null] == expected_real


@pytest.mark.parametrize(
    ("pattern", "max_length", "expected_blocks", "expected_real"),
    [
        ([True, True, True, True, True], 10, 5, [4]),
        ([True, True, True, True, False], 10, 4, []),
        ([False] * 6, 12, 6, []),
        ([True] * 6, 11, 5, [4]),
        ([True, False, True], 6, 3, [2]),
        ([True, True, False], 6, 2, []),
        ([True, True, True], 5, 2, []),
        ([True, True], 3, 1, [0]),
        ([False, True], 3, 0, []),
        ([True, True, True, False, True], 9, 4, []),
    ],
)
def test_chunked_local_attention_possible_cached_prefix(
    pattern: list[bool], max_length: int, expected_blocks: int, expected_real: list[int]
) -> None:
    manager = chunked_manager(chunk=4)
    pool = manager.block_pool
    hashes = cache_pattern(pool, pattern)
    (hit,) = ChunkedLocalAttentionManager.find_longest_cache_hit(query(manager, hashes, max_length)).blocks
    assert len(hit) == expected_blocks
    assert [i for i, b in enumerate(hit) if not b.is_null] == expected_real
    with pytest.raises(UnsupportedConfigurationError, match="eagle"):
        ChunkedLocalAttentionManager.find_longest_cache_hit(
            query(manager, hashes, max_length, use_eagle=True)
        )


def _allocate(
    manager: SlidingWindowManager | ChunkedLocalAttentionManager, n_blocks: int
) -> list[KVCacheBlock]:
    return manager.allocate_new_blocks("r", n_blocks * BS, n_blocks * BS)


@pytest.mark.parametrize(("computed", "nulls"), [(0, 0), (4, 2), (6, 2), (12, 6)])
def test_chunked_local_attention_remove_skipped_blocks(computed: int, nulls: int) -> None:
    manager = chunked_manager(chunk=4)
    _allocate(manager, 8)
    manager.remove_skipped_blocks("r", computed)
    blocks = manager.get_blocks("r")
    assert [b.is_null for b in blocks] == [True] * nulls + [False] * (8 - nulls)


def test_sliding_window_remove_skipped_blocks() -> None:
    manager = sw_manager(window=4)
    pool = manager.block_pool
    original = _allocate(manager, 6)
    blocks = manager.get_blocks("r")

    def nulls() -> list[int]:
        return [i for i, b in enumerate(blocks) if b.is_null]

    manager.remove_skipped_blocks("r", 4)
    assert nulls() == []  # block 0 still holds token 1, which token 4 attends to
    manager.remove_skipped_blocks("r", 5)
    assert nulls() == [0]
    assert original[0].ref_cnt == 0
    manager.remove_skipped_blocks("r", 6)
    assert nulls() == [0]
    manager.remove_skipped_blocks("r", 7)
    assert nulls() == [0, 1]
    manager.remove_skipped_blocks("r", 11)
    assert nulls() == [0, 1, 2, 3]
    # uncached scratch blocks go to the head, the tail block first
    assert ids(pool.free_block_queue.get_all_free_blocks())[:4] == [4, 3, 2, 1]


def test_retained_tokens_below_the_window_are_freed_that_much_later() -> None:
    """vLLM 0.34's ``extra_retained_tokens``: with 3 tokens kept below a 4-token window, block 0 (tokens
    0-1) is freed at 8 computed tokens, not 5; a request may hold 3 tokens more (one more block here)."""
    spec = SlidingWindowSpec(
        block_size=BS,
        num_kv_heads=1,
        head_size=1,
        dtype=torch.float32,
        sliding_window=4,
        extra_retained_tokens=3,
    )
    pool = BlockPool(100, hash_block_size=BS)
    manager = SlidingWindowManager(
        ManagerContext.for_spec(spec, pool, max_admission_blocks_per_request=10**9)
    )
    _allocate(manager, 6)
    blocks = manager.get_blocks("r")
    assert [manager.get_num_skipped_tokens(n) for n in (4, 6, 7, 8, 11)] == [0, 0, 1, 2, 5]
    manager.remove_skipped_blocks("r", 7)
    assert not any(b.is_null for b in blocks)  # 1 token skipped: block 0 still holds token 1
    manager.remove_skipped_blocks("r", 8)
    assert [b.is_null for b in blocks] == [True] + [False] * 5
    plain = dataclasses.replace(spec, extra_retained_tokens=0)
    assert (
        spec.max_admission_blocks_per_request(8, 1000)
        == plain.max_admission_blocks_per_request(8, 1000) + 1
        == 8
    )
    assert traits_of(spec).extra_retained_tokens == 3 and traits_of(plain).extra_retained_tokens == 0
    with pytest.raises(SpecValidationError, match="extra_retained_tokens must be an int >= 0"):
        dataclasses.replace(spec, extra_retained_tokens=-1)


def test_get_num_blocks_to_allocate_counts_evictable_hits() -> None:
    for manager in (sw_manager(window=4), chunked_manager(chunk=4)):
        pool = manager.block_pool
        cached = pool.get_new_blocks(10)
        pool.free_blocks(cached)
        assert manager.get_num_blocks_to_allocate("1", 20 * BS, cached, 0, 20 * BS) == 20
        mixed = [pool.null_block] * 5 + cached[5:]
        assert manager.get_num_blocks_to_allocate("2", 20 * BS, mixed, 0, 20 * BS) == 15


def test_evictable_cached_blocks_not_double_allocated() -> None:
    manager = sw_manager(window=4)
    pool = manager.block_pool
    (hit,) = pool.get_new_blocks(1)
    pool.free_blocks([hit])
    assert manager.get_num_blocks_to_allocate("r", 2 * BS, [hit], 0, 2 * BS) == 2
    before = pool.get_num_free_blocks()
    manager.allocate_new_computed_blocks("r", [hit], BS, 0)
    new = manager.allocate_new_blocks("r", 2 * BS, 2 * BS)
    assert len(new) == 1 and len(manager.get_blocks("r")) == 2
    assert pool.get_num_free_blocks() == before - 2


def test_predictor_matches_allocator_with_admission_cap() -> None:
    manager = sw_manager(window=8, cap=4)
    pool = manager.block_pool
    req = Request("r", list(range(64)), block_hasher=BlockHasher(BS, seed="m"))
    computed = 0
    for step in (4, 8, 12, 16):
        manager.remove_skipped_blocks("r", computed)
        total = computed + step
        predicted = manager.get_num_blocks_to_allocate("r", total, [], computed, total)
        free_before = pool.get_num_free_blocks()
        if computed == 0:
            manager.allocate_new_computed_blocks("r", [], 0, 0)
        new = manager.allocate_new_blocks("r", total, total)
        assert predicted == len(new) == free_before - pool.get_num_free_blocks()
        manager.cache_blocks(req, total)
        capped = manager.get_num_blocks_to_allocate("x", 64, [], 0, 64, apply_admission_cap=True)
        assert capped == 4  # a new request is admitted against the cap, not its full length
        computed = total
    live = [b for b in manager.get_blocks("r") if not b.is_null]
    assert len(live) <= manager.kv_cache_spec.max_admission_blocks_per_request(16, 64)  # type: ignore[attr-defined]


def test_cross_attention_takes_no_computed_blocks() -> None:
    """Cross attention's encoder blocks come with the encoder tokens: admission attaches nothing, and a hit
    block offered to it is refused before anything changes."""
    spec = CrossAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    pool = BlockPool(10, hash_block_size=BS)
    manager = CrossAttentionManager(ManagerContext.for_spec(spec, pool))
    manager.allocate_new_computed_blocks("r", (), 0, 4)  # external tokens bring no block either
    assert "r" not in manager.req_to_blocks and "r" not in manager.num_cached_block
    assert pool.get_num_free_blocks() == 9
    hit = pool.get_new_blocks(1)
    with pytest.raises(SchedulingError, match=r"^Cross attention never has prefix-hit blocks\.$"):
        manager.allocate_new_computed_blocks("r", hit, BS, 0)
    assert "r" not in manager.req_to_blocks and hit[0].ref_cnt == 1
    assert ids(manager.allocate_new_blocks("r", 3, 3)) == [2, 3]


@pytest.mark.parametrize(
    ("manager_cls", "trait"),
    [(SlidingWindowManager, "sliding_window"), (ChunkedLocalAttentionManager, "attention_chunk_size")],
)
def test_window_managers_refuse_a_spec_without_their_span(
    manager_cls: type[SingleTypeKVCacheManager], trait: str
) -> None:
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    context = ManagerContext.for_spec(spec, BlockPool(10, hash_block_size=BS))
    with pytest.raises(UnsupportedConfigurationError) as err:
        manager_cls(context)
    assert str(err.value) == (
        f"{manager_cls.__name__} runs specs that declare SpecTraits.{trait}; FullAttentionSpec declares None."
    )
