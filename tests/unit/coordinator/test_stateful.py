"""A hypothesis state machine drives the coordinator like a scheduler would and checks, after every step:
no block leaked or double-freed, ref counts equal the number of holders, every cached hash maps to a block
carrying it, free + used == total, and every prefix hit matches the request's own block hashes."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvspec import KVCacheCoordinator, KVCacheSpec, MambaSpec, Request, RequestView
from kvspec.blocks.hashing import BlockHashListWithBlockSize
from kvspec.contracts.release import VLLM_0_23, VLLM_0_34, ReleaseProfile
from tests.helpers import full_spec, make_coordinator, make_request, sw_spec

CONFIGS: dict[str, Callable[[], list[KVCacheSpec]]] = {
    "full": lambda: [full_spec()],
    "full+sw": lambda: [full_spec(), sw_spec(32), sw_spec(32)],
    "sw+sw": lambda: [sw_spec(32), sw_spec(64)],
    "full+mamba": lambda: [
        full_spec(),
        MambaSpec(block_size=16, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="all"),
    ],
    "mixed-block-sizes": lambda: [
        full_spec(block_size=32, dtype=torch.float16),
        sw_spec(32, dtype=torch.float32),
    ],
}
PREFIXES = [list(range(1000 + 100 * p, 1000 + 100 * p + 64)) for p in range(3)]


class CoordinatorMachine(RuleBasedStateMachine):
    coord: KVCacheCoordinator

    def __init__(self) -> None:
        super().__init__()
        self.waiting: dict[str, Request] = {}
        self.running: dict[str, Request] = {}
        self.next_id = 0
        self.rng = random.Random(0)

    @initialize(
        config=st.sampled_from(sorted(CONFIGS)),
        num_blocks=st.integers(8, 40),
        chunk=st.sampled_from([16, 32, 48]),
        caching=st.booleans(),
        profile=st.sampled_from([VLLM_0_34, VLLM_0_23]),
    )
    def setup(self, config: str, num_blocks: int, chunk: int, caching: bool, profile: ReleaseProfile) -> None:
        self.coord = make_coordinator(
            CONFIGS[config](),
            num_blocks,
            max_model_len=512,
            max_num_batched_tokens=256,
            enable_caching=caching,
            # Mamba "all" runs under vLLM 0.23's profile only (0.34 dropped it).
            profile=VLLM_0_23 if config == "full+mamba" else profile,
        )
        self.chunk = chunk

    @rule(
        prefix=st.integers(-1, 2),
        prefix_len=st.integers(0, 64),
        suffix_len=st.integers(1, 80),
        salt=st.sampled_from([None, "a"]),
    )
    def add_request(self, prefix: int, prefix_len: int, suffix_len: int, salt: str | None) -> None:
        head = PREFIXES[prefix][:prefix_len] if prefix >= 0 else []
        tokens = head + [self.rng.randrange(50) for _ in range(suffix_len)]
        rid = str(self.next_id)
        self.next_id += 1
        self.waiting[rid] = make_request(self.coord, rid, tokens, cache_salt=salt)

    def _check_hit(self, request: RequestView, blocks: tuple[list[int], ...] | None = None) -> None:
        computed, n = self.coord.get_computed_blocks(request)
        if not self.coord.enable_caching:
            assert n == 0 and not any(computed.blocks)
            return
        assert n % self.coord.scheduler_block_size == 0 or len(self.coord.specs) == 1
        assert n < request.num_tokens
        for gid, group in enumerate(computed.blocks):
            spec = self.coord.specs[gid]
            # A coarse block is keyed as the pool keys it under the profile (0.34: its last fine hash).
            view = BlockHashListWithBlockSize(
                request.block_hashes,
                self.coord.hash_block_size,
                spec.block_size,
                self.coord.block_pool.coarse_hash_is_last_fine,
            )
            assert len(group) * spec.block_size == n
            for i, block in enumerate(group):
                if not block.is_null:
                    assert block.block_hash == view[i] + gid.to_bytes(4, "big")

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.waiting)))
        request = self.waiting[rid]
        self._check_hit(request)
        computed, n = self.coord.get_computed_blocks(request)
        num_new = min(self.chunk, request.num_tokens - n)
        new = self.coord.allocate_slots(request, num_new, n, computed)
        if new is None:
            return
        request.num_computed_tokens = n + num_new
        del self.waiting[rid]
        self.running[rid] = request

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        request = self.running[rid]
        if request.num_computed_tokens >= request.num_tokens:
            request.append_output_token_ids(self.rng.randrange(50))
        if request.num_tokens >= 512:
            self._finish(rid)
            return
        num_new = min(self.chunk, request.num_tokens - request.num_computed_tokens)
        new = self.coord.allocate_slots(request, num_new)
        if new is None:  # preempt: drop everything, recompute later (its cached blocks may still hit)
            self.coord.free(request)
            request.num_computed_tokens = 0
            request.num_preemptions += 1
            del self.running[rid]
            self.waiting[rid] = request
            return
        request.num_computed_tokens += num_new

    def _finish(self, rid: str) -> None:
        self.coord.free(self.running.pop(rid))

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self._finish(data.draw(st.sampled_from(sorted(self.running))))

    @rule()
    def new_step(self) -> None:
        self.coord.new_step_starts()

    @rule()
    def reset(self) -> None:
        holding = bool(self.running)
        assert self.coord.reset_prefix_cache() is (not holding)
        if not holding:
            assert len(self.coord.block_pool.cached_block_hash_to_block) == 0

    @invariant()
    def pool_is_consistent(self) -> None:
        if not hasattr(self, "coord"):
            return
        coord = self.coord
        coord.check_invariants()
        pool = coord.block_pool
        used = sum(1 for b in pool.blocks if b.ref_cnt > 0 and not b.is_null)
        assert pool.get_num_free_blocks() + used == pool.num_gpu_blocks - 1
        holders = {rid for m in coord.managers for rid in getattr(m, "req_to_blocks", {})}
        assert holders <= set(self.running)
        if not self.running:
            sink = sum(len(getattr(m, "sink_blocks", ())) for m in coord.managers)
            assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1 - sink


TestCoordinatorStateMachine = CoordinatorMachine.TestCase
TestCoordinatorStateMachine.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
