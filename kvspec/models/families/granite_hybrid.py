"""Granite 4.0-H: ``layer_types`` (or ``layers_block_type``): mamba a Mamba2 state, attention full
attention whose head size is ``hidden_size / heads`` (it ignores ``head_dim``, vLLM granitemoehybrid.py)."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.models.config_reader import ConfigReader, LayerCaches, single_cache
from kvspec.models.families._mamba2 import MAMBA_D_KEYS, Mamba2Hybrid
from kvspec.models.family import ATTENTION_KEYS, FAMILIES

_LAYER_TYPES = {"mamba", "attention", "full_attention", "linear_attention"}


@dataclass(frozen=True, kw_only=True, slots=True)
class GraniteHybrid(Mamba2Hybrid):
    def layer_caches(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        key = "layer_types" if config.has("layer_types") else "layers_block_type"
        return [single_cache(k) for k in config.layer_types(key, num_layers, _LAYER_TYPES)]


GRANITE_HYBRID = GraniteHybrid(
    key="granite_hybrid",
    head_size_from_hidden=True,
    name="Granite 4.0-H (Mamba2 hybrid)",
    model_types=("granitemoehybrid",),
    caches="layer_types: mamba a Mamba2 state, attention full attention (head size hidden_size / heads)",
    keys=(
        *ATTENTION_KEYS,
        "layer_types",
        "mamba_expand",
        *MAMBA_D_KEYS.names,
    ),
)
FAMILIES.register(GRANITE_HYBRID.key, GRANITE_HYBRID)
