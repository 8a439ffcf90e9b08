"""The built-in eviction policies: exact victim orders on hand-built pools, the conformance kit, and LRU
through the protocol equal to the pool's own LRU under vLLM 0.34's free order."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec import BlockPool, KVCacheBlock, Request
from kvspec.blocks.eviction import (
    BlockUse,
    EvictionContext,
    EvictionPolicy,
    EvictionPolicyFactory,
    GroupInfo,
    watches_block_use,
)
from kvspec.blocks.hashing import BlockHasher
from kvspec.blocks.pool import CachedBlocksLookup, PolicyFreeQueue
from kvspec.contracts.release import VLLM_0_23
from kvspec.errors import BlockPoolError, NotEnoughFreeBlocksError, PluginContractError
from kvspec.eviction import (
    BUILTIN_POLICIES,
    HybridAwarePolicy,
    LFUPolicy,
    ReleaseOrderLRU,
    RetentionPolicy,
    SLRUPolicy,
)
from kvspec.testing import check_eviction_policy, eviction_scenario
from tests.helpers import ids

B = 4  # tokens a block
HASHER = BlockHasher(B, seed="eviction-tests")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


ONE_GROUP = (GroupInfo(block_tokens=B, page_bytes=64, needed_by_longer_hits=True),)


def make_pool(
    factory: EvictionPolicyFactory,
    num_blocks: int = 9,
    clock: Callable[[], float] | None = None,
    groups: tuple[GroupInfo, ...] = ONE_GROUP,
    *,
    with_map: bool = False,
) -> BlockPool:
    """A pool whose policy ``factory`` builds; ``with_map``: the policy may look up the pool's prefix-cache
    map (``EvictionContext.cached_blocks``), as a coordinator's policy may."""
    lookup = CachedBlocksLookup()
    context = EvictionContext(
        num_blocks=num_blocks,
        groups=groups,
        clock=clock or (lambda: 0.0),
        cached_blocks=lookup if with_map else None,
    )
    pool = BlockPool(
        num_blocks, hash_block_size=B, eviction_policy=factory(context), free_unhashed_first=True
    )
    lookup.bind(pool.cached_block_hash_to_block)
    return pool


def policy_of(pool: BlockPool) -> EvictionPolicy:
    assert pool.eviction_policy is not None
    return pool.eviction_policy


def request(rid: str, first_token: int, num_blocks: int, **kw: object) -> Request:
    tokens = list(range(first_token, first_token + num_blocks * B))
    return Request(rid, tokens, block_hasher=HASHER, **kw)  # type: ignore[arg-type]


def publish(pool: BlockPool, req: Request, group: int = 0) -> list[KVCacheBlock]:
    """Allocate and cache ``req``'s whole prompt (as a finished prefill), blocks held."""
    blocks = pool.get_new_blocks(len(req.block_hashes))
    pool.cache_full_blocks(req, blocks, 0, len(blocks), B, group)
    return blocks


def finish(pool: BlockPool, blocks: Sequence[KVCacheBlock]) -> None:
    pool.free_blocks(reversed(blocks))  # tail first, as a request frees
    pool.check_invariants()


def hit(pool: BlockPool, req: Request, blocks: Sequence[KVCacheBlock]) -> None:
    """Admit ``req`` with ``blocks`` as its prefix hit."""
    pool.touch(blocks)
    pool.note_hit(req, blocks)
    pool.check_invariants()


def evicted(pool: BlockPool, n: int) -> list[int]:
    """The ids of the next ``n`` cached blocks the pool evicts (the reuse-first list must be empty)."""
    queue = pool.free_block_queue
    assert isinstance(queue, PolicyFreeQueue)
    assert all(b.block_hash is not None for b in queue.get_all_free_blocks())
    taken = pool.get_new_blocks(n)
    return ids(taken)


def fill(pool: BlockPool, *reqs: Request) -> list[list[KVCacheBlock]]:
    """Publish and finish each request in turn; the pool must then hold only cached free blocks."""
    out = []
    for req in reqs:
        blocks = publish(pool, req)
        finish(pool, blocks)
        out.append(blocks)
    return out


