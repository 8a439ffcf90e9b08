"""Qwen3-Next: full attention in ``layer_types``' full_attention layers (or every
``full_attention_interval``-th layer), a Gated DeltaNet state in the others."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec.models import state_shapes
from kvspec.models.config_reader import FULL, STATE, ConfigReader, LayerCaches, single_cache
from kvspec.models.family import ATTENTION_KEYS, FAMILIES, ModelFamily
from kvspec.models.state_shapes import StateLayout

_LAYER_TYPES = {"full_attention", "linear_attention"}


@dataclass(frozen=True, kw_only=True, slots=True)
class GatedDeltaNetHybrid(ModelFamily):
    def layer_caches(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        if config.has("layer_types"):
            return [single_cache(k) for k in config.layer_types("layer_types", num_layers, _LAYER_TYPES)]
        interval = config.positive_int("full_attention_interval", 4)
        return [FULL if (i + 1) % interval == 0 else STATE for i in range(num_layers)]

    def state_layout(self, config: ConfigReader, tp: int, model_dtype: torch.dtype) -> StateLayout:
        return state_shapes.gated_delta_net_state(
            tp=tp,
            num_k_heads=config.positive_int("linear_num_key_heads"),
            num_v_heads=config.positive_int("linear_num_value_heads"),
            head_k_dim=config.positive_int("linear_key_head_dim"),
            head_v_dim=config.positive_int("linear_value_head_dim"),
            conv_kernel=config.positive_int("linear_conv_kernel_dim"),
            dtypes=(model_dtype, model_dtype),
        )


QWEN3_NEXT = GatedDeltaNetHybrid(
    key="qwen3_next",
    name="Qwen3-Next (Gated DeltaNet hybrid)",
    model_types=("qwen3_next",),
    caches="layer_types (or every full_attention_interval-th layer) full attention, a Gated DeltaNet state "
    "in the others",
    keys=(
        *ATTENTION_KEYS,
        "layer_types",
        "full_attention_interval",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    ),
    default_max_positions={"qwen3_next": 32_768},
)
FAMILIES.register(QWEN3_NEXT.key, QWEN3_NEXT)
