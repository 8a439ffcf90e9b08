"""MiniMax-Text-01: ``attn_type_list`` (0 lightning attention, 1 softmax attention) or ``layer_types``; a
lightning (linear) attention layer keeps one state of (heads, head_dim, head_dim)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec.errors import ModelConfigError
from kvspec.models import state_shapes
from kvspec.models.config_reader import FULL, STATE, ConfigReader, LayerCaches, single_cache
from kvspec.models.family import ATTENTION_KEYS, FAMILIES, ModelFamily
from kvspec.models.state_shapes import StateLayout

_LAYER_TYPES = {"full_attention", "linear_attention"}


@dataclass(frozen=True, kw_only=True, slots=True)
class LightningHybrid(ModelFamily):
    def layer_caches(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        if config.model_type != "minimax_text_01" and not config.has("attn_type_list"):
            return [single_cache(k) for k in config.layer_types("layer_types", num_layers, _LAYER_TYPES)]
        attn_types: object = config.require("attn_type_list")
        if (
            not isinstance(attn_types, list)
            or len(attn_types) != num_layers
            or any(t not in (0, 1) or isinstance(t, bool) for t in attn_types)
        ):
            raise ModelConfigError(
                f"{config.model_type} config key 'attn_type_list' must list 0 (lightning) or 1 (softmax "
                f"attention) for each of the {num_layers} layers, got {attn_types!r}."
            )
        return [FULL if t == 1 else STATE for t in attn_types]

    def state_layout(self, config: ConfigReader, tp: int, model_dtype: torch.dtype) -> StateLayout:
        heads = config.positive_int("num_attention_heads")
        head_dim = config.get("head_dim") or config.positive_int("hidden_size") // heads
        return state_shapes.linear_attention_state(
            tp=tp, num_heads=heads, head_dim=head_dim, dtype=model_dtype
        )


MINIMAX = LightningHybrid(
    key="minimax",
    name="MiniMax-Text-01 (lightning attention hybrid)",
    model_types=("minimax_text_01", "minimax"),
    caches="attn_type_list / layer_types: a lightning (linear) attention state, or full attention",
    keys=(*ATTENTION_KEYS, "attn_type_list", "layer_types"),
)
FAMILIES.register(MINIMAX.key, MINIMAX)
