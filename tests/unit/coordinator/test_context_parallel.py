"""Decode/prefill context parallelism: a group's block spans the CP ranks, and prefix hits are found in
blocks of that size (issue 18: DCP 2 with prefix caching failed at the first hit search)."""

from __future__ import annotations

import pytest
import torch

from kvspec import KVCacheCoordinator, MLAAttentionSpec, SchedulerLimits
from tests.helpers import full_spec, make_config, make_request, schedule


def _coordinator(specs: list[object], dcp: int, pcp: int = 1, num_blocks: int = 64) -> KVCacheCoordinator:
    return KVCacheCoordinator(
        make_config(specs, num_blocks),  # type: ignore[arg-type]
        SchedulerLimits(
            max_model_len=8192,
            max_num_batched_tokens=4096,
            decode_context_parallel_size=dcp,
            prefill_context_parallel_size=pcp,
        ),
    )


@pytest.mark.parametrize(("dcp", "pcp"), [(2, 1), (1, 2), (2, 2)])
def test_prefix_hits_in_blocks_spanning_the_cp_ranks(dcp: int, pcp: int) -> None:
    coord = _coordinator([full_spec(block_size=128)], dcp, pcp)
    span = 128 * dcp * pcp
    assert coord.hash_block_size == coord.scheduler_block_size == span
    shared = list(range(1, 2 * span + 1))
    first = make_request(coord, "a", [*shared, *range(9000, 9000 + span // 2)])
    assert schedule(coord, first) == [list(range(1, 4))]  # 2.5 spans: three blocks
    second = make_request(coord, "b", [*shared, 7, 8, 9])
    computed, hit = coord.get_computed_blocks(second)
    assert hit == 2 * span
    assert [b.block_id for b in computed.blocks[0]] == [1, 2]
    coord.check_invariants()


def test_hybrid_groups_of_one_block_size_with_dcp() -> None:
    latent = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=8, dtype=torch.float16)
    coord = _coordinator([full_spec(block_size=64), latent], 2)
    # Hashes at the spec's block (as vLLM), regrouped to the 128-token blocks that span the two ranks.
    assert (coord.scheduler_block_size, coord.hash_block_size) == (128, 64)
    shared = list(range(1, 513))
    schedule(coord, make_request(coord, "a", [*shared, 1, 2, 3]))
    computed, hit = coord.get_computed_blocks(make_request(coord, "b", [*shared, 4, 5]))
    assert hit == 512
    assert [len(g) for g in computed.blocks] == [4, 4]
    coord.check_invariants()
