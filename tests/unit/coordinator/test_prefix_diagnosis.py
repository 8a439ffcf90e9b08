"""The prefix-caching diagnosis (issue 52): each finding is true of what a coordinator does with the config
(a hybrid diagnosed "impossible" hits 0 tokens; one diagnosed coarse never hits below its hit block), and
each message names the groups, the cause and the setting."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvspec import (
    CrossAttentionSpec,
    KVCacheCoordinator,
    KVCacheSpec,
    MambaSpec,
    PrefixCachingFinding,
    SchedulerLimits,
    diagnose_prefix_caching,
)
from kvspec.contracts.release import VLLM_0_23, VLLM_0_34, ReleaseProfile
from kvspec.contracts.spec import MambaCacheMode
from kvspec.planning.config import KVCacheConfig
from tests.helpers import full_spec, make_config, make_request, schedule, sw_spec

LIMITS = SchedulerLimits(max_model_len=8192)


def _mamba(block_size: int, mode: MambaCacheMode) -> MambaSpec:
    return MambaSpec(block_size=block_size, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode=mode)


def _config(specs: list[KVCacheSpec], retention: int | None = None) -> KVCacheConfig:
    return dataclasses.replace(make_config(specs, 64), prefix_cache_retention_interval=retention)


def _codes(findings: tuple[PrefixCachingFinding, ...]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(f.code, f.severity, f.group_ids) for f in findings]


def _second_hit(
    specs: list[KVCacheSpec], shared: int, profile: ReleaseProfile, hash_block: int | None = None
) -> int:
    """Tokens the second of two requests sharing ``shared`` prompt tokens finds cached."""
    coord = KVCacheCoordinator(
        make_config(specs, 64), LIMITS, enable_caching=True, profile=profile, hash_block_size=hash_block
    )
    schedule(coord, make_request(coord, "a", [*range(1, shared + 1), *range(9000, 9016)]))
    coord.new_step_starts()
    _, hit = coord.get_computed_blocks(make_request(coord, "b", [*range(1, shared + 1), *range(7000, 7016)]))
    coord.check_invariants()
    return hit


def test_a_plain_model_has_no_finding() -> None:
    assert diagnose_prefix_caching(_config([full_spec()], retention=0), LIMITS) == ()
    assert diagnose_prefix_caching(_config([full_spec(), full_spec(32)]), LIMITS) != ()  # hybrid: see below


def test_mamba_in_cache_mode_none_makes_every_hit_zero_and_says_so() -> None:
    """vLLM 0.23 and 0.32 run a hybrid in mode "none" with caching on (hashes every 16 tokens, the state's
    block the context length): 0% hits, no word. The diagnosis says why; the same prompts in mode "all" hit."""
    specs: list[KVCacheSpec] = [full_spec(), _mamba(8192, "none")]
    (finding,) = diagnose_prefix_caching(_config(specs), LIMITS)
    assert _codes((finding,)) == [("state_not_cached", "impossible", (1,))]
    assert finding.message.startswith("Mamba cache mode 'none': group 1 keep one running state per request")
    assert "--mamba-cache-mode align" in finding.remedy
    assert finding.line() == f"impossible: {finding.message}; {finding.remedy}"
    assert _second_hit(specs, 64, VLLM_0_23, hash_block=16) == 0
    cached: list[KVCacheSpec] = [full_spec(), _mamba(16, "all")]
    assert diagnose_prefix_caching(_config(cached), LIMITS) == ()
    assert _second_hit(cached, 64, VLLM_0_23) == 64


def test_a_coarse_hit_block_is_named_and_no_shorter_prefix_hits() -> None:
    """Full attention in blocks of 16 beside a window in blocks of 32: hits end on multiples of 32."""
    specs: list[KVCacheSpec] = [full_spec(), sw_spec(128, block_size=32)]
    (finding,) = diagnose_prefix_caching(_config(specs), LIMITS)
    assert _codes((finding,)) == [("coarse_hit_block", "limited", (0,))]
    assert finding.message == (
        "hits end only on multiples of 32 tokens, the least common multiple of the groups' block sizes (16, 32): "
        "a shared prefix shorter than that never hits, and up to 31 tokens of any hit are computed again"
    )
    assert _second_hit(specs, 16, VLLM_0_34) == 0  # a whole attention block shared, no hit
    assert _second_hit(specs, 80, VLLM_0_34) == 64
    same: list[KVCacheSpec] = [full_spec(32), sw_spec(128, block_size=32)]
    assert diagnose_prefix_caching(_config(same), LIMITS) == ()
    assert _second_hit(same, 80, VLLM_0_34) == 64


@pytest.mark.parametrize(
    ("retention", "where"),
    [
        (0, "keep cached blocks only where a request's prompt ends (its replay boundary) and where it meets"),
        (256, "keep cached blocks one block every 256 tokens, besides replay boundaries and shared-prefix"),
    ],
)
def test_sparse_retention_names_the_window_and_state_groups(retention: int, where: str) -> None:
    specs: list[KVCacheSpec] = [full_spec(), sw_spec(128), _mamba(16, "align")]
    (finding,) = diagnose_prefix_caching(_config(specs, retention), LIMITS)
    assert _codes((finding,)) == [("sparse_retention", "limited", (1, 2))]
    assert finding.message.startswith(f"groups 1, 2 (sliding window 128, Mamba state) {where}")
    assert "--retention-interval" in finding.remedy
    # Dense retention (vLLM 0.23's), given or planned: every block is kept.
    assert diagnose_prefix_caching(_config(specs, retention), LIMITS, retention_interval=None) == ()
    assert diagnose_prefix_caching(_config(specs, None), LIMITS) == ()


def test_cross_attention_and_caching_off() -> None:
    cross = CrossAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    (finding,) = diagnose_prefix_caching(_config([full_spec(), cross]), LIMITS)
    assert _codes((finding,)) == [("group_never_cached", "impossible", (1,))]
    assert finding.message.startswith("group 1 (cross_attention) cannot be prefix-cached")
    (off,) = diagnose_prefix_caching(_config([full_spec()]), LIMITS, enable_caching=False)
    assert _codes((off,)) == [("caching_off", "impossible", (0,))]
