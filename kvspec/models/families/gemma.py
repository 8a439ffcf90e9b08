"""Gemma 2 and 3: sliding window and full attention interleaved (Gemma 2 alternates; Gemma 3 makes every
``sliding_window_pattern``-th layer full), or ``layer_types`` when the config lists them. Gemma 3's
multimodal config keeps its decoder under ``text_config``."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.models.config_reader import FULL, SLIDING, ConfigReader, LayerCaches
from kvspec.models.family import ATTENTION_KEYS, FAMILIES, ModelFamily


@dataclass(frozen=True, kw_only=True, slots=True)
class Gemma(ModelFamily):
    def pattern(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        if config.model_type == "gemma2":
            return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
        every = config.positive_int("sliding_window_pattern", 6)
        return [FULL if (i + 1) % every == 0 else SLIDING for i in range(num_layers)]


GEMMA = Gemma(
    key="gemma",
    name="Gemma 2 / 3 (interleaved sliding window)",
    model_types=("gemma2", "gemma3", "gemma3_text"),
    caches="sliding window and full attention, interleaved",
    keys=(*ATTENTION_KEYS, "sliding_window", "sliding_window_pattern", "layer_types", "text_config"),
    default_max_positions={"gemma2": 8192, "gemma3": 131_072, "gemma3_text": 131_072},
)
FAMILIES.register(GEMMA.key, GEMMA)
