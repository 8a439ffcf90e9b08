"""Nemotron-H: ``hybrid_override_pattern`` (M a Mamba2 state, * attention, - and E no cache) or, as
transformers 5 writes it, ``layer_types``; its SSM state is float32 unless the config names a dtype (vLLM
0.34's NemotronHForCausalLMConfig); ``sliding_window`` makes its attention a window."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec.errors import ModelConfigError
from kvspec.models.config_reader import STATE, ConfigReader, LayerCaches, LayerKind
from kvspec.models.families._mamba2 import Mamba2Hybrid, Mamba2Keys
from kvspec.models.family import ATTENTION_KEYS, FAMILIES

_LAYER_TYPES = {"linear_attention", "mamba", "full_attention", "attention", "mlp", "moe"}


@dataclass(frozen=True, kw_only=True, slots=True)
class NemotronH(Mamba2Hybrid):
    def layer_caches(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        attention: LayerKind = "sliding" if config.has("sliding_window") else "full"
        if not config.has("hybrid_override_pattern") and config.has("layer_types"):
            caches: dict[str, LayerCaches] = {"state": STATE, "full": (attention,), "mlp": (), "moe": ()}
            return [caches[k] for k in config.layer_types("layer_types", num_layers, _LAYER_TYPES)]
        pattern = config.require("hybrid_override_pattern")
        if not isinstance(pattern, str) or len(pattern) != num_layers or set(pattern) - set("M*-E"):
            raise ModelConfigError(
                f"{config.model_type} config key 'hybrid_override_pattern' must be a string of {num_layers} "
                f"characters from M (Mamba2), * (attention), - (MLP), E (MoE), got {pattern!r}."
            )
        by_char: dict[str, LayerCaches] = {"M": STATE, "*": (attention,)}
        return [by_char.get(c, ()) for c in pattern]

    def inner_size(self, config: ConfigReader, heads_size: int) -> int:
        return heads_size  # heads x head_dim (vLLM nemotron_h.py)

    def ssm_dtype(self, config: ConfigReader, model_dtype: torch.dtype) -> torch.dtype:
        return config.dtype("mamba_ssm_cache_dtype", "float32")


NEMOTRON_H = NemotronH(
    key="nemotron_h",
    name="Nemotron-H (Mamba2 hybrid)",
    model_types=("nemotron_h",),
    caches="hybrid_override_pattern: M a Mamba2 state, * full attention, - and E (MLP, MoE) no cache",
    keys=(
        *ATTENTION_KEYS,
        "hybrid_override_pattern",
        "mamba_num_heads",
        "mamba_head_dim",
        "n_groups",
        "ssm_state_size",
        "conv_kernel",
        "mamba_ssm_cache_dtype",
        "sliding_window",
    ),
    mamba2_keys=Mamba2Keys(
        n_groups="n_groups",
        heads="mamba_num_heads",
        head_dim="mamba_head_dim",
        state_size="ssm_state_size",
        conv_kernel="conv_kernel",
    ),
)
FAMILIES.register(NEMOTRON_H.key, NEMOTRON_H)
