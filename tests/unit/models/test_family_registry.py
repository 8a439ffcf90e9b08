"""Model families as objects that carry their rules (issue 50): one registry of families, a family added in
one module (LFM2, short convolution), a plugin's family planned through the same path, and no code outside
a family testing which family it is."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import kvspec.models
from kvspec import FullAttentionSpec, MambaSpec
from kvspec.errors import ModelConfigError, ModelFamilyError, UnknownModelFamilyError
from kvspec.models import FAMILIES, ConfigReader, ModelFamily, build_model_layout, layout_from_config
from kvspec.models.config_reader import FULL, SLIDING, LayerCaches
from kvspec.models.families.dense import DENSE
from kvspec.models.family import model_families, recognise_family

CONFIGS = Path(__file__).parents[2] / "fixtures" / "configs"
LFM2 = CONFIGS / "LiquidAI__LFM2-1.2B.json"
MODELS = Path(kvspec.models.__file__).parent


@pytest.fixture
def saved_families() -> Iterator[None]:
    saved = FAMILIES.snapshot()
    try:
        yield
    finally:
        FAMILIES.restore(saved)


def test_lfm2_conv_layers_hold_a_short_convolution_state() -> None:
    """LFM2-1.2B: 16 layers, attention at full_attn_idxs [2, 5, 8, 10, 12, 14] (8 KV heads of 2048 / 32 =
    64), a conv state of (conv_L_cache - 1, conv_dim) = (2, 2048) bf16 in the 10 others."""
    layout = build_model_layout(str(LFM2), block_size=64)
    assert layout.family == "LFM2 (short convolution hybrid)"
    specs = layout.layer_specs
    attention = [n for n, s in specs.items() if isinstance(s, FullAttentionSpec)]
    assert attention == [f"model.layers.{i}" for i in (2, 5, 8, 10, 12, 14)]
    states = {s for s in specs.values() if isinstance(s, MambaSpec)}
    assert len(states) == 1 and len(specs) == 16
    (state,) = states
    assert state.shapes == ((2, 2048),) and state.dtypes == (torch.bfloat16,)
    assert state.mamba_type == "short_conv" and state.num_prefill_checkpoint_blocks == 0
    assert state.unpadded_page_size_bytes == 2 * 2048 * 2 == 8192
    # 2 x 8 x 64 x 2 = 2,048 bytes a token: a 64-token page (131,072 bytes) already holds the state.
    full = specs["model.layers.2"]
    assert full.block_size == 64 and full.page_size_bytes == 64 * 2048
    assert state.page_size_bytes == 131_072
    # TP 2: half the KV heads and half the conv channels on each rank.
    tp2 = build_model_layout(str(LFM2), block_size=64, tensor_parallel_size=2).layer_specs
    assert tp2["model.layers.2"].page_size_bytes == 64 * 1024
    assert {s.shapes for s in tp2.values() if isinstance(s, MambaSpec)} == {((2, 1024),)}


def test_lfm2_layer_types_spelling_gives_the_same_layout() -> None:
    """Newer LFM2 configs (and transformers' class) write the pattern out as layer_types."""
    raw = json.loads(LFM2.read_text())
    attention = set(raw.pop("full_attn_idxs"))
    raw["layer_types"] = ["full_attention" if i in attention else "conv" for i in range(16)]
    assert layout_from_config(raw).layer_specs == build_model_layout(str(LFM2)).layer_specs


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"full_attn_idxs": [2, 16]}, "'full_attn_idxs' must list layer indices below 16"),
        ({"full_attn_idxs": None}, "missing 'full_attn_idxs'"),
        ({"conv_L_cache": 0}, "'conv_L_cache' must be a positive integer"),
        ({"layer_types": ["conv"] * 15 + ["mamba"]}, "unknown layer type 'mamba' in 'layer_types'"),
    ],
)
def test_bad_lfm2_configs_name_the_key(change: dict[str, object], message: str) -> None:
    raw = {**json.loads(LFM2.read_text()), **change}
    with pytest.raises(ModelConfigError, match=message):
        layout_from_config(raw)


