"""One profile end to end (issue 35): the planner applies the profile's planning rules and writes its
retention into the config, the coordinator runs that retention, a mixed behaviour is a derived profile, and
a coordinator is built from one validated ``CoordinatorOptions``."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch
from typing_extensions import Unpack

from kvspec import KVCacheConfig, MambaSpec, Request, SchedulerLimits, SlidingWindowSpec
from kvspec.contracts.release import VLLM_0_23, VLLM_0_32, VLLM_0_34
from kvspec.contracts.spec import KVCacheSpec, MambaCacheMode
from kvspec.coordinator import PLANNED, CoordinatorOptions, CoordinatorSettings, KVCacheCoordinator
from kvspec.errors import KVSpecError, KVSpecTypeError, UnsupportedConfigurationError
from kvspec.planning import generate_scheduler_kv_cache_config, get_kv_cache_configs
from kvspec.specs.attention import FullAttentionSpec

F16 = torch.float16
LIMITS = SchedulerLimits(max_model_len=1024, max_num_batched_tokens=1024)


def _gemma_like() -> dict[str, KVCacheSpec]:
    """Full attention beside a 128-token sliding window, 64-token blocks (vLLM 0.34's default block)."""
    full = FullAttentionSpec(block_size=64, num_kv_heads=2, head_size=8, dtype=F16)
    window = SlidingWindowSpec(block_size=64, num_kv_heads=2, head_size=8, dtype=F16, sliding_window=128)
    return {"full.0": full, "swa.0": window, "swa.1": window}


def _readme_coordinator(**settings: Unpack[CoordinatorSettings]) -> KVCacheCoordinator:
    """kvspec built as README's "Using it in an engine" builds it: plan, then a coordinator of the plan
    (``profile``, when given, for both)."""
    (config,) = get_kv_cache_configs([_gemma_like()], [64 << 20], LIMITS, profile=settings.get("profile"))
    return KVCacheCoordinator(generate_scheduler_kv_cache_config([config]), LIMITS, **settings)


def _cached_window_blocks(coord: KVCacheCoordinator) -> int:
    """Blocks of the window groups published in the prefix cache after one 600-token request."""
    request = Request("r", list(range(600)), block_hasher=coord.make_block_hasher())
    assert coord.allocate_slots(request, 600, 0, None) is not None
    request.num_computed_tokens = 600
    coord.cache_blocks(request, 600)
    blocks = coord.get_blocks("r").blocks
    count = sum(
        1 for gid in range(1, len(blocks)) for b in blocks[gid] if not b.is_null and b.block_hash is not None
    )
    coord.free(request)
    coord.check_invariants()
    return count


def test_the_readme_path_runs_0_34_sparse_retention_by_default() -> None:
    coord = _readme_coordinator()
    assert coord.profile is VLLM_0_34
    assert coord.kv_cache_config.prefix_cache_retention_interval == 0
    assert coord.prefix_cache_retention_interval == 0
    # 600 tokens, 64-token blocks: 9 full blocks; sparse retention keeps only the tail a replay of the prompt
    # (599 tokens) needs (the two window blocks before it), dense keeps every block the window still holds.
    windows = sum(1 for s in coord.specs if isinstance(s, SlidingWindowSpec))
    sparse = _cached_window_blocks(coord)
    dense = _cached_window_blocks(_readme_coordinator(prefix_cache_retention_interval=None))
    assert windows == 2 and sparse == 2 * windows < dense


def test_the_0_23_profile_plans_and_runs_dense_retention() -> None:
    coord = _readme_coordinator(profile=VLLM_0_23)
    assert coord.profile is VLLM_0_23
    assert coord.kv_cache_config.prefix_cache_retention_interval is None
    assert coord.prefix_cache_retention_interval is None
    assert _cached_window_blocks(coord) == _cached_window_blocks(
        _readme_coordinator(prefix_cache_retention_interval=None)
    )


def test_an_explicit_retention_overrides_the_planned_one() -> None:
    assert _readme_coordinator(prefix_cache_retention_interval=128).prefix_cache_retention_interval == 128
    assert _readme_coordinator(prefix_cache_retention_interval=PLANNED).prefix_cache_retention_interval == 0
    options = CoordinatorOptions(prefix_cache_retention_interval=None)
    (config,) = get_kv_cache_configs([_gemma_like()], [64 << 20], LIMITS)
    assert KVCacheCoordinator(config, LIMITS, options).prefix_cache_retention_interval is None


def test_a_mixed_behaviour_is_a_derived_profile() -> None:
    """0.34 at run time but dense planning: one derived profile drives both the plan and the coordinator."""
    dense_034 = VLLM_0_34.derive(name="0.34-dense", prefix_cache_retention_interval=None)
    coord = _readme_coordinator(profile=dense_034)
    assert coord.profile is dense_034 and coord.prefix_cache_retention_interval is None
    assert coord.block_pool.free_unhashed_first  # 0.34's pool rule kept
    assert (
        dense_034.planning.reserve_null_block and dense_034.planning.prefix_cache_retention_interval is None
    )


def test_a_derived_rule_lands_in_its_section_and_nowhere_else() -> None:
    mixed = VLLM_0_34.derive(free_unhashed_first=False, pad_pages=False)
    assert not mixed.pool.free_unhashed_first and not mixed.planning.pad_pages
    assert mixed.pool.coarse_hash_is_last_fine and mixed.planning.reserve_null_block
    assert (mixed.hit_search, mixed.managers, mixed.mamba, mixed.events) == (
        VLLM_0_34.hit_search,
        VLLM_0_34.managers,
        VLLM_0_34.mamba,
        VLLM_0_34.events,
    )
    with pytest.raises(UnsupportedConfigurationError, match=r"no rule 'pads_pages'; its rules: .*pad_pages"):
        VLLM_0_34.derive(pads_pages=False)


def _mamba_config(mode: MambaCacheMode) -> tuple[KVCacheConfig, SchedulerLimits]:
    full = FullAttentionSpec(block_size=64, num_kv_heads=2, head_size=8, dtype=F16)
    state = MambaSpec(
        block_size=64 if mode == "align" else 1024,
        shapes=((16, 4),),
        dtypes=(torch.float32,),
        mamba_cache_mode=mode,
    )
    limits = dataclasses.replace(LIMITS, mamba_cache_mode=mode)
    (config,) = get_kv_cache_configs([{"attn": full, "ssm": state}], [64 << 20], limits)
    return config, limits


def test_mamba_none_with_caching_is_refused_under_0_34_only() -> None:
    config, limits = _mamba_config("none")
    with pytest.raises(
        UnsupportedConfigurationError, match=r"requires mamba_cache_mode='align' under vLLM 0\.34"
    ):
        KVCacheCoordinator(config, limits)
    KVCacheCoordinator(config, limits, enable_caching=False)
    VLLM_0_32.check_mamba_cache_mode("none", enable_caching=True)  # 0.32 runs it (states never cached)
    with pytest.raises(UnsupportedConfigurationError, match="mamba_cache_mode='align'"):
        VLLM_0_34.check_mamba_cache_mode("none", enable_caching=True)
    align_config, align_limits = _mamba_config("align")
    KVCacheCoordinator(align_config, align_limits)


def test_the_options_are_validated_once_and_passed_through() -> None:
    options = CoordinatorOptions(eviction_policy="lfu", hash_algorithm="sha256")
    coord = _readme_coordinator(eviction_policy="lfu")
    assert coord.options == options
    with pytest.raises(KVSpecTypeError, match=r"Unknown coordinator setting.*enable_cachin"):
        _readme_coordinator(enable_cachin=False)  # type: ignore[call-arg]
    with pytest.raises(KVSpecTypeError, match="hash_block_size"):
        CoordinatorOptions(hash_block_size="16")  # type: ignore[arg-type]
    with pytest.raises(UnsupportedConfigurationError, match="hash_block_size must be a positive int"):
        CoordinatorOptions(hash_block_size=0)
    with pytest.raises(UnsupportedConfigurationError, match="num_reprefillable_tokens must be >= 0"):
        CoordinatorOptions(num_reprefillable_tokens=-1)
    with pytest.raises(KVSpecError, match="Unsupported hash function"):
        CoordinatorOptions(hash_algorithm="md4")
    with pytest.raises(KVSpecTypeError, match="options must be a CoordinatorOptions"):
        (config,) = get_kv_cache_configs([_gemma_like()], [64 << 20], LIMITS)
        KVCacheCoordinator(config, LIMITS, {"enable_caching": False})  # type: ignore[arg-type]


def test_the_keyword_settings_are_the_options_fields() -> None:
    """``CoordinatorSettings`` (what mypy checks a caller's keywords against) and ``CoordinatorOptions``
    name the same settings."""
    fields = {f.name for f in dataclasses.fields(CoordinatorOptions)}
    assert set(typing.get_type_hints(CoordinatorSettings)) == fields


def test_a_config_planned_for_one_release_is_refused_by_a_coordinator_of_another() -> None:
    """Planned under 0.34 (null block held back, retention 0) and run under 0.23's pool and hit rules, the run
    would reproduce neither release: refused, naming both. A profile derived from the config's release on
    purpose runs it; a config built by hand (no release) runs under any."""
    (planned,) = get_kv_cache_configs([_gemma_like()], [64 << 20], LIMITS)
    assert planned.release == VLLM_0_34.name
    config = generate_scheduler_kv_cache_config([planned])
    assert config.release == VLLM_0_34.name
    with pytest.raises(
        UnsupportedConfigurationError,
        match=r"planned under the 'vllm-0\.34' release profile but the coordinator runs the 'vllm-0\.23' profile's rules",
    ):
        KVCacheCoordinator(config, LIMITS, profile=VLLM_0_23)
    with pytest.raises(
        UnsupportedConfigurationError,
        match=r"planned under the 'vllm-0\.34' release profile but the coordinator runs the 'vllm-0\.32' profile's rules",
    ):
        KVCacheCoordinator(config, LIMITS, profile=VLLM_0_32)
    mixed = VLLM_0_34.derive(free_unhashed_first=False)
    assert KVCacheCoordinator(config, LIMITS, profile=mixed).profile is mixed
    (planned_023,) = get_kv_cache_configs([_gemma_like()], [64 << 20], LIMITS, profile=VLLM_0_23)
    assert planned_023.release == VLLM_0_23.name
    with pytest.raises(
        UnsupportedConfigurationError,
        match=r"planned under the 'vllm-0\.23' release profile but the coordinator runs the 'vllm-0\.34' profile's rules",
    ):
        KVCacheCoordinator(generate_scheduler_kv_cache_config([planned_023]), LIMITS)
    by_hand = dataclasses.replace(config, release=None)
    assert KVCacheCoordinator(by_hand, LIMITS, profile=VLLM_0_23).profile is VLLM_0_23