class TestLFU:
    def test_the_least_used_goes_first_then_the_oldest(self) -> None:
        pool = make_pool(LFUPolicy)
        a, b, c, d = request("a", 0, 2), request("b", 100, 2), request("c", 200, 2), request("d", 300, 2)
        blocks_a, blocks_b, blocks_c, blocks_d = fill(pool, a, b, c, d)
        hit(pool, request("a2", 0, 2), blocks_a)  # a: 2 uses
        hit(pool, request("a3", 0, 2), blocks_a[:1])  # a's first block: 3 uses
        finish(pool, blocks_a[:1])
        finish(pool, blocks_a)
        lfu = policy_of(pool)
        assert isinstance(lfu, LFUPolicy)
        assert [lfu.uses(i) for i in ids(blocks_a)] == [3, 2]
        # Once used: b, c, d in release order (each freed tail first); then a's second block, then its first.
        order = [*reversed(ids(blocks_b)), *reversed(ids(blocks_c)), *reversed(ids(blocks_d))]
        assert ids(lfu.evictable_blocks()) == [*order, ids(blocks_a)[1], ids(blocks_a)[0]]
        assert evicted(pool, 7) == [*order, ids(blocks_a)[1]]

    def test_a_reused_block_starts_counting_again(self) -> None:
        pool = make_pool(LFUPolicy, num_blocks=3)
        (blocks,) = fill(pool, request("a", 0, 2))
        hit(pool, request("a2", 0, 2), blocks)
        finish(pool, blocks)
        lfu = policy_of(pool)
        assert isinstance(lfu, LFUPolicy)
        assert lfu.uses(blocks[0].block_id) == 2
        (fresh,) = fill(pool, request("b", 50, 2))  # evicts a's content, reuses its blocks
        assert sorted(ids(fresh)) == sorted(ids(blocks)) and lfu.uses(fresh[0].block_id) == 1


class TestSLRU:
    def test_a_scan_evicts_only_one_off_content(self) -> None:
        pool = make_pool(SLRUPolicy, num_blocks=7)
        (hot,) = fill(pool, request("hot", 0, 2))
        hit(pool, request("hot2", 0, 2), hot)
        finish(pool, hot)
        slru = policy_of(pool)
        assert isinstance(slru, SLRUPolicy)
        assert all(slru.is_protected(b.block_id) for b in hot)
        # A scan of one-off prompts, each larger than what is left: LRU would evict the hot prefix.
        for i in range(3):
            fill(pool, request(f"scan{i}", 1000 + 100 * i, 4))
            assert all(b.block_hash is not None for b in hot), f"scan {i} evicted the hot prefix"
        assert pool.get_cached_block(hot[0].block_hash[:-4], [0]) is not None  # type: ignore[index]

    def test_lru_evicts_the_hot_prefix_in_the_same_scan(self) -> None:
        pool = make_pool(ReleaseOrderLRU, num_blocks=7)
        (hot,) = fill(pool, request("hot", 0, 2))
        hit(pool, request("hot2", 0, 2), hot)
        finish(pool, hot)
        fill(pool, request("scan0", 1000, 4), request("scan1", 1100, 4))
        assert any(b.block_hash is None or b.block_hash_num_tokens != B * (i + 1) for i, b in enumerate(hot))

    def test_the_protected_segment_is_bounded(self) -> None:
        pool = make_pool(lambda ctx: SLRUPolicy(ctx, protected_fraction=0.5), num_blocks=9)
        groups = fill(pool, *(request(f"r{i}", 100 * i, 2) for i in range(4)))
        for i, blocks in enumerate(groups):
            hit(pool, request(f"h{i}", 100 * i, 2), blocks)
        for blocks in groups:
            finish(pool, blocks)
        slru = policy_of(pool)
        assert isinstance(slru, SLRUPolicy)
        protected = [b.block_id for blocks in groups for b in blocks if slru.is_protected(b.block_id)]
        assert len(protected) == 4  # half of the 8 free cached blocks; the oldest were demoted
        assert set(protected) == set(ids(groups[2]) + ids(groups[3]))
        assert evicted(pool, 4) == [*reversed(ids(groups[0])), *reversed(ids(groups[1]))]

    def test_a_bad_fraction_is_refused(self) -> None:
        with pytest.raises(ValueError, match="protected_fraction"):
            SLRUPolicy(EvictionContext(num_blocks=4), protected_fraction=0.0)


