"""The eviction-policy conformance kit: :func:`check_eviction_policy` and :func:`eviction_scenario`."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvspec.blocks.eviction import (
    BatchEvictionPolicy,
    BlockUse,
    EvictionPolicy,
    EvictionPolicyFactory,
    watches_block_use,
)
from kvspec.blocks.pool import BlockPool, KVCacheBlock
from kvspec.blocks.request import Request
from kvspec.contracts.release import ReleaseProfile
from kvspec.contracts.spec import SchedulerLimits
from kvspec.coordinator import KVCacheCoordinator
from kvspec.errors import InvariantError
from kvspec.eviction.registry import check_eviction_policy_factory, probe_context
from kvspec.planning.config import KVCacheConfig, KVCacheGroupSpec
from kvspec.specs.attention import FullAttentionSpec, SlidingWindowSpec
from kvspec.testing.checker import (
    _fail,
)

__all__ = ["EvictionReport", "check_eviction_policy", "eviction_scenario"]


# -- eviction policies -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class EvictionReport:
    """What :func:`check_eviction_policy` drove: the block ids of every allocation in order (equal for two
    policies that evict alike), blocks evicted with cached content, and prefix-hit tokens."""

    allocations: tuple[tuple[int, ...], ...]
    evictions: int
    hit_tokens: int


class _ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _eviction_scenario(
    factory: EvictionPolicyFactory | None,
    seed: int,
    steps: int,
    num_blocks: int,
    profile: ReleaseProfile | None,
    asks: bool = True,
) -> EvictionReport:
    """One seeded run: requests over a few shared prefixes (full attention beside a sliding window, so two
    groups share the pool), with priorities and retentions, admitted with their prefix hit, freed in random
    order, plus bursts that take blocks straight from the pool; checked after every step."""
    rng = random.Random(seed)
    clock = _ManualClock()
    specs = (
        FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float16),
        SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float16, sliding_window=8),
    )
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=(),
        kv_cache_groups=tuple(
            KVCacheGroupSpec(layer_names=(f"layer_{i}",), kv_cache_spec=spec) for i, spec in enumerate(specs)
        ),
    )
    coord = KVCacheCoordinator(
        config,
        SchedulerLimits(max_model_len=256),
        eviction_policy=factory,
        eviction_clock=clock,
        profile=profile,
    )
    pool = coord.block_pool
    policy = pool.eviction_policy
    hasher = coord.make_block_hasher(seed="kvspec-eviction-kit")
    prefixes = [[rng.randrange(1000) for _ in range(rng.choice((8, 12, 16, 24)))] for _ in range(5)]
    live: list[Request] = []
    allocations: list[tuple[int, ...]] = []
    evictions = hit_tokens = 0
    for step in range(steps):
        clock.now += rng.random()
        action = rng.random()
        if live and (action < 0.35 or len(live) >= 3):
            request = live.pop(rng.randrange(len(live)))
            coord.free(request)
        elif action < 0.9:
            tokens = list(rng.choice(prefixes)) + [rng.randrange(1000) for _ in range(rng.randrange(1, 14))]
            request = Request(
                f"r{step}",
                tokens,
                block_hasher=hasher,
                priority=rng.randrange(3) if asks else 0,
                retention_seconds=rng.choice((None, None, 2.0, 30.0)) if asks else None,
            )
            computed, hit = coord.get_computed_blocks(request)
            hashed_before = {b.block_id for b in pool.blocks if b.block_hash is not None}
            blocks = coord.allocate_slots(request, len(tokens) - hit, hit, computed)
            if blocks is None:
                continue
            request.num_computed_tokens = len(tokens)
            live.append(request)
            hit_tokens += hit
            new_ids = tuple(i for group in blocks.get_block_ids() for i in group)
            allocations.append(new_ids)
            evictions += len(hashed_before & set(new_ids))
        else:
            # A burst straight from the pool: the blocks handed out must be the reuse-first list, then the
            # policy's victims in the order evictable_blocks() gave just before.
            queue = pool.free_block_queue
            first = [
                b for b in queue.get_all_free_blocks() if b.prev_free_block is not None
            ]  # the linked list part
            unhashed = sum(1 for b in queue.get_all_free_blocks() if b.block_hash is None)
            take = min(queue.num_free_blocks, unhashed + rng.randrange(1, 4))
            if take == 0:
                continue
            expected = first + (policy.evictable_blocks() if policy is not None else [])
            taken = pool.get_new_blocks(take)
            if policy is not None and [b.block_id for b in taken] != [b.block_id for b in expected[:take]]:
                raise _fail(
                    f"eviction policy {type(policy).__name__}: the pool took blocks "
                    f"{[b.block_id for b in taken]} but evictable_blocks() promised "
                    f"{[b.block_id for b in expected[:take]]} (after the {len(first)} blocks to reuse first)"
                )
            allocations.append(tuple(b.block_id for b in taken))
            pool.free_blocks(taken)
        try:
            coord.check_invariants()
        except InvariantError as exc:
            raise _fail(
                f"eviction policy {type(policy).__name__}: the pool's invariants broke at step {step}: {exc} "
                "(does the policy hold exactly the free blocks it was given, minus those removed?)"
            ) from exc
        if policy is not None:
            _check_policy_state(policy, pool)
    for request in live:
        coord.free(request)
    coord.check_invariants()
    if pool.get_num_free_blocks() != num_blocks - 1:
        raise _fail(f"finishing every request left {num_blocks - 1 - pool.get_num_free_blocks()} blocks held")
    return EvictionReport(allocations=tuple(allocations), evictions=evictions, hit_tokens=hit_tokens)


def _check_policy_state(policy: EvictionPolicy, pool: BlockPool) -> None:
    held = policy.evictable_blocks()
    name = type(policy).__name__
    ids_held = [b.block_id for b in held]
    if len(set(ids_held)) != len(ids_held):
        raise _fail(f"eviction policy {name}: evictable_blocks() lists a block twice: {ids_held}")
    if len(held) != len(policy):
        raise _fail(
            f"eviction policy {name}: len() is {len(policy)} but evictable_blocks() lists {len(held)}"
        )
    expected = {b.block_id for b in pool.free_block_queue.get_all_free_blocks() if b.prev_free_block is None}
    if set(ids_held) != expected:
        raise _fail(
            f"eviction policy {name}: holds {sorted(ids_held)} but the free blocks with cached content given "
            f"to it are {sorted(expected)}"
        )
    for block in held:
        if block.ref_cnt != 0:
            raise _fail(f"eviction policy {name}: lists block {block.block_id}, which a request holds")


class _PerBlockCalls:
    """A policy seen through its per-block methods only (its batch methods and ``watches_block_use``
    hidden, so the pool makes every call), for the kit to run a policy both ways."""

    __slots__ = ("_policy",)

    def __init__(self, policy: EvictionPolicy) -> None:
        self._policy = policy

    def add(self, block: KVCacheBlock) -> None:
        self._policy.add(block)

    def remove(self, block: KVCacheBlock) -> None:
        self._policy.remove(block)

    def pop_victim(self) -> KVCacheBlock:
        return self._policy.pop_victim()

    def __len__(self) -> int:
        return len(self._policy)

    def evictable_blocks(self) -> list[KVCacheBlock]:
        return self._policy.evictable_blocks()

    def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        self._policy.on_cached(blocks, use)

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        self._policy.on_hit(blocks, use)


def check_eviction_policy(
    factory: EvictionPolicyFactory,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    steps: int = 300,
    num_blocks: int = 40,
    profile: ReleaseProfile | None = None,
) -> EvictionReport:
    """The conformance kit for an eviction policy: drive a coordinator with ``factory``'s policy through
    seeded random requests (shared prefixes, prefix hits, priorities, retentions, frees in random order,
    bursts that force eviction) and check after every step the pool's invariants, that the policy holds
    exactly the free blocks with cached content (no held block, none twice, ``len`` agreeing), that the
    blocks the pool takes follow ``evictable_blocks()``'s order, that every block comes back at the end,
    and that a second run of the same seed gives the same block ids (determinism). Raises
    ``PluginContractError`` naming what failed; returns the first seed's report."""
    checked = check_eviction_policy_factory(getattr(factory, "__name__", "policy"), factory)
    name = getattr(factory, "__name__", factory)
    reports = []
    for seed in seeds:
        first = _eviction_scenario(checked, seed, steps, num_blocks, profile)
        again = _eviction_scenario(checked, seed, steps, num_blocks, profile)
        if first != again:
            raise _fail(
                f"eviction policy from {name!r} is not deterministic: seed {seed} gave different block ids on "
                "a second run"
            )
        probe = checked(probe_context(num_blocks))
        if isinstance(probe, BatchEvictionPolicy) or not watches_block_use(probe):
            # The pool calls a batch policy's add_blocks / pop_victims; they must act as add / pop_victim.
            # It skips on_cached / on_hit of a policy that says it ignores them; they must change nothing.
            # The adapter shows the pool neither, so both claims are checked by one run.
            per_block = _eviction_scenario(
                lambda context: _PerBlockCalls(checked(context)), seed, steps, num_blocks, profile
            )
            if per_block != first:
                raise _fail(
                    f"eviction policy from {name!r}: seed {seed} gave other block ids through add / "
                    "pop_victim one block at a time with every on_cached / on_hit call: its add_blocks / "
                    "pop_victims do not act as the per-block calls, or it says watches_block_use = False "
                    "and the calls change its order"
                )
        reports.append(first)
    if not any(r.evictions for r in reports):
        raise _fail("the scenario evicted nothing; give fewer num_blocks")
    return reports[0]


def eviction_scenario(
    factory: EvictionPolicyFactory | None,
    *,
    seed: int = 0,
    steps: int = 300,
    num_blocks: int = 40,
    profile: ReleaseProfile | None = None,
    asks: bool = True,
) -> EvictionReport:
    """The kit's seeded scenario run once (None: the pool's own LRU), to compare two policies' block ids;
    ``asks`` False: every request at priority 0 without retention."""
    return _eviction_scenario(factory, seed, steps, num_blocks, profile, asks)
