"""Llama 4: chunked local attention in the layers that use RoPE, full attention in the others
(``no_rope_layers``, else every ``no_rope_layer_interval``-th layer)."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.errors import ModelConfigError
from kvspec.models.config_reader import CHUNKED, FULL, ConfigReader, LayerCaches
from kvspec.models.family import ATTENTION_KEYS, FAMILIES, ModelFamily


@dataclass(frozen=True, kw_only=True, slots=True)
class Llama4(ModelFamily):
    def pattern(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        interval = config.positive_int("no_rope_layer_interval", 4)
        nope = config.get("no_rope_layers") or [
            0 if (i + 1) % interval == 0 else 1 for i in range(num_layers)
        ]
        if not isinstance(nope, list) or any(v not in (0, 1) or isinstance(v, float) for v in nope):
            raise ModelConfigError(
                f"llama4 config key 'no_rope_layers' must be a list of 0 and 1, got {nope!r}."
            )
        if len(nope) != num_layers:
            raise ModelConfigError(f"llama4 config has {len(nope)} no_rope_layers for {num_layers} layers.")
        chunked = config.has("attention_chunk_size")
        return [CHUNKED if (use_rope and chunked) else FULL for use_rope in nope]


LLAMA4 = Llama4(
    key="llama4",
    name="Llama 4 (chunked local attention)",
    model_types=("llama4", "llama4_text"),
    caches="chunked local attention, every no_rope_layer_interval-th layer full attention",
    keys=(*ATTENTION_KEYS, "attention_chunk_size", "no_rope_layers", "no_rope_layer_interval"),
)
FAMILIES.register(LLAMA4.key, LLAMA4)