class TestRetention:
    def test_a_retained_prefix_outlives_newer_content_until_its_time_ends(self) -> None:
        clock = Clock()
        pool = make_pool(RetentionPolicy, clock=clock)
        (pinned,) = fill(pool, request("sys", 0, 2, retention_seconds=10.0))
        others = fill(pool, request("a", 100, 2), request("b", 200, 2), request("c", 300, 2))
        policy = policy_of(pool)
        assert isinstance(policy, RetentionPolicy)
        assert policy.retained_until(pinned[0].block_id) == 10.0
        unpinned = [i for blocks in others for i in reversed(ids(blocks))]
        assert ids(policy.evictable_blocks()) == unpinned + list(reversed(ids(pinned)))
        clock.now = 10.0  # the retention ends: back to release order, where it is the oldest
        assert ids(policy.evictable_blocks()) == list(reversed(ids(pinned))) + unpinned
        assert evicted(pool, 2) == list(reversed(ids(pinned)))

    def test_a_hit_extends_the_retention_and_priority_orders_the_rest(self) -> None:
        clock = Clock()
        pool = make_pool(RetentionPolicy, num_blocks=4, clock=clock)
        (pinned,) = fill(pool, request("sys", 0, 1, retention_seconds=5.0))
        clock.now = 4.0
        hit(pool, request("user", 0, 1, retention_seconds=5.0), pinned)
        finish(pool, pinned)
        policy = policy_of(pool)
        assert isinstance(policy, RetentionPolicy)
        assert policy.retained_until(pinned[0].block_id) == 9.0
        low, high = fill(pool, request("low", 100, 1, priority=5), request("high", 200, 1, priority=0))
        clock.now = 6.0
        # Not retained first, the least important priority (5) before 0, then the retained block.
        assert evicted(pool, 3) == [low[0].block_id, high[0].block_id, pinned[0].block_id]

    def test_a_hit_by_a_more_important_request_raises_the_blocks_priority(self) -> None:
        pool = make_pool(RetentionPolicy, num_blocks=4)
        (shared,) = fill(pool, request("batch", 0, 1, priority=5))
        hit(pool, request("interactive", 0, 1, priority=0), shared)  # the most important use counts
        finish(pool, shared)
        (later,) = fill(pool, request("batch2", 100, 1, priority=5))
        (last,) = fill(pool, request("batch3", 200, 1, priority=5))
        # Without the hit, `shared` (the oldest priority-5 block) would go first.
        assert evicted(pool, 3) == [later[0].block_id, last[0].block_id, shared[0].block_id]

    def test_without_asks_it_is_the_pools_lru(self) -> None:
        # Every request at priority 0 without retention: the order is release order.
        for seed in range(3):
            lru = eviction_scenario(None, seed=seed, steps=150, asks=False)
            retention = eviction_scenario(RetentionPolicy, seed=seed, steps=150, asks=False)
            assert lru == retention and lru.evictions


