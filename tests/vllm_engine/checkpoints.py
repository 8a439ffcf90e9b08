"""Tiny random-weight Hugging Face checkpoints whose outputs depend on every cached token.

vLLM's ``load_format="dummy"`` fills weights with +-1e-3, and with such weights the next token barely depends
on the context: a prefix-cache bug that serves another prefix's KV would go unseen. These checkpoints draw
every weight from a seeded normal distribution large enough that attention is sharp (std 0.2 for the
Llama-style model, 0.05 for the Gemma-style ones, whose embeddings are scaled by sqrt(hidden)), with the
RMSNorm weights at unit scale (ones, or zeros where the model applies ``1 + w``), so that a wrong KV block
changes the greedy tokens. The same name and seed always give the same files.

Only ``transformers`` (to lay out and serialize the model's parameters under the names vLLM loads) and torch
are needed; the values are this module's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True, kw_only=True)
class TinyModel:
    """One tiny model: its Hugging Face config, the weights' scale, and how it should be run.

    ``norm_offset``: True when the model's RMSNorm multiplies by ``1 + w`` (Gemma), so unit scale is w = 0.
    ``window``: the sliding window in tokens (None: full attention only).
    """

    name: str
    description: str
    config: dict[str, Any]
    weight_std: float
    norm_offset: bool
    window: int | None = None
    layer_kinds: tuple[str, ...] = field(default=())


_COMMON: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

LLAMA = TinyModel(
    name="llama-tiny",
    description="Llama-style, full attention: 2 layers, 4 heads (2 KV heads) of 32, vocab 512",
    config={
        **_COMMON,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    },
    weight_std=0.2,
    norm_offset=False,
    layer_kinds=("full", "full"),
)

GEMMA3 = TinyModel(
    name="gemma3-tiny",
    description="Gemma-3-style hybrid: 6 layers, 5 sliding-window (64 tokens) : 1 full attention",
    config={
        **_COMMON,
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        "sliding_window": 64,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "query_pre_attn_scalar": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "tie_word_embeddings": True,
    },
    weight_std=0.05,
    norm_offset=True,
    window=64,
    layer_kinds=("sliding",) * 5 + ("full",),
)

NEMOTRON_H = TinyModel(
    name="nemotronh-tiny",
    description="Mamba-2 hybrid (Nemotron-H): Mamba-2, MLP, full attention, MLP, Mamba-2, MLP",
    config={
        **_COMMON,
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "layers_block_type": ["linear_attention", "mlp", "full_attention", "mlp", "linear_attention", "mlp"],
        "mamba_num_heads": 8,
        "mamba_head_dim": 32,
        "n_groups": 1,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 32,
        "use_conv_bias": True,
        "mamba_proj_bias": False,
        "mlp_hidden_act": "relu2",
        "layer_norm_epsilon": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "mamba_ssm_cache_dtype": "float32",
    },
    weight_std=0.2,
    norm_offset=False,
    layer_kinds=("mamba", "mlp", "full", "mlp", "mamba", "mlp"),
)

MODELS: dict[str, TinyModel] = {m.name: m for m in (LLAMA, GEMMA3, NEMOTRON_H)}


def _fill(model: torch.nn.Module, spec: TinyModel, seed: int) -> None:
    """Overwrite every parameter: norms at unit scale, everything else N(0, std^2), in name order."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if name.endswith("norm.weight"):
                param.fill_(0.0 if spec.norm_offset else 1.0)
            else:
                noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.copy_(noise * spec.weight_std)


def write_checkpoint(spec: TinyModel, directory: Path, *, seed: int = 0) -> Path:
    """Write ``spec``'s config and random weights (``model.safetensors``) to ``directory``; returns it.

    Deterministic: the same spec and seed give the same weights. An existing checkpoint written from the
    same spec and seed is reused (the marker file records both)."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / "kvspec-checkpoint.json"
    stamp = {"name": spec.name, "seed": seed, "config": spec.config, "std": spec.weight_std}
    if marker.exists() and json.loads(marker.read_text()) == stamp:
        return directory
    import transformers

    config = transformers.AutoConfig.for_model(**spec.config)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _fill(model, spec, seed)
    model.save_pretrained(directory, safe_serialization=True)
    marker.write_text(json.dumps(stamp))
    return directory
