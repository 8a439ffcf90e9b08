"""Scheduler-facing coordinator: prefix caching scenarios of vLLM's test_prefix_caching (§9.4)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvspec import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheCoordinator,
    MambaSpec,
    MultiModalFeature,
    SchedulerLimits,
    SchedulingError,
    SinkFullAttentionSpec,
    UniformTypeKVCacheSpecs,
    UnsupportedConfigurationError,
)
from kvspec.contracts.release import VLLM_0_23, VLLM_0_34, ReleaseProfile
from tests.helpers import (
    free_ids,
    full_spec,
    ids,
    make_config,
    make_coordinator,
    make_request,
    schedule,
    sw_spec,
)


def common_tokens(n: int = 48) -> list[int]:
    return list(range(n))


class TestPrefill:
    @pytest.mark.parametrize("algorithm", ["sha256", "xxhash"])
    def test_prefill(self, algorithm: str) -> None:
        # vLLM 0.23.0's test_prefill, with its numbers (0.34 reuses freed unhashed blocks first: test_release)
        coord = make_coordinator([full_spec()], 11, hash_algorithm=algorithm, profile=VLLM_0_23)
        r0 = make_request(coord, "0", common_tokens() + [100] * 7)
        computed, n = coord.get_computed_blocks(r0)
        assert n == 0 and computed.get_block_ids() == ([],)
        assert schedule(coord, r0) == [[1, 2, 3, 4]]
        for i, block in enumerate(coord.block_pool.blocks[1:4]):
            assert block.block_hash == r0.block_hashes[i] + b"\0\0\0\0" and block.ref_cnt == 1
        assert coord.block_pool.blocks[4].block_hash is None

        r1 = make_request(coord, "1", common_tokens() + [200] * 5)
        computed, n = coord.get_computed_blocks(r1)
        assert n == 48 and computed.get_block_ids() == ([1, 2, 3],)
        new = coord.allocate_slots(r1, 5, n, computed)
        assert new is not None and new.get_block_ids() == ([5],)
        assert [b.ref_cnt for b in coord.block_pool.blocks[1:4]] == [2, 2, 2]
        coord.check_invariants()

        coord.free(r0)
        coord.free(r1)
        # unallocated blocks first, then each request's unique blocks, then the shared prefix in reverse
        assert free_ids(coord) == [6, 7, 8, 9, 10, 4, 5, 3, 2, 1]

        r2 = make_request(coord, "2", common_tokens() + [300] * 7)
        computed, n = coord.get_computed_blocks(r2)
        assert n == 48 and computed.get_block_ids() == ([1, 2, 3],)
        assert coord.allocate_slots(r2, 7, n, computed).get_block_ids() == ([6],)  # type: ignore[union-attr]
        assert free_ids(coord) == [7, 8, 9, 10, 4, 5]  # touched hits left the queue
        coord.free(r2)
        assert free_ids(coord) == [7, 8, 9, 10, 4, 5, 6, 3, 2, 1]

        r3 = make_request(coord, "3", [999] * (16 * 10 - 1))
        assert schedule(coord, r3) == [[7, 8, 9, 10, 4, 5, 6, 3, 2, 1]]
        assert coord.num_free_blocks == 0
        coord.check_invariants()

    def test_last_token_is_never_a_hit(self) -> None:
        coord = make_coordinator([full_spec()], 10)
        r0 = make_request(coord, "0", list(range(32)))
        schedule(coord, r0)
        r1 = make_request(coord, "1", list(range(32)))
        _, n = coord.get_computed_blocks(r1)
        assert n == 16  # 32 tokens cached, but at most 31 can hit, so one whole block is recomputed

    def test_skip_reading_prefix_cache(self) -> None:
        coord = make_coordinator([full_spec()], 10)
        schedule(coord, make_request(coord, "0", list(range(40))))
        plp = make_request(coord, "1", list(range(40)), skip_reading_prefix_cache=True)
        _, n = coord.get_computed_blocks(plp)
        assert n == 0
        new = schedule(coord, plp)
        assert len(new[0]) == 3
        coord.check_invariants()


class TestHybrid:
    def _hybrid(self) -> KVCacheCoordinator:
        return make_coordinator([full_spec(), sw_spec(32), sw_spec(32)], 20)

    def test_prefill_hybrid_model(self) -> None:
        coord = self._hybrid()
        r0 = make_request(coord, "0", common_tokens() + [100] * 7)
        assert schedule(coord, r0) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
        r1 = make_request(coord, "1", common_tokens() + [200] * 5)
        computed, n = coord.get_computed_blocks(r1)
        assert n == 48
        assert computed.get_block_ids() == ([1, 2, 3], [0, 6, 7], [0, 10, 11])
        assert coord.allocate_slots(r1, 5, n, computed) is not None
        coord.check_invariants()
        coord.free(r0)
        coord.free(r1)
        coord.check_invariants()

    @pytest.mark.parametrize(
        ("evicted", "expected"),
        [
            ([5], ([1, 2, 3], [0, 6, 7], [0, 10, 11])),  # outside the window: no effect
            ([1], ([], [], [])),  # the first full block: total miss
            ([7], ([1, 2], [5, 6], [9, 10])),  # the last SW block: the window run ends at block 1
            ([11], ([1, 2], [5, 6], [9, 10])),  # a miss in one SW group is a miss for both
            ([2, 10], ([1], [5], [9])),
        ],
    )
    def test_evictions_change_the_hit(self, evicted: list[int], expected: tuple[list[int], ...]) -> None:
        coord = self._hybrid()
        r0 = make_request(coord, "0", common_tokens() + [100] * 7)
        schedule(coord, r0)
        coord.free(r0)
        coord.evict_blocks(evicted)
        r1 = make_request(coord, "1", common_tokens() + [200] * 5)
        computed, n = coord.get_computed_blocks(r1)
        assert computed.get_block_ids() == expected
        assert n == 16 * len(expected[0])

    def test_eagle_drops_the_last_block(self) -> None:
        coord = make_coordinator([full_spec()], 20, use_eagle=True)
        r0 = make_request(coord, "0", common_tokens() + [100] * 7)
        schedule(coord, r0)
        r1 = make_request(coord, "1", common_tokens() + [200] * 5)
        computed, n = coord.get_computed_blocks(r1)
        assert computed.get_block_ids() == ([1, 2],) and n == 32

    def test_hybrid_eagle(self) -> None:
        coord = make_coordinator([full_spec(), sw_spec(32)], 30, use_eagle=True)
        r0 = make_request(coord, "0", list(range(80)) + [100] * 7)
        schedule(coord, r0)
        r1 = make_request(coord, "1", list(range(80)) + [200] * 5)
        computed, n = coord.get_computed_blocks(r1)
        # 5 cached blocks, one dropped for EAGLE's draft head: 4 blocks in both groups
        assert n == 64
        full_ids, sw_ids = computed.get_block_ids()
        assert full_ids == [1, 2, 3, 4]
        assert len(sw_ids) == 4 and sw_ids[0] == 0

    def test_different_block_sizes_align_to_lcm(self) -> None:
        full32 = full_spec(block_size=32, dtype=torch.float16)
        sw16 = sw_spec(32, block_size=16, dtype=torch.float32)
        assert full32.page_size_bytes == sw16.page_size_bytes
        coord = make_coordinator([full32, sw16], 40)
        assert (coord.scheduler_block_size, coord.hash_block_size) == (32, 16)
        r0 = make_request(coord, "0", list(range(90)))
        schedule(coord, r0)
        r1 = make_request(coord, "1", list(range(90)))
        computed, n = coord.get_computed_blocks(r1)
        # 89 tokens could hit: 5 blocks of 16 (80 tokens) cut to a multiple of 32
        assert n == 64
        assert [len(g) for g in computed.get_block_ids()] == [2, 4]

    def test_mixed_block_sizes_hash_view(self) -> None:
        coord = make_coordinator(
            [full_spec(block_size=32, dtype=torch.float16), sw_spec(32, dtype=torch.float32)], 40
        )
        r0 = make_request(coord, "0", list(range(70)))
        schedule(coord, r0)
        coord.check_invariants()
        # full group cached 2 blocks of 32 (keys built from concatenated 16-token hashes)
        assert len(coord.block_pool.cached_block_hash_to_block) == 2 + 4

    def test_hybrid_with_mamba(self) -> None:
        mamba = MambaSpec(block_size=16, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="all")
        coord = make_coordinator([full_spec(), mamba], 30, profile=VLLM_0_23)  # Mamba "all": 0.23 only
        r0 = make_request(coord, "0", common_tokens() + [1] * 7)
        schedule(coord, r0)
        coord.check_invariants()
        r1 = make_request(coord, "1", common_tokens() + [2] * 5)
        computed, n = coord.get_computed_blocks(r1)
        assert n == 48
        full_ids, mamba_ids = computed.get_block_ids()
        assert len(full_ids) == 3 and mamba_ids[:2] == [0, 0] and mamba_ids[2] != 0
        # The state was cached in this very step (its kernel may not have written it yet): defer.
        assert coord.allocate_slots(r1, 5, n, computed) is None
        coord.new_step_starts()
        assert coord.allocate_slots(r1, 5, n, computed) is not None
        coord.check_invariants()


class TestDecodeAndEviction:
    def test_decode(self) -> None:
        coord = make_coordinator([full_spec()], 11)
        r0 = make_request(coord, "0", common_tokens() + [7] * 7)
        schedule(coord, r0)
        for i in range(9):
            r0.append_output_token_ids(i)
            new = coord.allocate_slots(r0, 1)
            assert new is not None and new.is_empty()
            r0.num_computed_tokens += 1
        assert r0.num_tokens == 64 and len(coord.get_block_ids("0")[0]) == 4
        r0.append_output_token_ids(9)
        new = coord.allocate_slots(r0, 1)
        assert new is not None and new.get_block_ids() == ([5],)
        assert coord.block_pool.blocks[4].block_hash is not None  # the block that filled is now cached
        coord.check_invariants()

    def test_computed_blocks_not_evicted(self) -> None:
        coord = make_coordinator([full_spec()], 5)
        r0 = make_request(coord, "0", list(range(16)))
        schedule(coord, r0)
        r1 = make_request(coord, "1", list(range(100, 132)))
        schedule(coord, r1)
        coord.free(r0)
        coord.free(r1)
        r2 = make_request(coord, "2", list(range(16)) + [5] * 17)
        computed, n = coord.get_computed_blocks(r2)
        assert computed.get_block_ids() == ([1],) and n == 16
        new = coord.allocate_slots(r2, 17, n, computed)
        assert new is not None and new.get_block_ids() == (
            [4, 3],
        )  # takes free/evictable others, not the hit

    def test_hash_reset_when_block_reused(self) -> None:
        coord = make_coordinator([full_spec()], 2)
        r0 = make_request(coord, "0", list(range(16)))
        schedule(coord, r0)
        coord.free(r0)
        block = coord.block_pool.blocks[1]
        assert block.block_hash is not None
        r1 = make_request(coord, "1", list(range(50, 60)))
        schedule(coord, r1)
        assert coord.block_pool.blocks[1].block_hash is None
        assert len(coord.block_pool.cached_block_hash_to_block) == 0

    def test_prefix_caching_disabled(self) -> None:
        coord = make_coordinator([full_spec()], 10, enable_caching=False)
        r0 = make_request(coord, "0", list(range(40)))
        schedule(coord, r0)
        coord.free(r0)
        r1 = make_request(coord, "1", list(range(40)))
        _, n = coord.get_computed_blocks(r1)
        assert n == 0 and len(coord.block_pool.cached_block_hash_to_block) == 0

    def test_swa_free_keeps_cached_tail_ahead_of_scratch(self) -> None:
        coord = make_coordinator([sw_spec(32)], 10)
        r0 = make_request(coord, "0", list(range(40)))
        assert schedule(coord, r0) == [[1, 2, 3]]
        coord.free(r0)
        # block 3 holds 8 tokens (uncached scratch): reused first; cached 2, 1 stay at the tail
        assert free_ids(coord) == [3, 4, 5, 6, 7, 8, 9, 2, 1]


class TestHashInputs:
    def test_mm_prefix_caching(self) -> None:
        coord = make_coordinator([full_spec()], 20)
        img = MultiModalFeature(identifier="img-a", offset=10, length=20)
        r0 = make_request(coord, "0", list(range(60)), mm_features=[img])
        schedule(coord, r0)
        same = make_request(coord, "1", list(range(60)), mm_features=[img])
        assert coord.get_computed_blocks(same)[1] == 48
        other = make_request(
            coord, "2", list(range(60)), mm_features=[dataclasses.replace(img, identifier="img-b")]
        )
        assert coord.get_computed_blocks(other)[1] == 0

    def test_cache_key_salting(self) -> None:
        coord = make_coordinator([full_spec()], 20)
        r0 = make_request(coord, "0", list(range(60)), cache_salt="tenant-a")
        schedule(coord, r0)
        assert (
            coord.get_computed_blocks(make_request(coord, "1", list(range(60)), cache_salt="tenant-a"))[1]
            == 48
        )
        assert (
            coord.get_computed_blocks(make_request(coord, "2", list(range(60)), cache_salt="tenant-b"))[1]
            == 0
        )
        assert coord.get_computed_blocks(make_request(coord, "3", list(range(60))))[1] == 0

    def test_same_hash_in_two_groups_is_two_keys(self) -> None:
        coord = make_coordinator([full_spec(), sw_spec(32)], 20)
        r0 = make_request(coord, "0", list(range(32)))
        schedule(coord, r0)
        keys = [b.block_hash for b in coord.block_pool.blocks if b.block_hash is not None]
        assert len(keys) == 4 and len(set(keys)) == 4
        assert {k[-4:] for k in keys} == {b"\0\0\0\0", b"\0\0\0\1"}


class TestFailureAndReset:
    def test_failed_allocation_changes_nothing(self) -> None:
        coord = make_coordinator([full_spec()], 7)
        r0 = make_request(coord, "0", list(range(48)))
        schedule(coord, r0)
        coord.free(r0)
        r1 = make_request(coord, "1", list(range(32)) + [9] * 70)
        computed, n = coord.get_computed_blocks(r1)
        assert n == 32
        ref_before = [b.ref_cnt for b in coord.block_pool.blocks]
        free_before = free_ids(coord)
        cache_before = dict(coord.block_pool.cached_block_hash_to_block.items())
        assert coord.allocate_slots(r1, 70, n, computed) is None
        assert [b.ref_cnt for b in coord.block_pool.blocks] == ref_before
        assert free_ids(coord) == free_before
        assert dict(coord.block_pool.cached_block_hash_to_block.items()) == cache_before
        assert coord.get_block_ids("1") == ([],)
        coord.check_invariants()

    def test_zero_new_tokens_is_an_error(self) -> None:
        coord = make_coordinator([full_spec()], 7)
        with pytest.raises(SchedulingError, match="num_new_tokens must be greater than 0"):
            coord.allocate_slots(make_request(coord, "0", [1, 2]), 0)

    def test_a_step_may_adopt_a_hit_without_new_tokens(self) -> None:
        """vLLM 0.34: a chunk that ends inside the replayed part of a hit schedules no token of its own but
        adopts the hit's blocks (and takes no new block); the next chunk continues from there."""
        coord = make_coordinator([full_spec()], 10)
        schedule(coord, make_request(coord, "a", list(range(40))))
        second = make_request(coord, "b", list(range(40)))
        computed, hit = coord.get_computed_blocks(second)
        assert hit == 32
        free_before = coord.block_pool.get_num_free_blocks()
        new = coord.allocate_slots(second, 0, hit, computed)
        assert new is not None and new.get_block_ids() == ([],)
        assert coord.get_block_ids("b") == ([1, 2],) and coord.block_pool.get_num_free_blocks() == free_before
        second.num_computed_tokens = hit
        assert coord.allocate_slots(second, 8) is not None
        assert len(coord.get_block_ids("b")[0]) == 3
        coord.check_invariants()

    def test_reset_prefix_cache(self) -> None:
        coord = make_coordinator([full_spec()], 10, log_stats=True, events=True)
        r0 = make_request(coord, "0", list(range(40)))
        schedule(coord, r0)
        assert not coord.reset_prefix_cache()
        assert len(coord.block_pool.cached_block_hash_to_block) == 2
        coord.free(r0)
        assert coord.reset_prefix_cache()
        assert len(coord.block_pool.cached_block_hash_to_block) == 0
        assert all(b.block_hash is None for b in coord.block_pool.blocks)
        stats = coord.make_prefix_cache_stats()
        assert stats is not None and stats.reset
        assert isinstance(coord.take_events()[-1], AllBlocksCleared)

    def test_stats(self) -> None:
        coord = make_coordinator([full_spec()], 10, log_stats=True)
        schedule(coord, make_request(coord, "0", list(range(40))))
        schedule(coord, make_request(coord, "1", list(range(40))))
        stats = coord.make_prefix_cache_stats()
        assert stats is not None
        assert (stats.requests, stats.queries, stats.hits) == (2, 80, 32)
        assert stats.hit_rate == 0.4
        fresh = coord.make_prefix_cache_stats()
        assert fresh is not None and fresh.requests == 0
        assert make_coordinator([full_spec()], 10).make_prefix_cache_stats() is None


