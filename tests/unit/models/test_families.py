"""Model families planned from the real configs under tests/fixtures/configs (issue 34): which layers hold which
cache, and the page and state bytes by vLLM 0.34's rules, worked out by hand here (tests/vllm/
test_model_families_vs_vllm.py runs vLLM 0.34's own functions on the same configs)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from kvspec import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from kvspec.contracts.spec import KVCacheSpec
from kvspec.errors import ModelConfigError
from kvspec.models import build_model_layout, layout_from_config
from kvspec.models.family import model_families, supported_model_types
from kvspec.models.state_shapes import gated_delta_net_state

CONFIGS = Path(__file__).parents[2] / "fixtures" / "configs"
BF16 = 2
BF = torch.bfloat16
FP32 = 4


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data


def kinds(specs: dict[str, KVCacheSpec]) -> Counter[str]:
    return Counter(type(s).__name__ for s in specs.values())


def state(specs: dict[str, KVCacheSpec]) -> MambaSpec:
    states = {s for s in specs.values() if isinstance(s, MambaSpec)}
    assert len(states) == 1
    (only,) = states
    return only


def attention_block(specs: dict[str, KVCacheSpec]) -> int:
    blocks = {s.block_size for s in specs.values() if not isinstance(s, MambaSpec)}
    assert len(blocks) == 1
    return blocks.pop()


def test_nemotron_h_pattern_mamba2_and_float32_ssm_state() -> None:
    """hybrid_override_pattern: 27 M (Mamba2), 4 * (attention), 25 - (MLP: no cache). Mamba2 of 128 heads of
    80 and 8 groups of 128 states: conv (3, 128*80 + 2*8*128) bf16, SSM (128, 80, 128) float32 (vLLM's
    default for Nemotron-H)."""
    layout = build_model_layout(str(CONFIGS / "nvidia__NVIDIA-Nemotron-Nano-9B-v2.json"), block_size=64)
    assert layout.family == "Nemotron-H (Mamba2 hybrid)"
    assert kinds(layout.layer_specs) == {"MambaSpec": 27, "FullAttentionSpec": 4}
    mamba = state(layout.layer_specs)
    assert mamba.shapes == ((3, 12_288), (128, 80, 128))
    assert mamba.dtypes == (torch.bfloat16, torch.float32)
    assert mamba.unpadded_page_size_bytes == 3 * 12_288 * BF16 + 128 * 80 * 128 * FP32 == 5_316_608
    assert mamba.mamba_type == "mamba2" and mamba.num_prefill_checkpoint_blocks == 1
    # 40 heads, 8 KV heads of 128: 4,096 bytes per token; the block grows in steps of 64 to hold the state.
    assert attention_block(layout.layer_specs) == 64 * -(-5_316_608 // (64 * 4_096)) == 1_344
    assert mamba.page_size_bytes == 1_344 * 4_096
    assert any("25 of 56 layers hold no cache" in n for n in layout.notes)
    # The attention layers are the pattern's stars.
    pattern = config("nvidia__NVIDIA-Nemotron-Nano-9B-v2")["hybrid_override_pattern"]
    stars = [f"model.layers.{i}" for i, c in enumerate(pattern) if c == "*"]
    assert [n for n, s in layout.layer_specs.items() if isinstance(s, FullAttentionSpec)] == stars


def test_nemotron_h_layer_types_spelling_gives_the_same_layout() -> None:
    """transformers 5 writes the pattern out as layer_types (linear_attention, full_attention, mlp, moe)."""
    raw = config("nvidia__NVIDIA-Nemotron-Nano-9B-v2")
    names = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    spelled = {k: v for k, v in raw.items() if k != "hybrid_override_pattern"}
    spelled["layer_types"] = [names[c] for c in raw["hybrid_override_pattern"]]
    assert layout_from_config(spelled).layer_specs == layout_from_config(raw).layer_specs


def test_qwen3_next_gated_delta_net_from_full_attention_interval() -> None:
    """No layer_types in the published config: every 4th layer full attention, the others Gated DeltaNet.
    conv (3, 2*16*128 + 32*128) and recurrent (32, 128, 128), bf16: 1,097,728 bytes (1,072 KiB); the
    attention block (2 KV heads of 256: 2,048 bytes per token) grows to 544 in steps of 16 and 576 in 64."""
    path = str(CONFIGS / "Qwen__Qwen3-Next-80B-A3B-Instruct.json")
    layout = build_model_layout(path, block_size=16)
    assert layout.family == "Qwen3-Next (Gated DeltaNet hybrid)"
    specs = layout.layer_specs
    assert [i for i, s in enumerate(specs.values()) if isinstance(s, FullAttentionSpec)] == list(
        range(3, 48, 4)
    )
    gdn = state(specs)
    assert gdn.shapes == ((3, 8_192), (32, 128, 128)) and gdn.mamba_type == "gdn_attn"
    assert gdn.unpadded_page_size_bytes == 1_097_728 == 1_072 * 1024
    assert attention_block(specs) == 544
    assert attention_block(build_model_layout(path, block_size=64).layer_specs) == 576
    # vLLM 0.23 grew it in steps of 16 whatever the block size.
    assert (
        attention_block(build_model_layout(path, block_size=64, align_to_block_size=False).layer_specs) == 544
    )
    tp2 = state(build_model_layout(path, block_size=16, tensor_parallel_size=2).layer_specs)
    assert tp2.shapes == ((3, 4_096), (16, 128, 128))


def test_granite_4_h_attention_layer_type_and_head_size() -> None:
    """layer_types 'mamba' / 'attention' (refused before as an unknown layer type); its attention's head size
    is hidden_size / heads; Mamba2 with one group, replicated per rank under TP."""
    path = str(CONFIGS / "ibm-granite__granite-4.0-h-small.json")
    layout = build_model_layout(path)
    assert kinds(layout.layer_specs) == {"MambaSpec": 36, "FullAttentionSpec": 4}
    attn = next(s for s in layout.layer_specs.values() if isinstance(s, FullAttentionSpec))
    assert attn.head_size == 4096 // 32 and attn.num_kv_heads == 8
    assert state(layout.layer_specs).shapes == ((3, 8192 + 2 * 1 * 128), (128, 64, 128))
    # TP 4: the one group is replicated to 4 so each rank holds its heads' group.
    tp4 = state(build_model_layout(path, tensor_parallel_size=4).layer_specs)
    assert tp4.shapes == ((3, (8192 + 2 * 4 * 128) // 4), (32, 64, 128))


def test_falcon_h1_every_layer_holds_attention_and_a_state() -> None:
    layout = build_model_layout(str(CONFIGS / "tiiuae__Falcon-H1-1.5B-Instruct.json"))
    specs = layout.layer_specs
    assert kinds(specs) == {"FullAttentionSpec": 24, "MambaSpec": 24}
    assert isinstance(specs["model.layers.0.self_attn"], FullAttentionSpec)
    assert isinstance(specs["model.layers.0.mamba"], MambaSpec)
    # mamba_d_ssm 3072 (48 heads of 64), 1 group of 256 states.
    assert state(specs).shapes == ((3, 3072 + 2 * 256), (48, 64, 256))


def test_zamba2_hybrid_layers_hold_both() -> None:
    layout = build_model_layout(str(CONFIGS / "Zyphra__Zamba2-2.7B.json"))
    specs = layout.layer_specs
    assert kinds(specs) == {"MambaSpec": 54, "FullAttentionSpec": 9}
    attn = specs["model.layers.6.self_attn"]
    assert isinstance(attn, FullAttentionSpec) and attn.num_kv_heads == 32 and attn.head_size == 160
    assert state(specs).shapes == ((3, 5120 + 2 * 64), (80, 64, 64))


def test_minimax_lightning_attention_state() -> None:
    """attn_type_list: 0 lightning (one (heads, head_dim, head_dim) state), 1 softmax attention."""
    layout = build_model_layout(str(CONFIGS / "MiniMaxAI__MiniMax-Text-01.json"))
    assert kinds(layout.layer_specs) == {"MambaSpec": 70, "FullAttentionSpec": 10}
    lightning = state(layout.layer_specs)
    assert lightning.shapes == ((64, 128, 128),) and lightning.mamba_type == "linear"
    assert lightning.unpadded_page_size_bytes == 64 * 128 * 128 * BF16


def test_gpt_oss_alternates_windows_and_full_attention() -> None:
    layout = build_model_layout(str(CONFIGS / "openai__gpt-oss-20b.json"))
    specs = list(layout.layer_specs.values())
    assert layout.family == "gpt-oss (attention sinks)"
    assert isinstance(specs[0], SlidingWindowSpec) and isinstance(specs[1], FullAttentionSpec)
    assert all(s.sliding_window == 128 for s in specs if isinstance(s, SlidingWindowSpec))
    assert specs[1].page_size_bytes == 64 * 2 * 8 * 64 * BF16  # 64-token blocks: vLLM 0.34's default


def test_gemma3_without_max_position_embeddings_takes_131072() -> None:
    """Gemma 3's text_config leaves max_position_embeddings out: transformers and vLLM take 131,072."""
    layout = build_model_layout(str(CONFIGS / "google__gemma-3-27b-it.json"))
    assert layout.max_model_len == 131_072
    assert kinds(layout.layer_specs) == {"SlidingWindowSpec": 52, "FullAttentionSpec": 10}


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("meta-llama__Llama-3.1-8B", "dense decoder"),
        ("deepseek-ai__DeepSeek-V3", "DeepSeek V2/V3, Kimi K2 (MLA)"),
        ("ai21labs__AI21-Jamba-1.5-Mini", "Jamba (Mamba1 hybrid)"),
    ],
)
def test_the_existing_families_are_recognised(name: str, family: str) -> None:
    assert build_model_layout(str(CONFIGS / f"{name}.json")).family == family


