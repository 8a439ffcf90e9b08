"""DeepSeek V2/V3 and Kimi K2: multi-head latent attention, one latent of ``kv_lora_rank +
qk_rope_head_dim`` per token, the same on every tensor-parallel rank."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.models.config_reader import ConfigReader
from kvspec.models.decoder import BuildSettings, FamilyLayers
from kvspec.models.family import FAMILIES, ModelFamily
from kvspec.specs.mla import FP8_DS_MLA, MLAAttentionSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class LatentAttention(ModelFamily):
    def build(self, config: ConfigReader, settings: BuildSettings) -> FamilyLayers:
        num_layers = config.positive_int("num_hidden_layers")
        latent = config.positive_int("kv_lora_rank") + config.positive_int("qk_rope_head_dim")
        spec = MLAAttentionSpec(
            block_size=settings.block_size,
            num_kv_heads=1,
            head_size=latent,
            dtype=settings.kv_dtype,
            kv_quant_mode=settings.quant,
            cache_dtype_str=FP8_DS_MLA if settings.kv_cache_dtype == FP8_DS_MLA else None,
        )
        return FamilyLayers(
            specs={f"model.layers.{i}": spec for i in range(num_layers)},
            max_len=config.max_positions(settings.max_model_len, self.default_max_positions),
            notes=(
                "MLA: one latent of kv_lora_rank + qk_rope_head_dim per token, replicated on every TP rank",
            ),
        )


MLA = LatentAttention(
    key="mla",
    name="DeepSeek V2/V3, Kimi K2 (MLA)",
    model_types=("deepseek_v2", "deepseek_v3", "kimi_k2"),
    caches="one latent per token (kv_lora_rank + qk_rope_head_dim), not split by TP",
    keys=("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "max_position_embeddings"),
    default_max_positions={"deepseek_v2": 2048, "deepseek_v3": 4096},
    latent_attention=True,
)
FAMILIES.register(MLA.key, MLA)
