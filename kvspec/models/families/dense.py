"""Dense decoders: full attention in every layer, or ``layer_types`` when the config lists them; Mistral's
(and Phi-3's) ``sliding_window`` makes every layer a sliding window, Qwen's ``use_sliding_window`` every layer
from ``max_window_layers`` on."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.models.config_reader import FULL, SLIDING, ConfigReader, LayerCaches
from kvspec.models.family import ATTENTION_KEYS, FAMILIES, ModelFamily

_SLIDING_EVERYWHERE = ("mistral", "phi3")
_QWEN_WINDOW = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")


@dataclass(frozen=True, kw_only=True, slots=True)
class DenseDecoder(ModelFamily):
    def pattern(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        if config.model_type in _SLIDING_EVERYWHERE and config.has("sliding_window"):
            return [SLIDING] * num_layers
        if config.model_type in _QWEN_WINDOW and config.get("use_sliding_window"):
            start = config.positive_int("max_window_layers", num_layers, minimum=0)
            return [SLIDING if i >= start else FULL for i in range(num_layers)]
        return [FULL] * num_layers


DENSE = DenseDecoder(
    key="dense",
    name="dense decoder",
    model_types=(
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "granite",
        "granitemoe",
        "olmo2",
        "minimax_m2",
    ),
    caches="full attention in every layer (Mistral: a sliding window; Qwen: max_window_layers)",
    keys=(*ATTENTION_KEYS, "sliding_window", "use_sliding_window", "max_window_layers"),
    default_max_positions={"llama": 2048},
)
FAMILIES.register(DENSE.key, DENSE)