def test_unknown_model_type_is_refused_with_the_families() -> None:
    raw = {**config("meta-llama__Llama-3.1-8B"), "model_type": "mamba2_next"}
    with pytest.raises(
        ModelConfigError, match=r"does not know model_type 'mamba2_next'.*qwen3_next.*--assume-dense"
    ):
        layout_from_config(raw)
    dense = layout_from_config(raw, assume_dense=True)
    assert dense.family == "dense decoder" and "--assume-dense" in dense.notes[0]


def test_every_family_lists_the_keys_it_reads() -> None:
    assert len(supported_model_types()) == sum(len(f.model_types) for f in model_families())
    assert all(f.keys and f.caches for f in model_families())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hybrid_override_pattern": "M*"}, "must be a string of 56 characters"),
        ({"hybrid_override_pattern": "X" * 56}, "from M .Mamba2."),
        ({"n_groups": 0}, "'n_groups' must be a positive integer"),
        ({"mamba_num_heads": None}, "missing 'mamba_num_heads'"),
    ],
)
def test_bad_hybrid_configs_name_the_key(change: dict[str, Any], message: str) -> None:
    raw = {**config("nvidia__NVIDIA-Nemotron-Nano-9B-v2"), **change}
    with pytest.raises(ModelConfigError, match=message):
        layout_from_config(raw)


def test_a_state_that_tp_cannot_split_is_refused() -> None:
    with pytest.raises(
        ModelConfigError, match=r"value heads \(32\) is not divisible by tensor_parallel_size=3"
    ):
        gated_delta_net_state(
            tp=3,
            num_k_heads=3,
            num_v_heads=32,
            head_k_dim=128,
            head_v_dim=129,
            conv_kernel=4,
            dtypes=(BF, BF),
        )


def test_max_model_len_over_the_models_context_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="larger than the model's context length 40,960"):
        build_model_layout("Qwen/Qwen3-8B", max_model_len=65_536)


def test_an_unreadable_config_is_a_model_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root, permission bits do not refuse a read; the failing read is simulated (before: a traceback)."""
    path = tmp_path / "config.json"
    path.write_text("{}")

    def refuse(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(ModelConfigError, match=r"cannot read .*config\.json: Permission denied"):
        build_model_layout(str(path))