class TestEvents:
    @pytest.mark.parametrize(
        ("profile", "kind"), [(VLLM_0_34, "full_attention"), (VLLM_0_23, "unknown")], ids=["0.34", "0.23"]
    )
    def test_a_group_of_full_and_sink_layers_reports_as_its_release_does(
        self, profile: ReleaseProfile, kind: str
    ) -> None:
        """Full and sink layers in one uniform-type group (one uniform base, two kinds): vLLM 0.34's events
        say full attention (B iface:1464-1472), 0.23's unknown (kvspec reported the representative sink
        layer's kind before); a group of full layers alone is full attention under both."""
        sink = SinkFullAttentionSpec(
            block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16, sink_len=16
        )
        merged = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full_spec(), "b": sink})
        coord = make_coordinator([merged], 12, events=True, profile=profile)
        schedule(coord, make_request(coord, "0", list(range(32))))
        stored = [e for e in coord.take_events() if isinstance(e, BlockStored)]
        assert stored and {e.kv_cache_spec_kind for e in stored} == {kind}
        alike = UniformTypeKVCacheSpecs(
            block_size=16,
            kv_cache_specs={"a": full_spec(), "b": dataclasses.replace(full_spec(), head_size=32)},
        )
        coord = make_coordinator([alike], 12, events=True, profile=profile)
        schedule(coord, make_request(coord, "0", list(range(32))))
        stored = [e for e in coord.take_events() if isinstance(e, BlockStored)]
        assert stored and {e.kv_cache_spec_kind for e in stored} == {"full_attention"}

    @pytest.mark.parametrize("num_blocks", [2, 3, 10])
    def test_kv_cache_events(self, num_blocks: int) -> None:
        coord = make_coordinator([full_spec()], num_blocks + 1, events=True)
        r0 = make_request(coord, "0", list(range(16 * num_blocks)), lora_name="adapter")
        schedule(coord, r0)
        (stored,) = coord.take_events()
        assert isinstance(stored, BlockStored)
        assert len(stored.token_ids) == 16 * len(stored.block_hashes) == 16 * num_blocks
        assert stored.kv_cache_spec_kind == "full_attention" and stored.lora_name == "adapter"
        assert stored.parent_block_hash is None and stored.group_idx == 0
        assert coord.take_events() == []
        coord.free(r0)
        r1 = make_request(coord, "1", list(range(1000, 1000 + 16 * num_blocks)))
        schedule(coord, r1)
        events = coord.take_events()
        assert [type(e) for e in events] == [BlockRemoved] * num_blocks + [BlockStored]

    def test_parent_hash_is_logical_even_when_physical_parent_is_null(self) -> None:
        coord = make_coordinator([sw_spec(16, block_size=16)], 20, events=True)
        r0 = make_request(coord, "0", list(range(40)))
        schedule(coord, r0, 32)
        r0.num_computed_tokens = 32
        coord.take_events()
        r0.append_output_token_ids([1] * 8)
        assert coord.allocate_slots(r0, 16) is not None  # blocks 0 left the window: now null
        (stored,) = coord.take_events()
        assert isinstance(stored, BlockStored)
        assert stored.parent_block_hash == r0.block_hashes[1]
        assert stored.kv_cache_spec_sliding_window == 16
        assert coord.block_pool.null_block.block_hash is None

    def test_stored_blocks_name_the_session_that_stored_them(self) -> None:
        """vLLM 0.34's BlockStored.session_id: the storing request's session, kept through the per-group
        annotation; the session is not part of a block's hash (another session hits the same prefix)."""
        coord = make_coordinator([full_spec(), sw_spec(32)], 20, events=True)
        first = make_request(coord, "a", list(range(32)), session_id="agent-1")
        schedule(coord, first)
        events = [e for e in coord.take_events() if isinstance(e, BlockStored)]
        assert [(e.group_idx, e.session_id) for e in events] == [(0, "agent-1"), (1, "agent-1")]
        other = make_request(coord, "b", [*range(32), 7], session_id="agent-2")
        assert other.block_hashes == first.block_hashes
        _, hit = coord.get_computed_blocks(other)
        assert hit == 32
        schedule(coord, make_request(coord, "c", list(range(100, 132))))
        assert all(e.session_id is None for e in coord.take_events() if isinstance(e, BlockStored))

    def test_masked_blocks_events_list_one_entry_per_stored_block(self) -> None:
        """A sliding-window group caches only each scheduler block's window tail; an event's per-block lists
        (extra keys) must follow the blocks it stored, also when the request cached earlier blocks before."""
        coord = make_coordinator([full_spec(block_size=64), sw_spec(16)], 40, events=True)
        request = make_request(coord, "a", list(range(256)), lora_name="adapter")
        computed, _ = coord.get_computed_blocks(request)
        for n in (96, 160):  # the second chunk starts after six cached sliding-window blocks
            assert coord.allocate_slots(request, n, request.num_computed_tokens, computed) is not None
            request.num_computed_tokens += n
            computed = None  # type: ignore[assignment]
        stored = [e for e in coord.take_events() if isinstance(e, BlockStored) and e.group_idx == 1]
        assert [len(e.block_hashes) for e in stored] == [1, 3]  # blocks 3; 7, 11, 15
        for event in stored:
            assert event.extra_keys is not None and len(event.extra_keys) == len(event.block_hashes)

    @pytest.mark.parametrize("profile", [VLLM_0_34, VLLM_0_23], ids=lambda p: p.name)
    def test_prompt_tail_entry_inside_a_larger_block_under_0_34(self, profile: ReleaseProfile) -> None:
        """Full attention of 32-token blocks beside a 16-token window hashes at 16: vLLM 0.34 registers the
        prompt's last hash boundary (119 -> 112) inside block 3 as a partial entry once the aligned caching
        reaches it (a secondary key of the then full block); 0.23 publishes full blocks only."""
        coord = make_coordinator([full_spec(block_size=32), sw_spec(32)], 40, events=True, profile=profile)
        request = make_request(coord, "a", list(range(1, 121)))
        schedule(coord, request)
        request.num_computed_tokens = 120
        coord.take_events()
        request.append_output_token_ids(list(range(500, 508)))
        assert coord.allocate_slots(request, 8) is not None
        stored = [e for e in coord.take_events() if isinstance(e, BlockStored) and e.group_idx == 0]
        tail = [e.block_hashes for e in stored if e.block_size == 16]
        assert tail == ([[request.block_hashes[6]]] if profile.hit_search.partial_prompt_tail_entries else [])
        block3 = coord.get_blocks("a").blocks[0][3]
        hit = coord.block_pool.get_cached_block(request.block_hashes[6], [0])
        assert (hit == [block3]) is profile.hit_search.partial_prompt_tail_entries
        coord.check_invariants()
        coord.free(request)
        coord.check_invariants()

    def test_group_idx_and_kind_per_group(self) -> None:
        coord = make_coordinator([full_spec(), sw_spec(32)], 20, events=True)
        schedule(coord, make_request(coord, "0", list(range(32))))
        events = coord.take_events()
        assert [(e.group_idx, e.kv_cache_spec_kind) for e in events if isinstance(e, BlockStored)] == [
            (0, "full_attention"),
            (1, "sliding_window"),
        ]


