"""``kvspec plan``'s numbers against vLLM 0.34.0's own planner (issue 19, item 6): for every preset, the
blocks and the KV cache groups (which layers share a group) are vLLM's, and a budget too small for one
request is refused by both, under vLLM 0.34's defaults (64-token blocks; Mamba "align" where prefix caching
runs Mamba; the layer-major tensor layout)."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("vllm.v1.core.kv_cache_planning", reason="vLLM 0.34's planner")

from benchmarks.vllm_scheduler_loop import vllm_034_planner
from kvspec import (
    CircularBufferSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
)
from kvspec.contracts.release import VLLM_0_34
from kvspec.contracts.spec import MambaCacheMode, SchedulerLimits
from kvspec.errors import InsufficientKVCacheMemoryError
from kvspec.integrations.vllm import to_vllm
from kvspec.models import build_model_layout
from kvspec.planning import bytes_per_block, get_kv_cache_configs, packed_kv_cache_groups
from kvspec.presets import preset_names

MAX_MODEL_LEN = 2048
BLOCK = 64  # vLLM 0.34's default block size (ReleaseProfile.default_block_size)


@pytest.mark.parametrize("memory", [1 << 30, 6 << 30])
@pytest.mark.parametrize("preset", preset_names())
def test_plan_matches_vllm_0_34(preset: str, memory: int) -> None:
    mode: MambaCacheMode = "align" if "Jamba" in preset else "none"
    # At most the model's own context (Whisper's decoder takes 448 tokens; a longer one is refused).
    max_len = min(MAX_MODEL_LEN, build_model_layout(preset).max_model_len)
    layout = build_model_layout(
        preset,
        block_size=BLOCK,
        dtype="bfloat16",
        kv_cache_dtype="auto",
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        max_model_len=max_len,
        mamba_cache_mode=mode,
    )
    limits = SchedulerLimits(
        max_model_len=max_len,
        max_num_batched_tokens=max_len,
        max_num_encoder_input_tokens=layout.max_num_encoder_input_tokens,
        mamba_cache_mode=mode,
    )
    (specs,) = layout.per_worker_specs(1)
    try:
        (ours,) = get_kv_cache_configs(
            [specs],
            [memory],
            limits,
            profile=VLLM_0_34,
        )
    except InsufficientKVCacheMemoryError:
        ours = None

    planning, config = vllm_034_planner(BLOCK, max_len, mode)
    vllm_specs = {name: to_vllm(spec) for name, spec in specs.items()}
    groups = planning.get_global_kv_cache_groups(config, [vllm_specs])
    if ours is None:  # too little memory for one request at max_model_len: vLLM refuses it too
        with pytest.raises(ValueError, match="KV cache is needed"):
            planning.get_kv_cache_configs(config, [vllm_specs], [memory], groups)
        return
    (theirs,) = planning.get_kv_cache_configs(config, [vllm_specs], [memory], groups)
    assert ours.num_blocks == theirs.num_blocks > 0
    assert [sorted(g.layer_names) for g in ours.kv_cache_groups] == [
        sorted(g.layer_names) for g in theirs.kv_cache_groups
    ]


def _random_packed_model(rng: random.Random) -> dict[str, KVCacheSpec]:
    """Layers of a model a block-outermost layout packs: MLA pages of a few sizes, sliding windows, rings
    and state layers, in random counts, patterns and orders."""
    dtypes = (torch.bfloat16, torch.float32, torch.uint8)
    palette: list[KVCacheSpec] = [
        MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=rng.choice(dtypes)),
        MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=132, dtype=torch.uint8),
        MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=132, dtype=torch.uint8, compress_ratio=4),
        SlidingWindowMLASpec(
            block_size=64,
            num_kv_heads=1,
            head_size=rng.choice((512, 1024)),
            dtype=torch.float32,
            sliding_window=128,
        ),
        CircularBufferSpec(block_size=4, num_kv_heads=2, head_size=128, head_size_v=0, dtype=torch.bfloat16),
        MambaSpec(shapes=((rng.randrange(1000, 90000),),), dtypes=(torch.float32,), block_size=64),
    ]
    kinds = rng.sample(palette, rng.randrange(2, len(palette) + 1))
    repeats = rng.randrange(1, 9)
    specs: dict[str, KVCacheSpec] = {}
    for i in range(repeats):
        for k, spec in enumerate(kinds):
            if rng.random() < 0.85:  # most patterns repeat whole; some layers skip a repeat
                specs[f"layers.{i}.{k}"] = spec
    for k, spec in enumerate(kinds):
        specs.setdefault(f"layers.0.{k}", spec)
    return specs


@pytest.mark.parametrize("seed", range(40))
def test_packed_groups_match_vllm_0_34(seed: int) -> None:
    """kvspec's packed groups (a block-outermost layout) are vLLM 0.34's, layer for layer and in order."""
    rng = random.Random(seed)
    planning, config = vllm_034_planner(BLOCK, MAX_MODEL_LEN, "none")
    config.cache_config.kv_cache_layout = "BLHNC"
    for _ in range(10):
        specs = _random_packed_model(rng)
        ours = packed_kv_cache_groups(specs)
        theirs = planning._get_packed_kv_cache_groups(config, {n: to_vllm(s) for n, s in specs.items()})
        if theirs is None:
            assert ours is None
            continue
        assert ours is not None
        assert [list(g.layer_names) for g in ours] == [g.layer_names for g in theirs]
        assert bytes_per_block(ours) == max(g.kv_cache_spec.page_size_bytes for g in theirs)
