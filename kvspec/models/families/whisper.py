"""Whisper (encoder-decoder): decoder self-attention and cross attention over the encoder's output, two
caches per decoder layer; the encoder's self-attention is computed in one pass and not cached."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec.contracts.spec import KVCacheSpec
from kvspec.models.config_reader import ConfigReader
from kvspec.models.decoder import BuildSettings, FamilyLayers
from kvspec.models.family import FAMILIES, ModelFamily, check_tensor_parallel
from kvspec.specs.attention import CrossAttentionSpec, FullAttentionSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class EncoderDecoder(ModelFamily):
    def build(self, config: ConfigReader, settings: BuildSettings) -> FamilyLayers:
        layers = config.positive_int("decoder_layers")
        heads = config.positive_int("decoder_attention_heads")
        common: dict[str, Any] = dict(
            block_size=settings.block_size,
            num_kv_heads=check_tensor_parallel(heads, heads, settings.tp, config.model_type),
            head_size=config.positive_int("d_model") // heads,
            dtype=settings.kv_dtype,
            kv_quant_mode=settings.quant,
        )
        specs: dict[str, KVCacheSpec] = {}
        for i in range(layers):
            specs[f"model.decoder.layers.{i}.self_attn"] = FullAttentionSpec(**common)
            specs[f"model.decoder.layers.{i}.encoder_attn"] = CrossAttentionSpec(**common)
        return FamilyLayers(
            specs=specs,
            max_len=config.positive_int("max_target_positions", 448),
            encoder_tokens=config.positive_int("max_source_positions", 1500),
            notes=(
                "encoder self-attention is computed in one pass and not cached; run with prefix caching off",
            ),
        )


WHISPER = EncoderDecoder(
    key="whisper",
    name="Whisper (encoder-decoder)",
    model_types=("whisper",),
    caches="decoder self-attention and cross attention over the encoder's output",
    keys=(
        "decoder_layers",
        "decoder_attention_heads",
        "d_model",
        "max_target_positions",
        "max_source_positions",
    ),
)
FAMILIES.register(WHISPER.key, WHISPER)