@pytest.mark.parametrize("with_map", [False, True], ids=["indexed", "map"])
class TestHybrid:
    GROUPS = (
        GroupInfo(block_tokens=B, page_bytes=64, needed_by_longer_hits=True),  # full attention
        GroupInfo(block_tokens=B, page_bytes=64),  # sliding window
        GroupInfo(block_tokens=B, page_bytes=64, holds_prefix_state=True),  # Mamba state
    )

    def test_a_state_standing_for_a_long_prefix_is_kept_longer(self, with_map: bool) -> None:
        pool = make_pool(HybridAwarePolicy, num_blocks=20, groups=self.GROUPS, with_map=with_map)
        long_req = request("long", 0, 4)
        state = pool.get_new_blocks(4)
        pool.cache_full_blocks(long_req, state, 3, 4, B, 2)  # one state at 16 tokens (4 blocks' worth)
        finish(pool, state[3:])
        pool.free_blocks(state[:3])
        attention = publish(pool, request("other", 500, 3))
        finish(pool, attention)
        policy = policy_of(pool)
        assert isinstance(policy, HybridAwarePolicy)
        assert policy.bonus(attention[0]) == 0.0
        assert policy.bonus(state[3]) == pytest.approx(0.5 * 20 * (1 - 4 / 16))
        # The state was freed first but is evicted after the three attention blocks freed after it.
        assert ids(policy.evictable_blocks()) == [*reversed(ids(attention)), state[3].block_id]

    def test_evicting_a_full_attention_block_dooms_its_peers(self, with_map: bool) -> None:
        pool = make_pool(HybridAwarePolicy, num_blocks=12, groups=self.GROUPS, with_map=with_map)
        req = request("r", 0, 2)
        full = pool.get_new_blocks(2)
        pool.cache_full_blocks(req, full, 0, 2, B, 0)
        window = pool.get_new_blocks(2)
        pool.cache_full_blocks(req, window, 0, 2, B, 1)
        other = publish(pool, request("o", 900, 2), group=1)
        finish(pool, full)  # oldest: full attention, tail first
        finish(pool, other)
        finish(pool, window)
        pool.get_new_blocks(pool.get_num_free_blocks() - 6)  # leave only the six cached blocks free
        # LRU would go full[1], full[0], other[1], other[0], window[1], window[0]; once full[1] goes, the
        # window block at the same position serves no hit and goes next, and so for full[0].
        assert evicted(pool, 4) == [
            full[1].block_id,
            window[1].block_id,
            full[0].block_id,
            window[0].block_id,
        ]

    @pytest.mark.parametrize("with_state", [True, False], ids=["scored", "release-order"])
    def test_a_doomed_block_hit_and_freed_again_takes_its_new_place(
        self, with_map: bool, with_state: bool
    ) -> None:
        """A doom names a block as it was when doomed: once a request hits it and frees it again, it is
        a newer release, evicted in its new order and not ahead of older ones. Without a state group
        every block scores its release order (the one-pass path)."""
        groups = self.GROUPS if with_state else self.GROUPS[:2]
        pool = make_pool(HybridAwarePolicy, num_blocks=12, groups=groups, with_map=with_map)
        req = request("r", 0, 1)
        full = publish(pool, req)
        window = pool.get_new_blocks(1)
        pool.cache_full_blocks(req, window, 0, 1, B, 1)
        finish(pool, full)  # oldest
        finish(pool, window)
        others = [publish(pool, request(f"o{i}", 900 + 16 * i, 1), group=1) for i in range(2)]
        for blocks in others:
            finish(pool, blocks)
        pool.get_new_blocks(pool.get_num_free_blocks() - 4)  # leave only the four cached blocks free
        assert evicted(pool, 1) == [full[0].block_id]  # dooms `window`
        hit(pool, request("again", 0, 1), window)
        finish(pool, window)  # released again: now the newest
        assert evicted(pool, 3) == [others[0][0].block_id, others[1][0].block_id, window[0].block_id]

    def test_evicting_one_copy_of_duplicated_content_dooms_nothing(self, with_map: bool) -> None:
        pool = make_pool(HybridAwarePolicy, num_blocks=12, groups=self.GROUPS, with_map=with_map)
        req = request("r", 0, 1)
        first = publish(pool, req)
        again = publish(pool, request("r2", 0, 1))  # the same content recomputed: a duplicate
        window = pool.get_new_blocks(1)
        pool.cache_full_blocks(req, window, 0, 1, B, 1)
        other = publish(pool, request("o", 900, 1), group=1)
        for blocks in (first, other, again, window):
            finish(pool, blocks)
        pool.get_new_blocks(pool.get_num_free_blocks() - 4)  # leave only the four cached blocks free
        # `first` goes; its copy `again` still serves the position, so neither it nor `window` is doomed.
        assert evicted(pool, 3) == [first[0].block_id, other[0].block_id, again[0].block_id]

    def test_a_copy_a_request_holds_does_not_keep_the_position(self, with_map: bool) -> None:
        pool = make_pool(HybridAwarePolicy, num_blocks=12, groups=self.GROUPS, with_map=with_map)
        req = request("r", 0, 1)
        first = publish(pool, req)
        held = publish(pool, request("r2", 0, 1))  # a duplicate that a running request keeps
        window = pool.get_new_blocks(1)
        pool.cache_full_blocks(req, window, 0, 1, B, 1)
        other = publish(pool, request("o", 900, 1), group=1)
        for blocks in (first, other, window):
            finish(pool, blocks)
        pool.get_new_blocks(pool.get_num_free_blocks() - 3)  # leave only the three free cached blocks
        # `first` goes; the copy is not free (it is no eviction candidate), so `window` is doomed before `other`.
        assert evicted(pool, 3) == [first[0].block_id, window[0].block_id, other[0].block_id]
        assert held[0].ref_cnt == 1

    def test_a_state_at_the_evicted_position_is_not_doomed(self, with_map: bool) -> None:
        groups = (self.GROUPS[0], self.GROUPS[2])  # full attention and a Mamba state
        pool = make_pool(HybridAwarePolicy, num_blocks=10, groups=groups, with_map=with_map)
        req = request("r", 0, 2)
        full = pool.get_new_blocks(2)
        pool.cache_full_blocks(req, full, 0, 2, B, 0)
        state = pool.get_new_blocks(2)
        pool.cache_full_blocks(req, state, 1, 2, B, 1)  # a state at 8 tokens only
        other = publish(pool, request("o", 900, 2))
        finish(pool, full)
        pool.free_blocks(state[:1])
        finish(pool, state[1:])
        finish(pool, other)
        policy = policy_of(pool)
        assert isinstance(policy, HybridAwarePolicy)
        assert policy.bonus(state[1]) == pytest.approx(0.5 * 10 * (1 - 4 / 8))  # it stands for 8 tokens
        pool.get_new_blocks(pool.get_num_free_blocks() - 5)  # leave only the five cached blocks free
        # full[1] goes first; the state at its position is not doomed (it would go next): scores go on.
        order = [full[1], full[0], other[1], other[0], state[1]]
        assert evicted(pool, 5) == [b.block_id for b in order]


