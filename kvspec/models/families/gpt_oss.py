"""gpt-oss: sliding window and full attention alternating (or ``layer_types``); its attention sinks are
per-head logits and hold no cache."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.models.config_reader import FULL, SLIDING, ConfigReader, LayerCaches
from kvspec.models.family import ATTENTION_KEYS, FAMILIES, ModelFamily


@dataclass(frozen=True, kw_only=True, slots=True)
class GptOss(ModelFamily):
    def pattern(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]


GPT_OSS = GptOss(
    key="gpt_oss",
    name="gpt-oss (attention sinks)",
    model_types=("gpt_oss",),
    caches="sliding window and full attention alternating; the sinks are per-head logits, no cache",
    keys=(*ATTENTION_KEYS, "sliding_window", "layer_types"),
)
FAMILIES.register(GPT_OSS.key, GPT_OSS)