def test_the_registry_lists_each_built_in_family_once_in_the_documented_order() -> None:
    keys = [f.key for f in model_families()][:14]
    assert keys == [
        "dense",
        "gemma",
        "gpt_oss",
        "llama4",
        "mla",
        "jamba",
        "nemotron_h",
        "granite_hybrid",
        "falcon_h1",
        "zamba2",
        "qwen3_next",
        "minimax",
        "lfm2",
        "whisper",
    ]
    assert FAMILIES.entry("lfm2").item.model_types == ("lfm2",)
    with pytest.raises(UnknownModelFamilyError, match="Unknown model family 'mamba3'; registered: dense,"):
        FAMILIES.entry("mamba3")


@dataclass(frozen=True, kw_only=True, slots=True)
class _EveryThirdFull(ModelFamily):
    """A plugin's family: full attention every third layer, a sliding window elsewhere."""

    def pattern(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        return [FULL if i % 3 == 2 else SLIDING for i in range(num_layers)]


def test_a_plugin_family_is_planned_through_the_same_path(saved_families: None) -> None:
    family = _EveryThirdFull(key="acme.thirds", name="Acme thirds", model_types=("acme_thirds",), caches="x")
    FAMILIES.register("acme.thirds", family)
    raw = {
        "model_type": "acme_thirds",
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "sliding_window": 512,
        "max_position_embeddings": 4096,
    }
    layout = layout_from_config(raw)
    assert layout.family == "Acme thirds" and not layout.assumed_dense
    kinds = [type(s).__name__ for s in layout.layer_specs.values()]
    assert kinds == ["SlidingWindowSpec", "SlidingWindowSpec", "FullAttentionSpec"] * 2
    assert recognise_family("acme_thirds", "acme_thirds") is family


def test_registration_refusals_change_nothing(saved_families: None) -> None:
    before = FAMILIES.snapshot()
    thief = _EveryThirdFull(key="acme.thief", name="thief", model_types=("llama", "acme"), caches="x")
    with pytest.raises(ModelFamilyError, match="model_type 'llama' is already the 'dense' family's"):
        FAMILIES.register("acme.thief", thief)
    with pytest.raises(ModelFamilyError, match=r"its key is 'acme\.thief'; register it under that"):
        FAMILIES.register("acme.other", thief)
    with pytest.raises(ModelFamilyError, match="must be dotted lower-case words"):
        FAMILIES.register("Acme", thief)
    with pytest.raises(ModelFamilyError, match=r"register a kvspec\.models\.ModelFamily"):
        FAMILIES.register("acme.thief", "not a family")  # type: ignore[arg-type]
    with pytest.raises(ModelFamilyError, match="'dense' is already registered; pass replace=True"):
        FAMILIES.register("dense", _EveryThirdFull(key="dense", name="d", model_types=("zz",), caches="x"))
    assert FAMILIES.snapshot() == before
    # Replacing a built-in on purpose is allowed, and a snapshot puts it back.
    FAMILIES.register(
        "dense", _EveryThirdFull(key="dense", name="d", model_types=("zz",), caches="x"), replace=True
    )
    assert recognise_family("zz", "zz").name == "d"


def test_assume_dense_plans_an_unknown_type_as_the_dense_family() -> None:
    family = recognise_family("acme_new", "acme_new", assume_dense=True)
    assert family is DENSE
    with pytest.raises(ModelConfigError, match="does not know model_type 'acme_new'"):
        recognise_family("acme_new", "acme_new")


def _unknown(model_type: str, architecture: str) -> dict[str, object]:
    return {
        "model_type": model_type,
        "architectures": [architecture],
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 4096,
    }


@pytest.mark.parametrize(
    ("model_type", "architecture", "module", "caches"),
    [
        ("qwen3_5", "Qwen3_5ForCausalLM", "vllm.models.qwen3_5", "Gated DeltaNet state layers"),
        ("mamba", "MambaForCausalLM", "mamba", "Mamba1 state layers"),
        ("zaya", "ZayaForCausalLM", "zaya", "short-convolution state layers"),
        ("minicpm3", "MiniCPM3ForCausalLM", "minicpm3", r"a compressed latent \(MLA\) cache"),
    ],
)
def test_an_architecture_vllm_serves_with_state_or_latent_caches_is_never_planned_as_dense(
    model_type: str, architecture: str, module: str, caches: str
) -> None:
    """vLLM 0.34's table (kvspec.models.vllm_architectures) names what the architecture's code caches; a
    dense plan of such a model would be sized wrong, so --assume-dense does not override the refusal."""
    said = (
        rf"kvspec does not know model_type '{model_type}'\. vLLM 0\.34\.0 serves its architecture "
        rf"{architecture} \(model code '{module}'\) with {caches}"
    )
    with pytest.raises(
        ModelConfigError, match=said + r"[^.]*, which no kvspec family plans yet, so it is refused\.$"
    ):
        layout_from_config(_unknown(model_type, architecture))
    with pytest.raises(
        ModelConfigError, match=said + r".*refused even with --assume-dense: planned as a dense"
    ):
        layout_from_config(_unknown(model_type, architecture), assume_dense=True)


def test_an_attention_architecture_vllm_serves_is_named_and_planned_dense_on_request() -> None:
    raw = _unknown("phi3_next", "Phi3ForCausalLM")
    with pytest.raises(
        ModelConfigError,
        match=r"serves its architecture Phi3ForCausalLM \(model code 'phi3'\) as an attention decoder with no "
        r"state, latent or indexer cache \(its code reads per-layer sliding windows: the config's layer_types "
        r"say which\)\. Supported families: dense decoder: llama.*\. Pass --assume-dense",
    ):
        layout_from_config(raw)
    layout = layout_from_config(raw, assume_dense=True)
    assert layout.assumed_dense and len(layout.layer_specs) == 4
    # A config naming no architecture vLLM serves keeps the families' list.
    with pytest.raises(ModelConfigError, match="Supported families: dense decoder: llama"):
        layout_from_config(_unknown("acme_new", "AcmeForCausalLM"))


@pytest.mark.parametrize(
    ("raw", "layers", "kv_heads", "head_size"),
    [
        # GPT-2 small as its config.json spells it (GPT2Config's attribute_map): 12 layers, 12 heads of
        # 768 / 12 = 64, one KV head per head, 1,024 positions.
        (
            {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 12, "n_head": 12}
            | {"n_embd": 768, "n_positions": 1024},
            12,
            12,
            64,
        ),
        # Falcon-7B: multi-query attention without the new decoder architecture is one KV head (vLLM's
        # Falcon convertor); 4,544 / 71 = 64.
        (
            {"model_type": "falcon", "architectures": ["FalconForCausalLM"], "num_hidden_layers": 32}
            | {"num_attention_heads": 71, "hidden_size": 4544, "multi_query": True}
            | {"new_decoder_architecture": False, "max_position_embeddings": 2048},
            32,
            1,
            64,
        ),
        # Falcon-40B: the new decoder architecture reads num_kv_heads (8) whatever multi_query says.
        (
            {"model_type": "falcon", "architectures": ["FalconForCausalLM"], "num_hidden_layers": 60}
            | {"num_attention_heads": 128, "hidden_size": 8192, "multi_query": True, "num_kv_heads": 8}
            | {"new_decoder_architecture": True, "max_position_embeddings": 2048},
            60,
            8,
            64,
        ),
        # ChatGLM3-6B: num_layers, seq_length and multi_query_group_num (2 KV heads); 4,096 / 32 = 128.
        (
            {"model_type": "chatglm", "architectures": ["ChatGLMModel"], "num_layers": 28}
            | {"num_attention_heads": 32, "hidden_size": 4096, "multi_query_group_num": 2}
            | {"seq_length": 8192},
            28,
            2,
            128,
        ),
    ],
)
def test_assume_dense_reads_the_older_spellings_vllm_reads(
    raw: dict[str, object], layers: int, kv_heads: int, head_size: int
) -> None:
    """Each page is 2 (K and V) x 16 tokens x KV heads x head size x 2 bytes (float16)."""
    layout = layout_from_config(raw, assume_dense=True, dtype="float16", block_size=16)
    specs = list(layout.layer_specs.values())
    assert len(specs) == layers and layout.assumed_dense
    assert {(s.num_kv_heads, s.head_size) for s in specs} == {(kv_heads, head_size)}  # type: ignore[attr-defined]
    assert {s.page_size_bytes for s in specs} == {2 * 16 * kv_heads * head_size * 2}


def test_the_architecture_table_is_vllm_034s_registry() -> None:
    """126 text-generation architectures in vLLM 0.34.0's registry; what kvspec plans through a family
    shows the caches that family builds (a check that the table's markers read the code right)."""
    from kvspec.models.vllm_architectures import ARCHITECTURES, VLLM_RELEASE

    assert VLLM_RELEASE == "0.34.0" and len(ARCHITECTURES) == 126
    markers = {m for _, found in ARCHITECTURES.values() for m in found}
    assert markers <= {
        "mamba1",
        "mamba2",
        "short_conv",
        "gated_delta_net",
        "linear_attention",
        "kda",
        "mla",
        "sparse_indexer",
        "chunked_local",
        "sliding_window",
    }
    expected = {
        "JambaForCausalLM": "mamba1",
        "NemotronHForCausalLM": "mamba2",
        "GraniteMoeHybridForCausalLM": "mamba2",
        "FalconH1ForCausalLM": "mamba2",
        "Zamba2ForCausalLM": "mamba2",
        "Qwen3NextForCausalLM": "gated_delta_net",
        "Lfm2ForCausalLM": "short_conv",
        "DeepseekV3ForCausalLM": "mla",
        "Llama4ForCausalLM": "chunked_local",
    }
    for architecture, marker in expected.items():
        assert marker in ARCHITECTURES[architecture][1], architecture
    for plain in ("LlamaForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM", "GptOssForCausalLM"):
        assert not set(ARCHITECTURES[plain][1]) - {"sliding_window"}, plain


def _family_identity_tests(source: str) -> list[int]:
    """Lines comparing with ``is``/``is not`` against a family constant or a name ending in _FAMILY, or
    looking a family up in a table keyed by family (the forms models/hf_config.py used)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
            for side in (node.left, *node.comparators):
                name = side.attr if isinstance(side, ast.Attribute) else getattr(side, "id", "")
                if name.isupper() and name not in ("None",):
                    found.append(node.lineno)
    return found


def test_the_identity_scan_finds_the_old_form() -> None:
    assert _family_identity_tests("if family is families.NEMOTRON_H: pass\nx = f is not ZAMBA2\n") == [1, 2]
    assert _family_identity_tests("if family is None: pass\n") == []


def test_no_code_in_the_models_layer_tests_which_family_it_has() -> None:
    found = {
        str(path.relative_to(MODELS)): lines
        for path in sorted(MODELS.rglob("*.py"))
        if (lines := _family_identity_tests(path.read_text()))
    }
    assert found == {}


@pytest.mark.parametrize("name", ["ibm-granite__granite-4.0-h-small", "LiquidAI__LFM2-1.2B"])
def test_families_whose_attention_ignores_head_dim(name: str) -> None:
    """Granite 4.0-H's and LFM2's attention size heads as hidden_size / heads (vLLM's model classes), even
    when a config carries a head_dim; a dense decoder takes head_dim."""
    raw = json.loads((CONFIGS / f"{name}.json").read_text())
    with_head_dim = {**raw, "head_dim": 256}
    heads = {
        s.head_size
        for s in layout_from_config(with_head_dim).layer_specs.values()
        if isinstance(s, FullAttentionSpec)
    }
    assert heads == {raw["hidden_size"] // raw["num_attention_heads"]}
    dense = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": raw["hidden_size"],
        "num_attention_heads": raw["num_attention_heads"],
        "head_dim": 256,
        "max_position_embeddings": 4096,
    }
    dense_specs = layout_from_config(dense).layer_specs.values()
    assert {s.head_size for s in dense_specs if isinstance(s, FullAttentionSpec)} == {256}


@pytest.mark.parametrize(("heads", "kv_heads"), [(32, 5), (8, 16)])
def test_kv_heads_that_do_not_divide_the_attention_heads_are_refused(
    tmp_path: Path, heads: int, kv_heads: int
) -> None:
    """Issue 51: such configs were planned without a word."""
    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 4096,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(
        ModelConfigError,
        match=f"num_key_value_heads={kv_heads} does not divide its num_attention_heads={heads}",
    ):
        build_model_layout(str(path))