class TestPolicyFreeQueue:
    def test_unhashed_blocks_are_reused_first_and_counted(self) -> None:
        pool = make_pool(ReleaseOrderLRU, num_blocks=6)
        (cached,) = fill(pool, request("a", 0, 2))
        scratch = pool.get_new_blocks(3)  # the three never-used blocks, before any cached one
        assert not set(ids(scratch)) & set(ids(cached))
        assert pool.get_num_free_blocks() == 2 and len(policy_of(pool)) == 2
        pool.free_blocks(scratch)
        assert ids(pool.free_block_queue.get_all_free_blocks()) == ids(scratch) + list(reversed(ids(cached)))
        with pytest.raises(BlockPoolError, match="not free"):
            pool.free_block_queue.remove(scratch[0].__class__(99))
        with pytest.raises(NotEnoughFreeBlocksError):
            pool.get_new_blocks(6)
        pool.check_invariants()

    def test_a_batch_policy_is_called_once_per_release_and_allocation(self) -> None:
        calls: list[tuple[str, int]] = []

        class Counting(ReleaseOrderLRU):
            def add(self, block: KVCacheBlock) -> None:
                calls.append(("add", 1))
                super().add(block)

            def pop_victim(self) -> KVCacheBlock:
                calls.append(("pop_victim", 1))
                return super().pop_victim()

            def add_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
                calls.append(("add_blocks", len(blocks)))
                super().add_blocks(blocks)

            def pop_victims(self, n: int) -> list[KVCacheBlock]:
                calls.append(("pop_victims", n))
                return super().pop_victims(n)

        pool = make_pool(Counting, num_blocks=9)
        (first,) = fill(pool, request("a", 0, 3))
        assert calls == [("add_blocks", 3)]
        scratch = pool.get_new_blocks(7)  # the five never-used blocks, then two of the cached three
        assert calls[1:] == [("pop_victims", 2)]
        assert ids(scratch[5:]) == list(reversed(ids(first)))[:2]
        pool.check_invariants()

    @pytest.mark.parametrize("watches", [True, False])
    def test_a_policy_blind_to_use_is_not_told_of_publishes_and_hits(self, watches: bool) -> None:
        told: list[str] = []

        class Told(ReleaseOrderLRU):
            watches_block_use = watches

            def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
                told.append(f"cached {use.request_id} {len(blocks)}")

            def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
                told.append(f"hit {use.request_id} {len(blocks)}")

        pool = make_pool(Told, num_blocks=9)
        (blocks,) = fill(pool, request("a", 0, 3))
        hit(pool, request("b", 0, 2), blocks[:2])
        assert told == (["cached a 3", "hit b 2"] if watches else [])
        assert watches_block_use(policy_of(pool)) is watches

    def test_the_built_in_policies_say_whether_they_watch_use(self) -> None:
        context = EvictionContext(num_blocks=4, groups=(GroupInfo(block_tokens=16, page_bytes=64),))
        policies = {p: p(context) for p in (ReleaseOrderLRU, HybridAwarePolicy, LFUPolicy, SLRUPolicy)}
        assert {type(p).__name__: watches_block_use(p) for p in policies.values()} == {
            "ReleaseOrderLRU": True,  # plugins subclass it to watch use
            "HybridAwarePolicy": False,
            "LFUPolicy": True,
            "SLRUPolicy": True,
        }

    def test_a_hit_on_a_free_cached_block_takes_it_out_of_the_policy(self) -> None:
        pool = make_pool(LFUPolicy)
        (blocks,) = fill(pool, request("a", 0, 2))
        hit(pool, request("b", 0, 1), blocks[:1])
        assert blocks[0].ref_cnt == 1 and blocks[0] not in policy_of(pool).evictable_blocks()
        assert len(policy_of(pool)) == 1