class TestAdmission:
    def test_swa_cap_admits_long_prompts(self) -> None:
        coord = make_coordinator([sw_spec(64)], 20, max_model_len=4096, max_num_batched_tokens=64)
        long = make_request(coord, "0", list(range(2000)))
        assert coord.allocate_slots(long, 64, full_sequence_must_fit=True) is not None

    def test_full_attention_still_gates_oversized(self) -> None:
        coord = make_coordinator([full_spec()], 20, max_model_len=4096, max_num_batched_tokens=64)
        long = make_request(coord, "0", list(range(2000)))
        assert coord.allocate_slots(long, 64, full_sequence_must_fit=True) is None
        assert coord.allocate_slots(long, 64) is not None  # without the gate, one chunk fits

    def test_lookahead(self) -> None:
        coord = make_coordinator([full_spec(block_size=4)], 20)
        r = make_request(coord, "0", [1, 2, 3])
        assert len(coord.allocate_slots(r, 3, num_lookahead_tokens=2).get_block_ids()[0]) == 2  # type: ignore[union-attr]
        r2 = make_request(coord, "1", [1, 2, 3])
        assert len(coord.allocate_slots(r2, 3, num_lookahead_tokens=4).get_block_ids()[0]) == 2  # type: ignore[union-attr]

    def test_reserved_blocks(self) -> None:
        coord = make_coordinator([full_spec()], 5)
        assert coord.allocate_slots(make_request(coord, "0", list(range(40))), 40, reserved_blocks=2) is None


