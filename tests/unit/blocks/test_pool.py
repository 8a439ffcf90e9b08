"""The free queue, the prefix-cache map and the block pool, with a hypothesis model of the queue."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec import BlockPool, KVCacheBlock, Request
from kvspec.blocks.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvspec.blocks.pool import BlockHashToBlockMap, FreeKVCacheBlockQueue
from kvspec.errors import BlockPoolError, NotEnoughFreeBlocksError
from tests.helpers import ids


def queue_of(n: int) -> tuple[list[KVCacheBlock], FreeKVCacheBlockQueue]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


class TestBlock:
    def test_slots_and_repr(self) -> None:
        block = KVCacheBlock(3)
        assert not hasattr(block, "__dict__")
        with pytest.raises(AttributeError):
            block.other = 1  # type: ignore[attr-defined]
        assert "block_id=3" in repr(block)


class TestFreeQueue:
    def test_initial_order_and_popleft(self) -> None:
        blocks, q = queue_of(4)
        assert q.num_free_blocks == 4
        assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3]
        assert q.popleft() is blocks[0]
        assert blocks[0].prev_free_block is None and blocks[0].next_free_block is None
        assert ids(q.popleft_n(2)) == [1, 2]
        assert q.popleft_n(0) == []
        assert ids(q.get_all_free_blocks()) == [3]

    def test_remove_append_prepend(self) -> None:
        blocks, q = queue_of(5)
        q.remove(blocks[2])
        assert ids(q.get_all_free_blocks()) == [0, 1, 3, 4]
        q.append(blocks[2])
        assert ids(q.get_all_free_blocks()) == [0, 1, 3, 4, 2]
        taken = q.popleft_n(3)
        q.prepend_n(taken[::-1])
        assert ids(q.get_all_free_blocks()) == [3, 1, 0, 4, 2]
        q.append_n([])
        q.prepend_n([])
        assert q.num_free_blocks == 5

    def test_errors(self) -> None:
        blocks, q = queue_of(1)
        q.popleft()
        with pytest.raises(NotEnoughFreeBlocksError, match="No free blocks available"):
            q.popleft()
        with pytest.raises(NotEnoughFreeBlocksError):
            q.popleft_n(1)
        with pytest.raises(BlockPoolError, match="not free"):
            q.remove(blocks[0])

    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(
                    ["pop", "popn", "remove", "append", "appendn", "prepend", "share", "release"]
                ),
                st.integers(0, 7),
                st.booleans(),
            ),
            max_size=60,
        )
    )
    def test_matches_a_list_model(self, ops: list[tuple[str, int, bool]]) -> None:
        """The queue operations the pool runs (popleft_n for allocation, release for frees, remove for
        hits, prepend for scratch blocks) against a list model with reference counts."""
        blocks, q = queue_of(8)
        model = list(range(8))
        refs = [0] * 8  # a block out of the queue holds >= 1 reference, as the pool keeps it

        def taken(ids_: list[int]) -> None:
            for i in ids_:
                refs[i] = blocks[i].ref_cnt = 1

        for op, k, flag in ops:
            out = [i for i in range(8) if i not in model]
            if op == "pop" and model:
                first = q.popleft().block_id
                assert first == model.pop(0)
                taken([first])
            elif op == "popn" and model:
                n = min(k, len(model))
                got = ids(q.popleft_n(n))
                assert got == model[:n]
                del model[:n]
                taken(got)
            elif op == "take" and model:
                # What BlockPool.get_new_blocks runs: take into use (ref 1), collecting cached blocks.
                n = min(k, len(model))
                hashed: list[KVCacheBlock] = []
                took = q.take_n(n, hashed)
                assert ids(took) == model[:n]
                assert hashed == [blk for blk in took if blk.block_hash is not None]
                for blk in took:
                    refs[blk.block_id] = 1
                    blk.block_hash = None
                del model[:n]
            elif op == "hash" and model:
                blocks[model[k % len(model)]].block_hash = b"cached"
            elif op == "remove" and model:
                victim = model[k % len(model)]
                q.remove(blocks[victim])
                model.remove(victim)
                taken([victim])
            elif op == "append" and out:
                b = out[k % len(out)]
                refs[b] = blocks[b].ref_cnt = 0
                q.append(blocks[b])
                model.append(b)
            elif op == "appendn" and out:
                chosen = out[k % len(out) :][:3]
                for b in chosen:
                    refs[b] = blocks[b].ref_cnt = 0
                q.append_n([blocks[b] for b in chosen])
                model.extend(chosen)
            elif op == "prepend" and out:
                chosen = out[: k % 3 + 1]
                for b in chosen:
                    refs[b] = blocks[b].ref_cnt = 0
                q.prepend_n([blocks[i] for i in chosen])
                model[:0] = chosen
            elif op == "share" and out:
                b = out[k % len(out)]
                refs[b] += 1
                blocks[b].ref_cnt += 1
            elif op == "release" and out:
                # A request's blocks, tail first; a shared block stays held by its other holders.
                chosen = list(reversed(out[k % len(out) :]))
                reached_zero = []
                for b in chosen:
                    refs[b] -= 1
                    if refs[b] == 0:
                        reached_zero.append(b)
                q.release([blocks[b] for b in chosen], prepend=flag)
                if flag:
                    model[:0] = reached_zero
                else:
                    model.extend(reached_zero)
            assert ids(q.get_all_free_blocks()) == model
            assert q.num_free_blocks == len(model)
            assert [b.ref_cnt for b in blocks] == refs

    def test_release_never_queues_the_null_block(self) -> None:
        _, q = queue_of(3)
        taken = q.popleft_n(3)
        for b in taken:
            b.ref_cnt = 1
        taken[1].is_null = True
        q.release(taken)
        assert ids(q.get_all_free_blocks()) == [0, 2]


class TestHashMap:
    def test_single_block_per_key(self) -> None:
        m = BlockHashToBlockMap()
        b0 = KVCacheBlock(0)
        m.insert(b"k", b0)
        assert m.get_one_block(b"k") is b0 and len(m) == 1
        assert m.pop(b"k", 1) is None  # wrong id: put back
        assert m.get_one_block(b"k") is b0
        assert m.pop(b"k", 0) is b0 and len(m) == 0
        assert m.pop(b"missing", 0) is None

    def test_multiple_blocks_per_key(self) -> None:
        m = BlockHashToBlockMap()
        b0, b1, b2 = KVCacheBlock(0), KVCacheBlock(1), KVCacheBlock(2)
        for b in (b0, b1, b2):
            m.insert(b"k", b)
        assert m.get_one_block(b"k") is b0
        assert ids(m.blocks_for(b"k")) == [0, 1, 2]
        assert m.pop(b"k", 1) is b1
        assert ids(m.blocks_for(b"k")) == [0, 2]
        assert m.pop(b"k", 7) is None
        assert m.pop(b"k", 0) is b0
        assert m.get_one_block(b"k") is b2 and len(m) == 1


def req(tokens: list[int], block_size: int = 4) -> Request:
    from kvspec import BlockHasher

    return Request("r", tokens, block_hasher=BlockHasher(block_size, seed="p"))


class TestBlockPool:
    def test_null_block_and_usage(self) -> None:
        pool = BlockPool(5, hash_block_size=4)
        assert pool.null_block.block_id == 0 and pool.null_block.is_null
        assert pool.get_num_free_blocks() == 4
        blocks = pool.get_new_blocks(2)
        assert ids(blocks) == [1, 2] and all(b.ref_cnt == 1 for b in blocks)
        assert pool.get_usage() == 0.5
        with pytest.raises(NotEnoughFreeBlocksError, match="Cannot get 3 free blocks from the pool"):
            pool.get_new_blocks(3)
        assert BlockPool(1).get_usage() == 0.0
        with pytest.raises(BlockPoolError):
            BlockPool(0)

    def test_cache_touch_free_and_evict(self) -> None:
        pool = BlockPool(6, hash_block_size=4, enable_kv_cache_events=True)
        r = req(list(range(10)))
        blocks = pool.get_new_blocks(3)
        pool.cache_full_blocks(r, blocks, 0, 2, 4, 0)
        assert blocks[0].block_hash == r.block_hashes[0] + b"\0\0\0\0"
        assert blocks[2].block_hash is None
        assert pool.get_cached_block(r.block_hashes[1], [0]) == [blocks[1]]
        assert pool.get_cached_block(r.block_hashes[1], [0, 1]) is None
        (stored,) = pool.take_events()
        assert isinstance(stored, BlockStored)
        assert stored.block_hashes == r.block_hashes[:2] and stored.parent_block_hash is None
        assert stored.token_ids == list(range(8)) and stored.group_idx == 0
        pool.free_blocks(reversed(blocks))
        assert ids(pool.free_block_queue.get_all_free_blocks()) == [4, 5, 3, 2, 1]
        pool.touch([blocks[0]])
        assert blocks[0].ref_cnt == 1 and 1 not in ids(pool.free_block_queue.get_all_free_blocks())
        pool.free_blocks([blocks[0]])
        fresh = pool.get_new_blocks(5)  # evicts the two cached blocks
        assert ids(fresh) == [4, 5, 3, 2, 1]
        removed = pool.take_events()
        assert [type(e) for e in removed] == [BlockRemoved, BlockRemoved]
        assert all(b.block_hash is None for b in fresh)
        pool.check_invariants()

    @pytest.mark.parametrize("block_size", [4, 8])
    def test_a_cached_block_knows_the_prefix_its_hash_covers(self, block_size: int) -> None:
        """vLLM 0.34's KVCacheBlock.block_hash_num_tokens: block i of a request covers (i + 1) x its block
        size tokens while cached (also when its block is a multiple of the hash block); None once evicted
        or reset."""
        pool = BlockPool(8, hash_block_size=4)
        r = req(list(range(4 * block_size + 1)))
        blocks = pool.get_new_blocks(4)
        pool.cache_full_blocks(r, blocks, 0, 2, block_size, 0)
        pool.cache_full_blocks(r, blocks, 2, 3, block_size, 0)
        assert [b.block_hash_num_tokens for b in blocks] == [block_size, 2 * block_size, 3 * block_size, None]
        pool.check_invariants()
        pool.free_blocks([blocks[0]])
        pool.evict_blocks({blocks[0].block_id})
        assert blocks[0].block_hash is None and blocks[0].block_hash_num_tokens is None
        pool.free_blocks(blocks[1:])
        assert pool.reset_prefix_cache()
        assert all(b.block_hash_num_tokens is None for b in pool.blocks)
        pool.check_invariants()

    def test_partial_prompt_tail_entry_promotion_and_secondary_key(self) -> None:
        """vLLM 0.34's partial entry (block 8 tokens, hash block 4): an unhashed block takes the entry as its
        hash (and is freed as a hashed block), is promoted to its full hash once full (the partial key
        removed), and re-registering the entry then adds it as a secondary key that eviction drops too."""
        pool = BlockPool(
            6,
            hash_block_size=4,
            enable_kv_cache_events=True,
            free_unhashed_first=True,
            coarse_hash_is_last_fine=True,
        )
        r = req(list(range(14)))  # 3 hash blocks: the tail boundary at 12 lies inside block 1 ([8, 16))
        blocks = pool.get_new_blocks(2)
        pool.cache_full_blocks(r, blocks, 0, 1, 8, 0)
        pool.take_events()
        tail = blocks[1]
        key = pool.cache_partial_block(r, tail, 12, 0)
        assert key == r.block_hashes[2] + b"\0\0\0\0"
        assert (tail.block_hash, tail.block_hash_num_tokens) == (key, 12)
        assert pool.get_cached_block(r.block_hashes[2], [0]) == [tail]
        (stored,) = pool.take_events()
        assert isinstance(stored, BlockStored)
        assert (stored.block_hashes, stored.parent_block_hash) == ([r.block_hashes[2]], r.block_hashes[1])
        assert stored.token_ids == [8, 9, 10, 11] and stored.block_size == 4
        assert pool.cache_partial_block(r, tail, 12, 0) == key and pool.take_events() == []  # already there
        pool.check_invariants()
        # Full now: promoted to the full hash; the partial entry is removed with an event.
        r.append_output_token_ids([14, 15])
        pool.cache_full_blocks(r, blocks, 1, 2, 8, 0)
        removed, stored_full = pool.take_events()
        assert isinstance(removed, BlockRemoved) and removed.block_hashes == [r.block_hashes[2]]
        assert isinstance(stored_full, BlockStored) and stored_full.block_hashes == [r.block_hashes[3]]
        assert (tail.block_hash_num_tokens, pool.get_cached_block(r.block_hashes[2], [0])) == (16, None)
        # The tail entry again: a secondary key beside the full hash.
        pool.cache_partial_block(r, tail, 12, 0)
        assert tail.block_hash == r.block_hashes[3] + b"\0\0\0\0"
        assert pool.get_cached_block(r.block_hashes[2], [0]) == [tail]
        assert len(pool.take_events()) == 1
        pool.check_invariants()
        pool.free_blocks(reversed(blocks))
        assert ids(pool.free_block_queue.get_all_free_blocks())[-2:] == [2, 1]  # hashed: the tail
        pool.evict_blocks({tail.block_id})
        assert sorted(e.block_hashes[0] for e in pool.take_events() if isinstance(e, BlockRemoved)) == sorted(
            [r.block_hashes[2], r.block_hashes[3]]
        )
        assert pool.get_cached_block(r.block_hashes[2], [0]) is None
        assert pool.get_cached_block(r.block_hashes[3], [0]) is None
        pool.check_invariants()

    def test_a_longer_partial_entry_replaces_a_shorter_one(self) -> None:
        pool = BlockPool(4, hash_block_size=4, enable_kv_cache_events=True)
        r = req(list(range(15)))
        (block,) = pool.get_new_blocks(1)
        pool.cache_partial_block(r, block, 4, 0)
        pool.cache_partial_block(r, block, 12, 0)
        assert (block.block_hash, block.block_hash_num_tokens) == (r.block_hashes[2] + b"\0\0\0\0", 12)
        assert pool.get_cached_block(r.block_hashes[0], [0]) is None
        assert [type(e) for e in pool.take_events()] == [BlockStored, BlockRemoved, BlockStored]
        with pytest.raises(BlockPoolError, match="multiple of the hash block"):
            pool.cache_partial_block(r, block, 6, 0)
        pool.check_invariants()

    def test_cache_requires_enough_hashes(self) -> None:
        pool = BlockPool(6, hash_block_size=4)
        r = req([1, 2, 3])
        with pytest.raises(BlockPoolError, match="fewer than the 1 full blocks"):
            pool.cache_full_blocks(r, pool.get_new_blocks(1), 0, 1, 4, 0)

    def test_reset_refused_while_in_use(self) -> None:
        pool = BlockPool(4, hash_block_size=4, enable_kv_cache_events=True)
        r = req(list(range(8)))
        blocks = pool.get_new_blocks(2)
        pool.cache_full_blocks(r, blocks, 0, 2, 4, 0)
        assert not pool.reset_prefix_cache()
        assert blocks[0].block_hash is not None
        pool.free_blocks(blocks)
        assert pool.reset_prefix_cache()
        assert all(b.block_hash is None for b in pool.blocks) and len(pool.cached_block_hash_to_block) == 0
        assert isinstance(pool.take_events()[-1], AllBlocksCleared)

    def test_evict_blocks_checks_range(self) -> None:
        pool = BlockPool(4, hash_block_size=4)
        r = req(list(range(4)))
        (block,) = pool.get_new_blocks(1)
        pool.cache_full_blocks(r, [block], 0, 1, 4, 0)
        pool.evict_blocks([block.block_id])
        assert block.block_hash is None and block.ref_cnt == 1
        with pytest.raises(BlockPoolError, match="bug in the KV connector"):
            pool.evict_blocks([9])

    def test_duplicate_hash_blocks_evict_one_at_a_time(self) -> None:
        pool = BlockPool(5, hash_block_size=4)
        r = req(list(range(4)))
        a, b = pool.get_new_blocks(2)
        pool.cache_full_blocks(r, [a], 0, 1, 4, 0)
        pool.cache_full_blocks(r, [b], 0, 1, 4, 0)
        key = r.block_hashes[0] + b"\0\0\0\0"
        assert ids(pool.cached_block_hash_to_block.blocks_for(key)) == [1, 2]
        pool.evict_blocks([a.block_id])
        assert a.block_hash is None and b.block_hash == key
        assert pool.get_cached_block(r.block_hashes[0], [0]) == [b]
        assert pool.cached_block_hash_to_block.evict([a]) == []  # nothing left to evict for a
        assert pool.cached_block_hash_to_block.evict([b]) == [key]
        assert pool.get_cached_block(r.block_hashes[0], [0]) is None
        pool.check_invariants()

    def test_events_disabled_returns_nothing(self) -> None:
        pool = BlockPool(4, hash_block_size=4)
        r = req(list(range(4)))
        pool.cache_full_blocks(r, pool.get_new_blocks(1), 0, 1, 4, 0)
        assert pool.take_events() == []


def test_capacity_errors_are_apart_from_invariant_breaks() -> None:
    """Running out of blocks is a caller's normal condition (CapacityError); a corrupt pool is a bug
    (InvariantError); a caller can handle the first without swallowing the second."""
    from kvspec import CapacityError, InvariantError
    from kvspec.errors import NotEnoughFreeBlocksError

    pool = BlockPool(4)
    with pytest.raises(NotEnoughFreeBlocksError) as info:
        pool.get_new_blocks(4)
    error: Exception = info.value
    assert isinstance(error, CapacityError)
    assert not isinstance(error, InvariantError)
    (block,) = pool.get_new_blocks(1)
    block.ref_cnt = 0  # corrupt: held by nobody, yet not in the free queue
    with pytest.raises(InvariantError) as broken:
        pool.check_invariants()
    bug: Exception = broken.value
    assert isinstance(bug, InvariantError)
    assert not isinstance(bug, CapacityError)
