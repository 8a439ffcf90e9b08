"""LFM2 (Liquid AI): short-convolution blocks and grouped-query attention blocks. ``layer_types`` names each
layer (``conv`` or ``full_attention``; older configs list the attention layers in ``full_attn_idxs``); a conv
layer keeps one convolution state of (``conv_L_cache`` - 1, ``conv_dim``), ``conv_dim`` defaulting to
``hidden_size`` as transformers' class has it. Attention's head size is ``hidden_size / heads`` (vLLM 0.34
lfm2.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec.errors import ModelConfigError
from kvspec.models import state_shapes
from kvspec.models.config_reader import FULL, STATE, ConfigReader, LayerCaches, single_cache
from kvspec.models.family import ATTENTION_KEYS, FAMILIES, ModelFamily
from kvspec.models.state_shapes import StateLayout

_LAYER_TYPES = {"conv", "full_attention"}


@dataclass(frozen=True, kw_only=True, slots=True)
class ShortConvHybrid(ModelFamily):
    def layer_caches(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        if config.has("layer_types"):
            return [single_cache(k) for k in config.layer_types("layer_types", num_layers, _LAYER_TYPES)]
        attention = config.require("full_attn_idxs")
        if not isinstance(attention, list) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers for i in attention
        ):
            raise ModelConfigError(
                f"{config.model_type} config key 'full_attn_idxs' must list layer indices below {num_layers}, "
                f"got {attention!r}."
            )
        return [FULL if i in attention else STATE for i in range(num_layers)]

    def state_layout(self, config: ConfigReader, tp: int, model_dtype: torch.dtype) -> StateLayout:
        return state_shapes.short_conv_state(
            tp=tp,
            conv_dim=config.positive_int("conv_dim", config.positive_int("hidden_size")),
            conv_kernel=config.positive_int("conv_L_cache", 3),
            dtype=model_dtype,
        )


LFM2 = ShortConvHybrid(
    key="lfm2",
    head_size_from_hidden=True,
    name="LFM2 (short convolution hybrid)",
    model_types=("lfm2",),
    caches="layer_types (or full_attn_idxs): conv a short-convolution state, full_attention full attention",
    keys=(
        *ATTENTION_KEYS,
        "layer_types",
        "full_attn_idxs",
        "conv_dim",
        "conv_L_cache",
    ),
)
FAMILIES.register(LFM2.key, LFM2)