class TestConfigurationErrors:
    def test_cross_attention_requires_no_caching(self) -> None:
        from kvspec import CrossAttentionSpec

        cross = CrossAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
        with pytest.raises(UnsupportedConfigurationError, match="enable_caching=False"):
            make_coordinator([full_spec(), cross], 10)
        coord = KVCacheCoordinator(
            make_config([full_spec(), cross], 20),
            SchedulerLimits(max_model_len=448, max_num_encoder_input_tokens=1500),
            enable_caching=False,
        )
        r = make_request(coord, "0", list(range(20)))
        new = coord.allocate_slots(r, 20, num_encoder_tokens=100)
        assert new is not None and [len(g) for g in new.get_block_ids()] == [2, 7]
        coord.check_invariants()

    def test_unit_sink_manager_reserves_blocks(self) -> None:
        from kvspec import SinkFullAttentionSpec

        sink = SinkFullAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32, sink_len=32
        )
        coord = make_coordinator([sink], 10, profile=VLLM_0_23)  # 0.34's sink manager reserves none
        assert coord.num_free_blocks == 7
        schedule(coord, make_request(coord, "0", list(range(20))))
        coord.check_invariants()

    def test_attention_free_model(self) -> None:
        coord = make_coordinator([], 1)
        r = make_request(coord, "0", [1, 2, 3])
        assert coord.get_computed_blocks(r)[1] == 0
        new = coord.allocate_slots(r, 3)
        assert new is not None and new.get_block_ids() == ()

    def test_mamba_align_mode_allocates_running_state(self) -> None:
        mamba = MambaSpec(
            block_size=16,
            shapes=((1,),),
            dtypes=(torch.float32,),
            mamba_cache_mode="align",
            num_speculative_blocks=1,
        )
        coord = make_coordinator([full_spec(), mamba], 40)
        r = make_request(coord, "0", list(range(40)))
        schedule(coord, r)
        mamba_ids = coord.get_block_ids("0")[1]
        assert mamba_ids[:2] == [0, 0] and all(i != 0 for i in mamba_ids[2:]) and len(mamba_ids) == 4
        coord.check_invariants()
        for step in range(30):
            r.append_output_token_ids(step)
            assert coord.allocate_slots(r, 1) is not None
            r.num_computed_tokens += 1
            coord.check_invariants()
            live = [i for i in coord.get_block_ids("0")[1] if i != 0]
            assert len(live) <= 3  # running state + speculative block (+ the previous state until freed)
        coord.free(r)
        coord.check_invariants()
        assert ids(coord.get_blocks("0").blocks[1]) == []


