"""Decode/prefill context parallelism: a group's block spans the CP ranks, and prefix hits are found in
blocks of that size (issue 18: DCP 2 with prefix caching failed at the first hit search).

vLLM 0.23 scales every group's block by DCP x PCP; 0.34 scales only the groups sharded over the DCP ranks
(attention unless ``dcp_sharded=False``), and by DCP alone (``ManagerRules.context_parallel_per_group``)."""

from __future__ import annotations

import pytest
import torch

from kvspec import (
    FullAttentionSpec,
    KVCacheCoordinator,
    MambaSpec,
    MLAAttentionSpec,
    SchedulerLimits,
    SlidingWindowSpec,
)
from kvspec.contracts.release import VLLM_0_23, VLLM_0_34, ReleaseProfile
from kvspec.errors import UnsupportedConfigurationError
from tests.helpers import full_spec, make_config, make_request, schedule


def _coordinator(
    specs: list[object],
    dcp: int,
    pcp: int = 1,
    num_blocks: int = 64,
    profile: ReleaseProfile = VLLM_0_23,
    mamba_cache_mode: str = "none",
) -> KVCacheCoordinator:
    return KVCacheCoordinator(
        make_config(specs, num_blocks),  # type: ignore[arg-type]
        SchedulerLimits(
            max_model_len=8192,
            max_num_batched_tokens=4096,
            decode_context_parallel_size=dcp,
            prefill_context_parallel_size=pcp,
            mamba_cache_mode=mamba_cache_mode,  # type: ignore[arg-type]
        ),
        profile=profile,
    )


@pytest.mark.parametrize("profile", [VLLM_0_23, VLLM_0_34], ids=lambda p: p.name)
@pytest.mark.parametrize(("dcp", "pcp"), [(2, 1), (1, 2), (2, 2)])
def test_prefix_hits_in_blocks_spanning_the_cp_ranks(dcp: int, pcp: int, profile: ReleaseProfile) -> None:
    coord = _coordinator([full_spec(block_size=128)], dcp, pcp, profile=profile)
    span = 128 * dcp * (1 if profile.managers.context_parallel_per_group else pcp)
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
    coord = _coordinator([full_spec(block_size=64), latent], 2, profile=VLLM_0_23)
    # Hashes at the spec's block (as vLLM), regrouped to the 128-token blocks that span the two ranks.
    assert (coord.scheduler_block_size, coord.hash_block_size) == (128, 64)
    shared = list(range(1, 513))
    schedule(coord, make_request(coord, "a", [*shared, 1, 2, 3]))
    computed, hit = coord.get_computed_blocks(make_request(coord, "b", [*shared, 4, 5]))
    assert hit == 512
    assert [len(g) for g in computed.blocks] == [4, 4]
    coord.check_invariants()


def test_hybrid_groups_of_one_block_size_with_dcp_hash_at_the_sharded_block_under_0_34() -> None:
    latent = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=8, dtype=torch.float16)
    coord = _coordinator([full_spec(block_size=64), latent], 2, profile=VLLM_0_34)
    # 0.34 takes the GCD of the scaled blocks (B utils:856-886): both span 128 tokens.
    assert (coord.scheduler_block_size, coord.hash_block_size) == (128, 128)
    assert coord.group_block_sizes == (128, 128)


def _replicated_draft(window: int | None) -> FullAttentionSpec | SlidingWindowSpec:
    if window is None:
        return FullAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32, dcp_sharded=False
        )
    return SlidingWindowSpec(
        block_size=16,
        num_kv_heads=1,
        head_size=1,
        dtype=torch.float32,
        dcp_sharded=False,
        sliding_window=window,
    )


@pytest.mark.parametrize("window", [None, 256])
def test_a_replicated_group_keeps_its_block_beside_dcp_under_0_34(window: int | None) -> None:
    """vLLM 0.34: a target sharded over DCP 4 spans 64 tokens a block, a replicated draft keeps 16 (its
    every rank holds all positions); both hit the same prefix."""
    coord = _coordinator([full_spec(block_size=16), _replicated_draft(window)], 4, profile=VLLM_0_34)
    assert coord.group_block_sizes == (64, 16)
    assert (coord.scheduler_block_size, coord.hash_block_size) == (64, 16)
    first = make_request(coord, "a", [1] * 65)
    new = schedule(coord, first)
    assert [len(g) for g in new] == [2, 5]
    second = make_request(coord, "b", [1] * 65)
    computed, hit = coord.get_computed_blocks(second)
    assert hit == 64
    assert [len(g) for g in computed.blocks] == [1, 4]
    assert computed.blocks[0][0].block_id == new[0][0]
    coord.check_invariants()


def test_a_replicated_group_beside_dcp_is_refused_under_0_23() -> None:
    """0.23 scales every group by DCP: a sliding-window draft's hit search refuses DCP, as vLLM asserts."""
    coord = _coordinator([full_spec(block_size=16), _replicated_draft(256)], 4, profile=VLLM_0_23)
    assert coord.group_block_sizes == (64, 64)
    with pytest.raises(UnsupportedConfigurationError, match="does not support context parallelism"):
        coord.get_computed_blocks(make_request(coord, "a", [1] * 65))


@pytest.mark.parametrize("draft_sharded", [True, False])
def test_mamba_keeps_its_block_beside_a_dcp_sharded_target_under_0_34(draft_sharded: bool) -> None:
    """vLLM 0.34's per-group DCP geometry (its test_prefix_cache_hit_uses_per_group_dcp_geometry): the
    target spans 16 x 8 tokens a block, a draft MLA spans that or its own 16, Mamba keeps 16; a hit at the
    end of the first chunk is found in every group."""
    draft = MLAAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32, dcp_sharded=draft_sharded
    )
    mamba = MambaSpec(block_size=16, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align")
    coord = _coordinator(
        [full_spec(block_size=16), draft, mamba], 8, profile=VLLM_0_34, mamba_cache_mode="align"
    )
    assert coord.group_block_sizes == (128, 128 if draft_sharded else 16, 16)
    shared = [i for i in range(2) for _ in range(128)]
    first = make_request(coord, "a", [*shared, *[99] * 7])
    computed, hit = coord.get_computed_blocks(first)
    assert hit == 0
    for n in (len(shared), 7):  # a Mamba state is kept where a chunk ends: end one on the shared prefix
        assert coord.allocate_slots(first, n, first.num_computed_tokens, computed) is not None
        first.num_computed_tokens += n
        computed = None  # type: ignore[assignment]
    computed, hit = coord.get_computed_blocks(make_request(coord, "b", [*shared, *[100] * 5]))
    assert hit == 256
    assert [len(g) for g in computed.blocks] == [2, 2 if draft_sharded else 16, 16]
    coord.check_invariants()
