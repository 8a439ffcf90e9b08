"""Mamba "align" beside full attention, step by step, against vLLM 0.23.0's numbers.

The numbers were read off vLLM 0.23.0's own ``KVCacheManager`` on the same calls (block size 16, one
speculative block, 40 blocks, prefix caching on); ``nox -s vllm`` checks the same rules on random workloads
(tests/vllm/differential.py). What they pin down: the speculative block moves up behind the skipped
positions and the new block comes last; the state block from two allocations ago, and a prefix hit's state
block, are freed once the computed tokens pass them, to the free queue's tail (not where the next
allocation takes them).
"""

from __future__ import annotations

import torch

from kvspec import KVCacheCoordinator, MambaSpec, Request
from kvspec.contracts.release import VLLM_0_23
from tests.helpers import free_ids, full_spec, make_coordinator, make_request


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


def _table(coord: KVCacheCoordinator, request_id: str) -> tuple[list[int], ...]:
    return tuple(list(g) for g in coord.get_block_ids(request_id))


def test_align_mode_block_tables_and_frees_match_vllm() -> None:
    mamba = MambaSpec(
        block_size=16,
        shapes=((16, 4),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
        num_speculative_blocks=1,
    )
    # Numbers read off vLLM 0.23.0's manager (0.34 reworked "align": issue 19).
    coord = make_coordinator([full_spec(), mamba], 40, max_model_len=1024, profile=VLLM_0_23)
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