class TestSlidingWindowCacheMask:
    def test_hybrid_caches_only_the_window_tail_of_each_scheduler_block(self) -> None:
        full32 = full_spec(block_size=32, dtype=torch.float16)
        sw16 = sw_spec(17, block_size=16, dtype=torch.float32)  # needs ceil(16/16) = 1 block before a hit end
        coord = make_coordinator([full32, sw16], 40)
        r0 = make_request(coord, "0", list(range(130)))
        schedule(coord, r0)
        sw_blocks = coord.get_blocks("0").blocks[1]
        cached = [i for i, b in enumerate(sw_blocks) if not b.is_null and b.block_hash is not None]
        assert cached == [1, 3, 5, 7]  # the last block of each 32-token scheduler block; 8 is partial
        assert all(sw_blocks[i].block_hash is None for i in (0, 2, 4, 6))
        r1 = make_request(coord, "1", list(range(130)))
        computed, n = coord.get_computed_blocks(r1)
        assert n == 128 and computed.get_block_ids()[1][-1] == sw_blocks[7].block_id
        coord.check_invariants()

    def test_equal_block_sizes_cache_everything(self) -> None:
        coord = make_coordinator([full_spec(), sw_spec(32)], 40)
        manager = coord.managers[1]
        assert manager.reachable_block_mask(8) is None  # type: ignore[attr-defined]


