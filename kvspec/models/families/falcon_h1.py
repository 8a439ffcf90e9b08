"""Falcon-H1: every layer holds both full attention and a Mamba2 state (parallel hybrid); ``d_inner`` is
``mamba_d_ssm`` when the config sets it."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.models.config_reader import FULL_AND_STATE, ConfigReader, LayerCaches
from kvspec.models.families._mamba2 import MAMBA_D_KEYS, Mamba2Hybrid
from kvspec.models.family import ATTENTION_KEYS, FAMILIES


@dataclass(frozen=True, kw_only=True, slots=True)
class FalconH1(Mamba2Hybrid):
    def layer_caches(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        return [FULL_AND_STATE] * num_layers

    def inner_size(self, config: ConfigReader, heads_size: int) -> int:
        if config.has("mamba_d_ssm"):
            return config.positive_int("mamba_d_ssm")
        return Mamba2Hybrid.inner_size(self, config, heads_size)


FALCON_H1 = FalconH1(
    key="falcon_h1",
    name="Falcon-H1 (parallel attention + Mamba2)",
    model_types=("falcon_h1",),
    caches="every layer both full attention and a Mamba2 state",
    keys=(*ATTENTION_KEYS, "mamba_d_ssm", "mamba_expand", *MAMBA_D_KEYS.names),
)
FAMILIES.register(FALCON_H1.key, FALCON_H1)
