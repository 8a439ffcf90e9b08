"""The model families kvspec plans from a Hugging Face ``config.json``, each recognised by its ``model_type``.

A family says which layers hold which cache and which config keys size it (the table in docs/MODELS.md is
made from :data:`FAMILIES`). A ``model_type`` of no family is refused (``ModelConfigError`` naming it and the
families), since planning an unknown hybrid as a dense decoder gives a silently wrong figure;
``assume_dense=True`` (``--assume-dense``) plans it as a dense decoder on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.errors import ModelConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelFamily:
    """One family: its ``model_type`` values, what its layers cache, and the config keys kvspec reads."""

    name: str
    model_types: tuple[str, ...]
    caches: str
    keys: tuple[str, ...]


_ATTENTION_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
)
_MAX_LEN = ("max_position_embeddings",)
#: Granite 4.0-H's and Falcon-H1's Mamba2 keys.
_MAMBA2_KEYS = (
    "mamba_expand",
    "mamba_n_groups",
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_d_state",
    "mamba_d_conv",
)

DENSE = ModelFamily(
    name="dense decoder",
    model_types=(
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "granite",
        "granitemoe",
        "olmo2",
        "minimax_m2",
    ),
    caches="full attention in every layer (Mistral: a sliding window; Qwen: max_window_layers)",
    keys=(*_ATTENTION_KEYS, *_MAX_LEN, "sliding_window", "use_sliding_window", "max_window_layers"),
)
GEMMA = ModelFamily(
    name="Gemma 2 / 3 (interleaved sliding window)",
    model_types=("gemma2", "gemma3", "gemma3_text"),
    caches="sliding window and full attention, interleaved",
    keys=(
        *_ATTENTION_KEYS,
        *_MAX_LEN,
        "sliding_window",
        "sliding_window_pattern",
        "layer_types",
        "text_config",
    ),
)
GPT_OSS = ModelFamily(
    name="gpt-oss (attention sinks)",
    model_types=("gpt_oss",),
    caches="sliding window and full attention alternating; the sinks are per-head logits, no cache",
    keys=(*_ATTENTION_KEYS, *_MAX_LEN, "sliding_window", "layer_types"),
)
LLAMA4 = ModelFamily(
    name="Llama 4 (chunked local attention)",
    model_types=("llama4", "llama4_text"),
    caches="chunked local attention, every no_rope_layer_interval-th layer full attention",
    keys=(*_ATTENTION_KEYS, *_MAX_LEN, "attention_chunk_size", "no_rope_layers", "no_rope_layer_interval"),
)
MLA = ModelFamily(
    name="DeepSeek V2/V3, Kimi K2 (MLA)",
    model_types=("deepseek_v2", "deepseek_v3", "kimi_k2"),
    caches="one latent per token (kv_lora_rank + qk_rope_head_dim), not split by TP",
    keys=("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", *_MAX_LEN),
)
JAMBA = ModelFamily(
    name="Jamba (Mamba1 hybrid)",
    model_types=("jamba",),
    caches="full attention every attn_layer_period-th layer, a Mamba1 state in the others",
    keys=(
        *_ATTENTION_KEYS,
        *_MAX_LEN,
        "attn_layer_period",
        "attn_layer_offset",
        "mamba_expand",
        "mamba_d_state",
        "mamba_d_conv",
    ),
)
NEMOTRON_H = ModelFamily(
    name="Nemotron-H (Mamba2 hybrid)",
    model_types=("nemotron_h",),
    caches="hybrid_override_pattern: M a Mamba2 state, * full attention, - and E (MLP, MoE) no cache",
    keys=(
        *_ATTENTION_KEYS,
        *_MAX_LEN,
        "hybrid_override_pattern",
        "mamba_num_heads",
        "mamba_head_dim",
        "n_groups",
        "ssm_state_size",
        "conv_kernel",
        "mamba_ssm_cache_dtype",
        "sliding_window",
    ),
)
GRANITE_HYBRID = ModelFamily(
    name="Granite 4.0-H (Mamba2 hybrid)",
    model_types=("granitemoehybrid",),
    caches="layer_types: mamba a Mamba2 state, attention full attention (head size hidden_size / heads)",
    keys=(
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "hidden_size",
        *_MAX_LEN,
        "layer_types",
        *_MAMBA2_KEYS,
    ),
)
FALCON_H1 = ModelFamily(
    name="Falcon-H1 (parallel attention + Mamba2)",
    model_types=("falcon_h1",),
    caches="every layer both full attention and a Mamba2 state",
    keys=(
        *_ATTENTION_KEYS,
        *_MAX_LEN,
        "mamba_d_ssm",
        *_MAMBA2_KEYS,
    ),
)
ZAMBA2 = ModelFamily(
    name="Zamba2 (Mamba2 + shared attention)",
    model_types=("zamba2",),
    caches="layers_block_type: mamba a Mamba2 state, hybrid a Mamba2 state and full attention (own KV)",
    keys=(
        "num_hidden_layers",
        "num_attention_heads",
        "attention_head_dim",
        "hidden_size",
        *_MAX_LEN,
        "layers_block_type",
        "mamba_expand",
        "mamba_ngroups",
        "n_mamba_heads",
        "mamba_headdim",
        "mamba_d_state",
        "mamba_d_conv",
    ),
)
QWEN3_NEXT = ModelFamily(
    name="Qwen3-Next (Gated DeltaNet hybrid)",
    model_types=("qwen3_next",),
    caches="layer_types (or every full_attention_interval-th layer) full attention, a Gated DeltaNet state "
    "in the others",
    keys=(
        *_ATTENTION_KEYS,
        *_MAX_LEN,
        "layer_types",
        "full_attention_interval",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    ),
)
MINIMAX = ModelFamily(
    name="MiniMax-Text-01 (lightning attention hybrid)",
    model_types=("minimax_text_01", "minimax"),
    caches="attn_type_list / layer_types: a lightning (linear) attention state, or full attention",
    keys=(*_ATTENTION_KEYS, *_MAX_LEN, "attn_type_list", "layer_types"),
)
WHISPER = ModelFamily(
    name="Whisper (encoder-decoder)",
    model_types=("whisper",),
    caches="decoder self-attention and cross attention over the encoder's output",
    keys=(
        "decoder_layers",
        "decoder_attention_heads",
        "d_model",
        "max_target_positions",
        "max_source_positions",
    ),
)

#: Every family, in the order docs/MODELS.md lists them.
FAMILIES: tuple[ModelFamily, ...] = (
    DENSE,
    GEMMA,
    GPT_OSS,
    LLAMA4,
    MLA,
    JAMBA,
    NEMOTRON_H,
    GRANITE_HYBRID,
    FALCON_H1,
    ZAMBA2,
    QWEN3_NEXT,
    MINIMAX,
    WHISPER,
)
_BY_TYPE = {t: family for family in FAMILIES for t in family.model_types}


def supported_model_types() -> list[str]:
    return sorted(_BY_TYPE)


def recognise_family(model_type: str, inner_type: str, *, assume_dense: bool = False) -> ModelFamily:
    """The family of a config whose ``model_type`` is ``model_type`` (``inner_type``: its text config's, the
    one that decides for multimodal wrappers such as Gemma 3's)."""
    family = _BY_TYPE.get(inner_type) or _BY_TYPE.get(model_type)
    if family is not None:
        return family
    if assume_dense:
        return DENSE
    names = "; ".join(f"{f.name}: {', '.join(f.model_types)}" for f in FAMILIES)
    raise ModelConfigError(
        f"kvspec does not know model_type {inner_type!r}"
        + (f" (in a {model_type!r} config)" if inner_type != model_type else "")
        + f", so it cannot tell which layers hold which cache. Supported families: {names}. "
        "If the model is a plain decoder (full attention in every layer), pass --assume-dense "
        "(assume_dense=True) to plan it as one."
    )