@pytest.mark.parametrize("seed", range(6))
def test_hybrid_without_the_pools_map_evicts_the_same_blocks(seed: int) -> None:
    """The coordinator's policy asks the pool's map for copies instead of indexing the left-closed group's
    blocks; a policy built without the map indexes them all. Same victims, same block ids."""

    given_map: list[bool] = []

    def indexed_only(context: EvictionContext) -> EvictionPolicy:
        given_map.append(context.cached_blocks is not None)
        return HybridAwarePolicy(dataclasses.replace(context, cached_blocks=None))

    with_map = eviction_scenario(HybridAwarePolicy, seed=seed, steps=300, num_blocks=30)
    assert with_map.evictions > 0
    assert eviction_scenario(indexed_only, seed=seed, steps=300, num_blocks=30) == with_map
    assert given_map[-1]  # the coordinator's policy was given the map (the registry's probe is not)


@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
def test_every_builtin_policy_passes_the_kit(name: str) -> None:
    report = check_eviction_policy(BUILTIN_POLICIES[name], seeds=(0, 1), steps=200)
    assert report.evictions > 0 and report.hit_tokens > 0


@pytest.mark.parametrize("seed", range(4))
def test_lru_through_the_protocol_is_the_pools_own_lru_under_vllm_034(seed: int) -> None:
    builtin = eviction_scenario(None, seed=seed)
    through_protocol = eviction_scenario(ReleaseOrderLRU, seed=seed)
    assert builtin == through_protocol and builtin.evictions > 0


def test_under_vllm_023_policies_reuse_empty_blocks_first_unlike_its_queue() -> None:
    # 0.23 frees unhashed blocks to the tail; a policy's queue always reuses them first (documented).
    reports = [
        (
            eviction_scenario(None, seed=s, profile=VLLM_0_23),
            eviction_scenario(ReleaseOrderLRU, seed=s, profile=VLLM_0_23),
        )
        for s in range(3)
    ]
    assert any(a.allocations != b.allocations for a, b in reports)


