"""Model presets and config.json parsing, checked against hand computations from published configs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from kvspec import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from kvspec.errors import ModelConfigError
from kvspec.models import build_model_layout, layout_from_config, load_model_config, preset_names

B = 64  # tokens per block when none is given: vLLM 0.34's DEFAULT_BLOCK_SIZE
BF16 = 2


def kinds(model: str, **kw: object) -> Counter[str]:
    return Counter(type(s).__name__ for s in build_model_layout(model, **kw).layer_specs.values())  # type: ignore[arg-type]


def token_bytes(model: str, **kw: object) -> int:
    """Bytes one token takes in every layer (page / block size, summed), before windows."""
    layout = build_model_layout(model, **kw)  # type: ignore[arg-type]
    return sum(s.page_size_bytes // s.block_size for s in layout.layer_specs.values())


def test_every_preset_is_covered() -> None:
    assert preset_names() == sorted(
        [
            "meta-llama/Llama-3.1-8B",
            "Qwen/Qwen3-8B",
            "mistralai/Mistral-7B-v0.1",
            "google/gemma-2-9b",
            "google/gemma-3-27b-it",
            "deepseek-ai/DeepSeek-V3",
            "meta-llama/Llama-4-Scout-17B-16E",
            "ai21labs/AI21-Jamba-1.5-Mini",
            "openai/whisper-large-v3",
        ]
    )


def test_llama_3_1_8b() -> None:
    # 32 layers, 8 KV heads of 128, bf16: K+V = 2*8*128*2 = 4096 bytes per token and layer
    spec = build_model_layout("meta-llama/Llama-3.1-8B").layer_specs["model.layers.0"]
    assert isinstance(spec, FullAttentionSpec)
    assert spec.page_size_bytes == B * 2 * 8 * 128 * BF16 == 262_144
    assert token_bytes("llama-3.1-8b") == 32 * 4096 == 131_072
    assert build_model_layout("llama-3.1-8b").max_model_len == 131_072


def test_qwen3_8b() -> None:
    assert kinds("Qwen/Qwen3-8B") == {"FullAttentionSpec": 36}
    assert token_bytes("Qwen/Qwen3-8B") == 36 * 2 * 8 * 128 * BF16 == 147_456


def test_mistral_sliding_window() -> None:
    layout = build_model_layout("mistralai/Mistral-7B-v0.1")
    spec = layout.layer_specs["model.layers.31"]
    assert isinstance(spec, SlidingWindowSpec) and spec.sliding_window == 4096
    assert spec.page_size_bytes == B * 2 * 8 * 128 * BF16 == 262_144
    assert token_bytes("mistral-7b") == 131_072


def test_gemma2_alternates() -> None:
    layout = build_model_layout("google/gemma-2-9b")
    specs = list(layout.layer_specs.values())
    expected: list[type] = [SlidingWindowSpec, FullAttentionSpec] * 2
    assert [type(s) for s in specs[:4]] == expected
    assert specs[0].page_size_bytes == B * 2 * 8 * 256 * BF16 == 524_288
    assert token_bytes("gemma-2-9b") == 42 * 2 * 8 * 256 * BF16 == 344_064


def test_gemma3_pattern() -> None:
    layout = build_model_layout("google/gemma-3-27b-it")
    specs = list(layout.layer_specs.values())
    full_layers = [i for i, s in enumerate(specs) if isinstance(s, FullAttentionSpec)]
    assert full_layers == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert all(s.sliding_window == 1024 for s in specs if isinstance(s, SlidingWindowSpec))
    assert token_bytes("gemma-3-27b") == 62 * 2 * 16 * 128 * BF16 == 507_904


def test_deepseek_v3_mla() -> None:
    spec = build_model_layout("deepseek-ai/DeepSeek-V3", tensor_parallel_size=8).layer_specs["model.layers.0"]
    assert isinstance(spec, MLAAttentionSpec)
    assert spec.head_size == 512 + 64 and spec.num_kv_heads == 1  # the latent is not split by TP
    assert spec.page_size_bytes == B * 576 * BF16 == 73_728
    assert token_bytes("deepseek-v3") == 61 * 576 * BF16 == 70_272
    fp8 = build_model_layout("deepseek-v3", kv_cache_dtype="fp8_ds_mla").layer_specs["model.layers.0"]
    assert fp8.page_size_bytes == B * 656


def test_llama4_chunked_local() -> None:
    layout = build_model_layout("meta-llama/Llama-4-Scout-17B-16E")
    specs = list(layout.layer_specs.values())
    assert [i for i, s in enumerate(specs) if isinstance(s, FullAttentionSpec)] == list(range(3, 48, 4))
    chunked = [s for s in specs if isinstance(s, ChunkedLocalAttentionSpec)]
    assert len(chunked) == 36 and chunked[0].attention_chunk_size == 8192
    assert token_bytes("llama-4-scout") == 48 * 2 * 8 * 128 * BF16 == 196_608


def test_jamba_mamba_hybrid() -> None:
    layout = build_model_layout("ai21labs/AI21-Jamba-1.5-Mini")
    specs = layout.layer_specs
    assert [i for i, s in enumerate(specs.values()) if isinstance(s, FullAttentionSpec)] == [4, 12, 20, 28]
    mamba = specs["model.layers.0"]
    assert isinstance(mamba, MambaSpec)
    d_inner = 2 * 4096
    state = (d_inner * 3 + d_inner * 16) * BF16
    assert mamba.unpadded_page_size_bytes == state == 311_296
    attn = specs["model.layers.4"]
    per_token = 2 * 8 * 128 * BF16
    # attention block grows, in steps of the 64-token block (vLLM 0.34), to hold one state:
    # 64 * ceil(311296 / (64 * 4096)) = 128 tokens
    assert attn.block_size == 128 and attn.page_size_bytes == 128 * per_token == 524_288
    assert mamba.page_size_bytes == attn.page_size_bytes
    assert mamba.block_size == layout.max_model_len  # one state per request without prefix caching
    assert any("raised from 64 to 128" in n for n in layout.notes)


def test_whisper_cross_attention() -> None:
    layout = build_model_layout("openai/whisper-large-v3")
    specs = layout.layer_specs
    assert kinds("whisper-large-v3") == {"FullAttentionSpec": 32, "CrossAttentionSpec": 32}
    cross = specs["model.decoder.layers.0.encoder_attn"]
    assert isinstance(cross, CrossAttentionSpec)
    assert cross.page_size_bytes == B * 2 * 20 * 64 * 2 == 327_680  # fp16
    assert layout.max_num_encoder_input_tokens == 1500 and layout.max_model_len == 448


def test_tensor_and_pipeline_parallel() -> None:
    tp = build_model_layout("llama-3.1-8b", tensor_parallel_size=4).layer_specs["model.layers.0"]
    assert tp.num_kv_heads == 2  # type: ignore[attr-defined]
    replicated = build_model_layout("llama-3.1-8b", tensor_parallel_size=16).layer_specs["model.layers.0"]
    assert replicated.num_kv_heads == 1  # type: ignore[attr-defined]
    pp = build_model_layout("llama-3.1-8b", pipeline_parallel_size=3)
    assert [len(s) for s in pp.stage_specs] == [10, 11, 11]
    assert len(pp.per_worker_specs(2)) == 6


def test_dtypes() -> None:
    fp8 = build_model_layout("llama-3.1-8b", kv_cache_dtype="fp8").layer_specs["model.layers.0"]
    assert fp8.page_size_bytes == B * 2 * 8 * 128 == 131_072 and fp8.dtype == torch.float8_e4m3fn  # type: ignore[attr-defined]
    fp32 = build_model_layout("llama-3.1-8b", dtype="fp32").layer_specs["model.layers.0"]
    assert fp32.page_size_bytes == B * 2 * 8 * 128 * 4 == 524_288
    with pytest.raises(ModelConfigError, match="Unknown dtype 'fp7'"):
        build_model_layout("llama-3.1-8b", dtype="fp7")
    with pytest.raises(ModelConfigError, match="MLA"):
        build_model_layout("llama-3.1-8b", kv_cache_dtype="fp8_ds_mla")


class TestBadConfigs:
    def test_unknown_model(self) -> None:
        with pytest.raises(ModelConfigError, match=r"Unknown model 'no-such-model'.*Presets: "):
            load_model_config("no-such-model")

    def test_malformed_json(self, tmp_path: Path) -> None:
        path = tmp_path / "config.json"
        path.write_text('{"model_type": "llama",')
        with pytest.raises(ModelConfigError, match="not valid JSON \\(line 1"):
            load_model_config(str(path))
        path.write_text("[1, 2]")
        with pytest.raises(ModelConfigError, match="must hold a JSON object"):
            load_model_config(str(tmp_path))

    def test_missing_key_is_named(self) -> None:
        with pytest.raises(ModelConfigError, match="llama config is missing 'num_hidden_layers'"):
            layout_from_config({"model_type": "llama", "num_attention_heads": 8})
        with pytest.raises(ModelConfigError, match="config key 'model_type' must be a non-empty string"):
            layout_from_config({"num_hidden_layers": 2})
        with pytest.raises(ModelConfigError, match="'kv_lora_rank'"):
            layout_from_config({"model_type": "deepseek_v3", "num_hidden_layers": 2})

    def test_bad_values(self) -> None:
        with pytest.raises(ModelConfigError, match="'num_key_value_heads' must be a positive integer"):
            layout_from_config(
                {
                    "model_type": "llama",
                    "num_hidden_layers": 2,
                    "num_attention_heads": 8,
                    "num_key_value_heads": 0,
                    "hidden_size": 64,
                }
            )
        with pytest.raises(ModelConfigError, match="exceeds the model's 2 KV cache layers"):
            layout_from_config(
                {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 64},
                pipeline_parallel_size=3,
            )

    def test_generic_config_file(self, tmp_path: Path) -> None:
        """An unknown model_type is refused, naming it and the families; --assume-dense plans it as a
        dense decoder (its layer_types still read) and says so."""
        cfg = {
            "model_type": "my_decoder",
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "hidden_size": 512,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "sliding_window": 256,
        }
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(
            ModelConfigError, match=r"does not know model_type 'my_decoder'.*nemotron_h.*--assume-dense"
        ):
            build_model_layout(str(tmp_path / "config.json"))
        with pytest.raises(ModelConfigError, match=r"no 'max_position_embeddings'.*--max-model-len"):
            build_model_layout(str(tmp_path / "config.json"), assume_dense=True)
        layout = build_model_layout(str(tmp_path / "config.json"), assume_dense=True, max_model_len=4096)
        assert [type(s).__name__ for s in layout.layer_specs.values()] == [
            "SlidingWindowSpec",
            "FullAttentionSpec",
        ] * 2
        assert layout.max_model_len == 4096
        assert layout.family == "dense decoder"
        assert any("not a known family" in n for n in layout.notes)
