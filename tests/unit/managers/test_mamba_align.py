"""Mamba "align" beside full attention, step by step, against vLLM 0.23.0's numbers.

The numbers were read off vLLM 0.23.0's own ``KVCacheManager`` on the same calls (block size 16, one
speculative block, 40 blocks, prefix caching on); ``nox -s vllm`` checks the same rules on random workloads
(tests/vllm/differential.py). What they pin down: the speculative block moves up behind the skipped
positions and the new block comes last; the state block from two allocations ago, and a prefix hit's state
block, are freed once the computed tokens pass them, to the free queue's tail (not where the next
allocation takes them).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvspec import KVCacheCoordinator, MambaSpec, Request, SchedulerLimits
from kvspec.contracts.release import VLLM_0_23, VLLM_0_32, VLLM_0_34, ReleaseProfile
from tests.helpers import free_ids, full_spec, make_config, make_coordinator, make_request


def _step(
    coord: KVCacheCoordinator, request: Request, num_new: int, hit: tuple[object, int] | None = None
) -> object:
    coord.new_step_starts()
    blocks, num_hit = (None, 0) if hit is None else hit
    new = coord.allocate_slots(request, num_new, num_hit, blocks)  # type: ignore[arg-type]
    assert new is not None
    request.num_computed_tokens += num_hit + num_new
    if request.num_computed_tokens >= request.num_tokens:
        request.append_output_token_ids(7)
    return new


#: One Mamba layer in "align" mode with one speculative block, beside 16-token full attention.
MAMBA = MambaSpec(
    block_size=16,
    shapes=((16, 4),),
    dtypes=(torch.float32,),
    mamba_cache_mode="align",
    num_speculative_blocks=1,
)


def _table(coord: KVCacheCoordinator, request_id: str) -> tuple[list[int], ...]:
    return tuple(list(g) for g in coord.get_block_ids(request_id))


def test_align_mode_block_tables_and_frees_match_vllm() -> None:
    # Numbers read off vLLM 0.23.0's manager (0.34 reworked "align": issue 19).
    coord = make_coordinator([full_spec(), MAMBA], 40, max_model_len=1024, profile=VLLM_0_23)
    a = make_request(coord, "a", list(range(1, 65)))
    _step(coord, a, 32)
    assert _table(coord, "a") == ([1, 2], [0, 3, 4])
    _step(coord, a, 32)
    # The speculative block 4 moves up behind the skipped position; the new block 7 comes last.
    assert _table(coord, "a") == ([1, 2, 5, 6], [0, 3, 0, 4, 7])
    assert coord.block_pool.get_num_free_blocks() == 32
    _step(coord, a, 1)
    # Block 3, the state from two allocations ago, is freed to the tail: 10 is still next.
    assert _table(coord, "a") == ([1, 2, 5, 6, 8], [0, 0, 0, 4, 7, 9])
    assert coord.block_pool.get_num_free_blocks() == 31 and free_ids(coord)[:2] == [10, 11]
    for _ in range(19):
        _step(coord, a, 1)
    assert _table(coord, "a") == ([1, 2, 5, 6, 8, 10], [0, 0, 0, 0, 0, 9, 11])
    assert coord.block_pool.get_num_free_blocks() == 31

    b = make_request(coord, "b", list(range(1, 65)) + list(range(500, 520)))
    coord.new_step_starts()
    hit_blocks, hit_tokens = coord.get_computed_blocks(b)
    assert ([list(g) for g in hit_blocks.get_block_ids()], hit_tokens) == ([[1, 2, 5, 6], [0, 0, 0, 4]], 64)
    _step(coord, b, 16, (hit_blocks, hit_tokens))
    assert _table(coord, "b") == ([1, 2, 5, 6, 12], [0, 0, 0, 4, 13, 14])
    _step(coord, b, 4)
    # The hit's state block 4 is let go once b computes past the block after it.
    assert _table(coord, "b") == ([1, 2, 5, 6, 12, 15], [0, 0, 0, 0, 13, 14, 16])
    assert coord.block_pool.get_num_free_blocks() == 26
    for _ in range(3):
        _step(coord, b, 1)
    assert _table(coord, "b") == ([1, 2, 5, 6, 12, 15], [0, 0, 0, 0, 0, 14, 16])
    coord.free(a)
    coord.free(b)
    free = free_ids(coord)
    assert len(free) == 39 and free[:6] == [17, 18, 19, 20, 21, 22]
    assert free[-12:] == [10, 8, 11, 9, 15, 12, 6, 5, 2, 1, 16, 14]


# Read off vLLM 0.34.0's manager on the same calls (a 160-token prompt in chunks of 48, 48, 48, 16, then
# three decode steps): the block tables after each step, the free blocks, and the free queue's head after
# the request finishes.
_TABLES_0_34 = [
    (([1, 2, 3], [0, 0, 4, 5]), 34),
    (([1, 2, 3, 6, 7, 8], [0, 0, 4, 0, 0, 5, 9]), 30),
    (([1, 2, 3, 6, 7, 8, 10, 11, 12], [0, 0, 0, 0, 0, 5, 0, 0, 9, 13]), 27),
    (([1, 2, 3, 6, 7, 8, 10, 11, 12, 14], [0, 0, 0, 0, 0, 0, 0, 0, 9, 13, 15]), 26),
    (([1, 2, 3, 6, 7, 8, 10, 11, 12, 14, 16], [0, 0, 0, 0, 0, 0, 0, 0, 0, 13, 15, 17]), 25),
    (([1, 2, 3, 6, 7, 8, 10, 11, 12, 14, 16], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 17]), 26),
    (([1, 2, 3, 6, 7, 8, 10, 11, 12, 14, 16], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 17]), 26),
]


@pytest.mark.parametrize("profile", [VLLM_0_34, VLLM_0_23], ids=lambda p: p.name)
def test_align_frees_after_chunked_prefill_match_vllm_0_34(profile: ReleaseProfile) -> None:
    """vLLM 0.34 counts the skipped Mamba tokens from every processed token (0.23 kept the speculative
    block's token back: the state block 13 is freed one decode step later there), and frees the states a
    chunked prefill left behind across its null gaps; freed unhashed blocks are reused first."""
    coord = make_coordinator([full_spec(), MAMBA], 40, max_model_len=1024, profile=profile)
    a = make_request(coord, "a", list(range(1, 161)))
    seen = []
    for n in (48, 48, 48, 16, 1, 1, 1):
        _step(coord, a, n)
        seen.append((_table(coord, "a"), coord.block_pool.get_num_free_blocks()))
        coord.check_invariants()
    coord.free(a)
    if profile is VLLM_0_34:
        assert seen == _TABLES_0_34
        assert free_ids(coord)[:8] == [17, 15, 16, 18, 19, 20, 21, 22]
    else:
        assert seen[:5] == _TABLES_0_34[:5] and seen[6] == _TABLES_0_34[6]
        assert seen[5] == (_TABLES_0_34[4][0], 25)  # block 13 still held one step more
        assert free_ids(coord)[:8] == list(range(18, 26))


@pytest.mark.parametrize("profile", [VLLM_0_32, VLLM_0_34], ids=lambda p: p.name)
def test_a_hit_on_a_recached_prompt_boundary_state_waits_under_0_32(profile: ReleaseProfile) -> None:
    """vLLM 0.32.0 re-keys the Mamba state at the prompt's last hash boundary each time it caches exactly up
    to it, marking it cached this step again (the differential against 0.32's own manager, seed 1606): a
    148-token prompt computes 144 tokens, a sibling's hit on that state waits that step under both
    releases; the next step the first request caches up to 144 again and the sibling still waits under
    0.32, while 0.34 admits it."""
    spec = MambaSpec(block_size=16, shapes=((16, 4),), dtypes=(torch.float32,), mamba_cache_mode="align")
    coord = make_coordinator([full_spec(), spec], 120, max_model_len=1024, profile=profile)
    prompt = list(range(1, 149))
    first = make_request(coord, "a", prompt)
    _step(coord, first, 144)
    sibling = make_request(coord, "b", prompt)
    blocks, hit = coord.get_computed_blocks(sibling)
    assert hit == 144
    assert coord.allocate_slots(sibling, 4, hit, blocks) is None  # cached this step: both releases wait
    _step(coord, first, 4)  # caches up to 144 again (148 is not a whole block)
    blocks, hit = coord.get_computed_blocks(sibling)
    admitted = coord.allocate_slots(sibling, 4, hit, blocks)
    assert (admitted is None) is (profile is VLLM_0_32)


#: A Mamba2 / GDN layer under vLLM 0.34: its backend exports the state at the last boundary a resend can
#: hit from inside the prompt's final chunk (one checkpoint block, any token position).
CHECKPOINTED = MambaSpec(
    block_size=16,
    shapes=((16, 4),),
    dtypes=(torch.float32,),
    mamba_cache_mode="align",
    num_prefill_checkpoint_blocks=1,
    prefill_checkpoint_alignment=1,
)


def _checkpoint_coordinator(
    spec: MambaSpec, *, use_eagle: bool = False, retention: int | None = 0
) -> KVCacheCoordinator:
    return KVCacheCoordinator(
        make_config([full_spec(), spec], 60),
        SchedulerLimits(max_model_len=1024),
        use_eagle=use_eagle,
        profile=VLLM_0_34,
        prefix_cache_retention_interval=retention,
    )


@pytest.mark.parametrize("checkpoints", [0, 1])
def test_a_prompts_final_chunk_exports_its_checkpoint_into_a_reserved_block(checkpoints: int) -> None:
    """One 100-token chunk runs past 96, the last boundary a resend can hit: with a checkpoint block the
    block before the chunk's last (index 5) is a real block holding the state at 96, cached there, so a
    resend hits 96 tokens; without, that position is null and the Mamba group has no state to resume."""
    coord = _checkpoint_coordinator(
        dataclasses.replace(CHECKPOINTED, num_prefill_checkpoint_blocks=checkpoints)
    )
    a = make_request(coord, "a", list(range(1, 101)))
    _step(coord, a, 100)
    mamba = _table(coord, "a")[1]
    assert len(mamba) == 7
    assert mamba[:5] == [0] * 5 and (mamba[5] != 0) is bool(checkpoints) and mamba[6] != 0
    coord.check_invariants()
    b = make_request(coord, "b", list(range(1, 101)))
    coord.new_step_starts()
    blocks, hit = coord.get_computed_blocks(b)
    assert hit == (96 if checkpoints else 0)
    if checkpoints:
        assert blocks.get_block_ids()[1][-1] == mamba[5]
        # The reservation is counted before it is taken: one block more than the running state.
        assert coord.block_pool.get_num_free_blocks() == 59 - 7 - 2


def test_a_chunk_that_cannot_export_the_checkpoint_reserves_nothing() -> None:
    """80 -> 100 can export the state at 96 (one hash block after its start) with any alignment, but not
    with a 32-token one (96 is 16 tokens past the chunk's start): then position 5 stays null."""
    for alignment, reserved in ((1, True), (32, False)):
        coord = _checkpoint_coordinator(
            dataclasses.replace(CHECKPOINTED, prefill_checkpoint_alignment=alignment)
        )
        a = make_request(coord, "a", list(range(1, 101)))
        _step(coord, a, 80)
        free = coord.block_pool.get_num_free_blocks()
        _step(coord, a, 20)
        mamba = _table(coord, "a")[1]
        assert (mamba[5] != 0) is reserved
        assert (
            free - coord.block_pool.get_num_free_blocks() == 3 + reserved
        )  # 2 attention blocks, the state (+ the checkpoint)


def test_with_eagle_the_checkpoint_block_is_rekeyed_one_hash_block_lower() -> None:
    """EAGLE drops a hash block off every hit, so the exported state is the one at 80 (not 96), written into
    the reserved block 5; dense retention had keyed that block at 96 this step, and that key, which would
    promise a state the block does not hold, is replaced by the 80-token one."""
    coord = _checkpoint_coordinator(CHECKPOINTED, use_eagle=True, retention=None)
    a = make_request(coord, "a", list(range(1, 101)))
    _step(coord, a, 100)
    block = coord.managers[1].get_blocks("a")[5]
    assert not block.is_null and block.block_hash_num_tokens == 80
    assert coord.block_pool.get_cached_block(a.block_hashes[5], [1]) is None
    assert coord.block_pool.get_cached_block(a.block_hashes[4], [1]) == [block]
    coord.check_invariants()


def test_the_checkpoint_block_is_counted_before_it_is_taken() -> None:
    """Seven attention blocks, the running state and the checkpoint need 9 blocks: with 8 free the chunk is
    refused (nothing taken), with 9 it runs."""
    for num_blocks, fits in ((9, False), (10, True)):
        coord = KVCacheCoordinator(
            make_config([full_spec(), CHECKPOINTED], num_blocks),
            SchedulerLimits(max_model_len=1024),
            profile=VLLM_0_34,
            prefix_cache_retention_interval=0,
        )
        a = make_request(coord, "a", list(range(1, 101)))
        assert (coord.allocate_slots(a, 100) is not None) is fits
        assert coord.block_pool.get_num_free_blocks() == (0 if fits else num_blocks - 1)
        coord.check_invariants()


def _offers(coord: KVCacheCoordinator) -> list[tuple[str, int, int, int]]:
    return [
        (s.request_id, s.kv_cache_group_id, s.block_id, s.num_tokens) for s in coord.take_boundary_states()
    ]


def test_each_keyed_state_block_is_offered_once_with_its_exact_id() -> None:
    """Dense retention: the 32-token chunk keys the state at 32 in block 1 (block 0 is a null position); the
    next 16 key the state at 48 in the block that was speculative (block 2); decoding past no boundary
    offers nothing; the full-attention group offers nothing (a connector finds its blocks by position)."""
    coord = _checkpoint_coordinator(MAMBA, retention=None)
    a = make_request(coord, "a", list(range(1, 49)))
    _step(coord, a, 32)
    mamba = _table(coord, "a")[1]
    assert mamba[0] == 0
    assert _offers(coord) == [("a", 1, mamba[1], 32)]
    assert _offers(coord) == []  # drained
    _step(coord, a, 16)
    assert _offers(coord) == [("a", 1, mamba[2], 48)]
    _step(coord, a, 1)
    assert _offers(coord) == []
    coord.check_invariants()


@pytest.mark.parametrize(("retention", "first_chunk_offers"), [(None, True), (0, False)])
def test_sparse_retention_offers_only_the_states_it_keeps(
    retention: int | None, first_chunk_offers: bool
) -> None:
    """Interval 0 keys only the state at the prompt's replay boundary (32 of 40 tokens): the state at 16
    is transient there, neither keyed nor offered; dense retention offers both."""
    coord = _checkpoint_coordinator(MAMBA, retention=retention)
    a = make_request(coord, "a", list(range(1, 41)))
    _step(coord, a, 16)
    first = _table(coord, "a")[1][0]
    assert _offers(coord) == ([("a", 1, first, 16)] if first_chunk_offers else [])
    assert (coord.block_pool.get_cached_block(a.block_hashes[0], [1]) is not None) is first_chunk_offers
    _step(coord, a, 16)
    assert _offers(coord) == [("a", 1, _table(coord, "a")[1][1], 32)]
    _step(coord, a, 8)
    assert _offers(coord) == []


def test_an_offer_not_taken_before_its_request_is_freed_is_dropped() -> None:
    """The blocks go back to the pool with the request; another request's offers stay."""
    coord = _checkpoint_coordinator(MAMBA, retention=None)
    a = make_request(coord, "a", list(range(1, 41)))
    b = make_request(coord, "b", list(range(100, 140)))
    _step(coord, a, 32)
    _step(coord, b, 32)
    b_state = _table(coord, "b")[1][1]
    coord.free(a)
    assert _offers(coord) == [("b", 1, b_state, 32)]
    coord.check_invariants()
