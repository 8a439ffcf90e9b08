"""Zamba2: ``layers_block_type``: mamba a Mamba2 state, hybrid a Mamba2 state and full attention of its own
(the shared transformer block's KV is per layer); multi-head attention of ``attention_head_dim`` (vLLM
zamba2.py)."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.models.config_reader import FULL_AND_STATE, STATE, ConfigReader, LayerCaches
from kvspec.models.families._mamba2 import Mamba2Hybrid, Mamba2Keys
from kvspec.models.family import FAMILIES, check_tensor_parallel

_LAYER_TYPES = {"mamba", "linear_attention", "hybrid"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Zamba2(Mamba2Hybrid):
    def layer_caches(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        key = "layers_block_type" if config.has("layers_block_type") else "layer_types"
        kinds = config.layer_types(key, num_layers, _LAYER_TYPES)
        return [FULL_AND_STATE if k == "hybrid" else STATE for k in kinds]

    def attention_dims(self, config: ConfigReader, tp: int) -> tuple[int, int]:
        heads = config.positive_int("num_attention_heads")
        head_size = config.positive_int("attention_head_dim")
        return check_tensor_parallel(heads, heads, tp, config.model_type), head_size


ZAMBA2 = Zamba2(
    key="zamba2",
    name="Zamba2 (Mamba2 + shared attention)",
    model_types=("zamba2",),
    caches="layers_block_type: mamba a Mamba2 state, hybrid a Mamba2 state and full attention (own KV)",
    keys=(
        "num_hidden_layers",
        "num_attention_heads",
        "attention_head_dim",
        "hidden_size",
        "max_position_embeddings",
        "layers_block_type",
        "mamba_expand",
        "mamba_ngroups",
        "n_mamba_heads",
        "mamba_headdim",
        "mamba_d_state",
        "mamba_d_conv",
    ),
    mamba2_keys=Mamba2Keys(
        n_groups="mamba_ngroups",
        heads="n_mamba_heads",
        head_dim="mamba_headdim",
        state_size="mamba_d_state",
        conv_kernel="mamba_d_conv",
    ),
)
FAMILIES.register(ZAMBA2.key, ZAMBA2)