def test_num_common_prefix_blocks_counts_only_blocks_every_running_request_holds() -> None:
    coord = make_coordinator([full_spec()], 64)
    shared = list(range(48))
    a = make_request(coord, "a", [*shared, 1, 2])
    b = make_request(coord, "b", [*shared, 3, 4, 5])
    schedule(coord, a)
    schedule(coord, b)
    # a and b share their first 3 blocks (b hit a's cached ones); b's 4th block is its own.
    assert coord.get_num_common_prefix_blocks("a") == [3]
    assert coord.get_num_common_prefix_blocks("b") == [3]
    c = make_request(coord, "c", list(range(100, 140)))
    schedule(coord, c)
    assert coord.get_num_common_prefix_blocks("a") == [0]  # c shares nothing
    coord.free(c)
    coord.free(a)
    assert coord.get_num_common_prefix_blocks("b") == [4]  # alone: every block it holds is common


def test_mamba_align_allocation_returns_position_aligned_blocks() -> None:
    """vLLM 0.23 returns what it appended, null placeholders included ([0, 0, 0, 1] after a 64-token
    prefill of 16-token blocks), so a runner appending returned ids keeps the Mamba row aligned to
    positions; returning the compact [1] made such a runner read the wrong block."""
    mamba = MambaSpec(block_size=16, shapes=((4,),), dtypes=(torch.float32,), mamba_cache_mode="align")
    coord = KVCacheCoordinator(
        make_config([full_spec(), mamba], 64), SchedulerLimits(max_model_len=1024, mamba_cache_mode="align")
    )
    request = make_request(coord, "a", list(range(64)))
    rows: list[list[int]] = [[], []]
    computed, n = coord.get_computed_blocks(request)
    new = coord.allocate_slots(request, 64, n, computed)
    assert new is not None
    assert new.get_block_ids()[1] == [0, 0, 0, 5]
    request.num_computed_tokens = 64
    for gid, block_ids in enumerate(new.get_block_ids()):
        rows[gid].extend(block_ids)
    for _ in range(20):
        request.append_output_token_ids(1)
        coord.new_step_starts()
        step = coord.allocate_slots(request, 1)
        assert step is not None
        for gid, block_ids in enumerate(step.get_block_ids()):
            rows[gid].extend(block_ids)
        request.num_computed_tokens += 1
        state = coord.get_block_ids("a")[1]
        # The running state sits where the appended row says: the last block of both.
        assert rows[1][len(state) - 1] == state[-1] and len(rows[1]) == len(state)