def test_policies_differ_from_lru_on_the_same_requests() -> None:
    base = eviction_scenario(None, seed=5)
    for name in ("lfu", "slru", "hybrid"):
        assert eviction_scenario(BUILTIN_POLICIES[name], seed=5).allocations != base.allocations, name


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from([*sorted(BUILTIN_POLICIES), "lru_protocol"]),
    ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(1, 3)), min_size=1, max_size=60),
)
def test_random_operations_keep_the_pool_and_the_policy_consistent(
    name: str, ops: list[tuple[int, int, int]]
) -> None:
    """Random publish / finish / hit / burst sequences on a 10-block pool: after each, the pool's invariants
    hold and the policy holds exactly the free blocks that are not on the reuse-first list."""
    factory = ReleaseOrderLRU if name == "lru_protocol" else BUILTIN_POLICIES[name]
    clock = Clock()
    pool = make_pool(factory, num_blocks=10, clock=clock)
    policy = policy_of(pool)
    held: list[list[KVCacheBlock]] = []
    for op, prefix, size in ops:
        clock.now += 1.0
        req = request(f"r{len(held)}-{op}", prefix * 50, size, retention_seconds=3.0 if prefix % 2 else None)
        if op == 0 and pool.get_num_free_blocks() >= size:
            cached = pool.get_cached_prefix(req.block_hashes, 0, size)
            if cached:
                hit(pool, req, cached)
                held.append(list(cached))
            else:
                held.append(publish(pool, req))
        elif op == 1 and held:
            finish(pool, held.pop(prefix % len(held)))
        elif op == 2 and pool.get_num_free_blocks():
            expected = [
                b for b in pool.free_block_queue.get_all_free_blocks() if b.prev_free_block is not None
            ]
            expected += policy.evictable_blocks()
            taken = pool.get_new_blocks(min(size, pool.get_num_free_blocks()))
            assert ids(taken) == ids(expected[: len(taken)])
            pool.free_blocks(taken)
        pool.check_invariants()
        in_list = [b for b in pool.free_block_queue.get_all_free_blocks() if b.prev_free_block is not None]
        assert len(in_list) + len(policy) == pool.get_num_free_blocks()
        assert all(b.ref_cnt == 0 and b.block_hash is not None for b in policy.evictable_blocks())
    for blocks in held:
        finish(pool, blocks)
    assert pool.get_num_free_blocks() == 9


class LiesAboutItsOrder(ReleaseOrderLRU):
    """Evicts the newest but says the oldest goes first."""

    def pop_victim(self) -> KVCacheBlock:
        return self._free.popitem(last=True)[1]


class Forgetful(ReleaseOrderLRU):
    """Loses track of blocks a request hits (remove does nothing)."""

    def remove(self, block: KVCacheBlock) -> None:
        pass


class Random(ReleaseOrderLRU):
    """Evicts a block chosen at random: not deterministic."""

    def pop_victim(self) -> KVCacheBlock:
        import random

        block_id = random.choice(list(self._free))
        return self._free.pop(block_id)


class BatchesBackwards(ReleaseOrderLRU):
    """Its batch add takes a request's blocks in reverse: consistent with its own order, but not with add."""

    def add_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
        for block in reversed(blocks):
            self.add(block)


class SaysBlindButWatches(ReleaseOrderLRU):
    """Keeps blocks requests have hit until last, yet says ``watches_block_use = False``: the pool never
    tells it of a hit, so its order is not the one it would give."""

    watches_block_use = False

    def __init__(self, context: EvictionContext) -> None:
        super().__init__(context)
        self._hit: set[int] = set()

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        self._hit.update(block.block_id for block in blocks)

    def _order(self) -> list[KVCacheBlock]:
        blocks = list(self._free.values())
        return [b for b in blocks if b.block_id not in self._hit] + [
            b for b in blocks if b.block_id in self._hit
        ]

    def pop_victim(self) -> KVCacheBlock:
        return self._free.pop(self._order()[0].block_id)

    def evictable_blocks(self) -> list[KVCacheBlock]:
        return self._order()


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (BatchesBackwards, "do not act as the per-block calls"),
        (SaysBlindButWatches, "says watches_block_use = False and the calls change its order"),
        (LiesAboutItsOrder, "evictable_blocks\\(\\) promised"),
        (Forgetful, "invariants broke at step"),
        (Random, "evictable_blocks\\(\\) promised|not deterministic"),
    ],
)
def test_the_kit_catches_a_broken_policy(policy: EvictionPolicyFactory, message: str) -> None:
    with pytest.raises(PluginContractError, match=message):
        check_eviction_policy(policy, seeds=(0,), steps=200)
