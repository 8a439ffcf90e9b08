"""Jamba: full attention every ``attn_layer_period``-th layer from ``attn_layer_offset``, a Mamba1 state in
the others."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec.models import state_shapes
from kvspec.models.config_reader import FULL, STATE, ConfigReader, LayerCaches
from kvspec.models.family import ATTENTION_KEYS, FAMILIES, ModelFamily
from kvspec.models.state_shapes import StateLayout


@dataclass(frozen=True, kw_only=True, slots=True)
class Jamba(ModelFamily):
    def layer_caches(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        period = config.positive_int("attn_layer_period")
        config.require("attn_layer_offset")
        offset = config.positive_int("attn_layer_offset", minimum=0)
        return [FULL if i % period == offset else STATE for i in range(num_layers)]

    def state_layout(self, config: ConfigReader, tp: int, model_dtype: torch.dtype) -> StateLayout:
        return state_shapes.mamba1_state(
            tp=tp,
            intermediate_size=config.positive_int("mamba_expand", 2) * config.positive_int("hidden_size"),
            state_size=config.positive_int("mamba_d_state", 16),
            conv_kernel=config.positive_int("mamba_d_conv", 4),
            dtypes=(model_dtype, model_dtype),
        )


JAMBA = Jamba(
    key="jamba",
    name="Jamba (Mamba1 hybrid)",
    model_types=("jamba",),
    caches="full attention every attn_layer_period-th layer, a Mamba1 state in the others",
    keys=(
        *ATTENTION_KEYS,
        "attn_layer_period",
        "attn_layer_offset",
        "mamba_expand",
        "mamba_d_state",
        "mamba_d_conv",
    ),
)
FAMILIES.register(JAMBA.key, JAMBA)