def _seed_full_and_mamba(blocks: int) -> tuple[KVCacheCoordinator, list[int], list[int], list[int]]:
    """Full attention + Mamba "align", 16-token blocks: a prompt computed one block per step, so a state is
    cached at every block boundary; returns the coordinator, the prompt, and each group's block ids."""
    mamba = MambaSpec(block_size=16, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align")
    coord = make_coordinator([full_spec(16), mamba], 40)
    prompt = list(range(blocks * 16))
    fill = make_request(coord, "fill", prompt)
    mamba_ids: list[int] = []
    for step in range(blocks):
        coord.new_step_starts()
        assert coord.allocate_slots(fill, 16) is not None
        fill.num_computed_tokens += 16
        mamba_ids.append(coord.get_block_ids("fill")[1][step])  # the state this step's block end keeps
    fa_ids = [int(i) for i in coord.get_block_ids("fill")[0]]
    coord.free(fill)
    return coord, prompt, fa_ids, mamba_ids


@pytest.mark.parametrize(
    ("evicted", "per_group", "common"),
    [
        # Full attention's tail and the middle states evicted: the deep state at 64 survives alone.
        ((("fa", 2), ("fa", 3), ("mamba", 1), ("mamba", 2)), (32, 64), 16),
        # Every state but the first evicted: full attention reaches 64, Mamba 16.
        ((("mamba", 1), ("mamba", 2), ("mamba", 3)), (64, 16), 16),
        ((), (64, 64), 64),
    ],
)
def test_per_group_hits_diverge_where_the_common_hit_does_not(
    evicted: tuple[tuple[str, int], ...], per_group: tuple[int, int], common: int
) -> None:
    """vLLM 0.34's ``find_longest_cache_hit_per_group``: each group searched alone, for a KV connector that
    restores what a lagging group lacks; ``find_longest_cache_hit`` keeps the hit every group agrees on."""
    coord, prompt, fa_ids, mamba_ids = _seed_full_and_mamba(4)
    coord.block_pool.evict_blocks((fa_ids if group == "fa" else mamba_ids)[i] for group, i in evicted)
    replay = make_request(coord, "replay", prompt + list(range(900, 916)))
    blocks, hits = coord.find_longest_cache_hit_per_group(replay.block_hashes, replay.num_tokens - 1)
    assert hits == per_group
    assert [len(b) for b in blocks] == [h // 16 for h in per_group]
    assert blocks[0] == [coord.block_pool.blocks[i] for i in fa_ids[: per_group[0] // 16]]
    if per_group[1]:
        assert blocks[1][-1].block_id == mamba_ids[per_group[1] // 16 - 1]
    assert coord.find_longest_cache_hit(replay.block_hashes, replay.num_tokens - 1)[1] == common
    coord.check_invariants()
