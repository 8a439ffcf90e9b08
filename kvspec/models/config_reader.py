"""Reading a Hugging Face ``config.json``'s values the way every model family needs them: checked, bounded,
and every problem a ``ModelConfigError`` that names the model type and the key.

A family reads its config only through a :class:`ConfigReader`, so a new family writes no validation of its
own: ``positive_int("num_hidden_layers")``, ``layer_types("layer_types", n, known)``, ``dtype(...)``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kvspec.errors import ModelConfigError

#: The caches one layer can hold: full attention, a sliding window, chunked local attention, a state.
LayerKind = Literal["full", "sliding", "chunked", "state"]
#: What one layer holds: ("full",), ("state",), ("full", "state") (Falcon-H1) or () (an MLP-only layer).
LayerCaches = tuple[LayerKind, ...]

MODEL_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}

#: Upper bounds on config values that drive work: a typo must not make planning run for minutes.
MAX_CONFIG_VALUES = {
    "num_hidden_layers": 10_000,
    "decoder_layers": 10_000,
    "max_position_embeddings": 1 << 26,
    "max_target_positions": 1 << 26,
    "max_source_positions": 1 << 26,
}

#: Hugging Face layer-type names -> kvspec's layer kinds ("mlp", "moe" and unknown names stay as they are).
LAYER_TYPE_NAMES: Mapping[str, LayerKind] = {
    "full_attention": "full",
    "attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "mamba": "state",
    "linear_attention": "state",
    "conv": "state",
}
#: The attention layer types a plain decoder's ``layer_types`` may name.
ATTENTION_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention"})

#: The caches of a layer holding one cache of a kind, and of a hybrid layer (attention beside a state).
FULL: LayerCaches = ("full",)
SLIDING: LayerCaches = ("sliding",)
CHUNKED: LayerCaches = ("chunked",)
STATE: LayerCaches = ("state",)
FULL_AND_STATE: LayerCaches = ("full", "state")
_SINGLE: Mapping[str, LayerCaches] = {"full": FULL, "sliding": SLIDING, "chunked": CHUNKED, "state": STATE}


#: Older spellings of the keys every decoder reads, as Hugging Face's config classes map them
#: (``attribute_map``: GPT-2, GPT-J and Bloom's ``n_layer``, ``n_head``, ``n_embd``, ``n_positions``; ChatGLM's
#: ``num_layers`` and ``seq_length``): a config.json that spells them so is read as its class reads it.
STANDARD_NAMES: Mapping[str, tuple[str, ...]] = {
    "num_hidden_layers": ("n_layer", "num_layers"),
    "num_attention_heads": ("n_head",),
    "hidden_size": ("n_embd",),
    "max_position_embeddings": ("n_positions", "seq_length"),
}
#: Where a config gives its KV heads, in the order vLLM 0.34 looks (``CONFIG_FIELD_ALIASES``); none:
#: one KV head per attention head.
KV_HEAD_KEYS = (
    "n_head_kv",
    "num_kv_heads",
    "num_key_value_heads",
    "multi_query_group_num",
    "num_attention_groups",
)


def with_standard_names(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """``cfg`` with each :data:`STANDARD_NAMES` key it leaves unset taken from its older spelling."""
    missing: dict[str, Any] = {}
    for key, olds in STANDARD_NAMES.items():
        spelled = next((old for old in olds if cfg.get(old) is not None), None)
        if cfg.get(key) is None and spelled is not None:
            missing[key] = cfg[spelled]
    return {**cfg, **missing} if missing else cfg


def single_cache(kind: str) -> LayerCaches:
    """A layer holding one cache of ``kind`` (a name :meth:`ConfigReader.layer_types` returned)."""
    caches = _SINGLE.get(kind)
    if caches is None:
        raise ModelConfigError(f"layer type {kind!r} holds no cache kvspec knows; name its layers' caches.")
    return caches


@dataclass(frozen=True, slots=True)
class ConfigReader:
    """One config (for a multimodal wrapper, its text config) and the ``model_type`` its messages name."""

    cfg: Mapping[str, Any]
    model_type: str

    def get(self, key: str) -> Any:
        return self.cfg.get(key)

    def has(self, key: str) -> bool:
        """Whether the config sets ``key`` (a JSON null counts as unset, as in Hugging Face's classes)."""
        return self.cfg.get(key) is not None

    def require(self, key: str) -> Any:
        value = self.cfg.get(key)
        if value is None:
            raise ModelConfigError(
                f"{self.model_type} config is missing {key!r}, which kvspec needs to size its KV cache."
            )
        return value

    def positive_int(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        """``cfg[key]`` (``default`` when unset; required when there is none), an int >= ``minimum`` and
        within :data:`MAX_CONFIG_VALUES`."""
        value: object = self.cfg.get(key, default) if default is not None else self.require(key)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise ModelConfigError(f"{self.model_type} config key {key!r} must be {what}, got {value!r}.")
        limit = MAX_CONFIG_VALUES.get(key)
        if limit is not None and value > limit:
            raise ModelConfigError(
                f"{self.model_type} config key {key!r} is {value:,}; kvspec plans at most {limit:,} "
                "(is the config right?)."
            )
        return value

    def positive_number(self, key: str) -> float:
        """``cfg[key]``, a positive int or float (Falcon-H1's ``mamba_expand`` may be fractional)."""
        value = self.cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ModelConfigError(
                f"{self.model_type} config key {key!r} must be a positive number, got {value!r}."
            )
        return value

    def window(self, key: str) -> int:
        """A window or chunk size in tokens: a positive integer (``sliding_window``, ``attention_chunk_size``)."""
        value = self.cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelConfigError(
                f"{self.model_type} config key {key!r} must be a positive integer, got {value!r}."
            )
        return value

    def layer_types(self, key: str, num_layers: int, known: Collection[str]) -> list[str]:
        """``cfg[key]``, one layer-type name from ``known`` per layer, as kvspec's layer kinds
        (:data:`LAYER_TYPE_NAMES`; other known names, "mlp" say, as they are)."""
        layer_types = self.cfg.get(key)
        if not isinstance(layer_types, list):
            raise ModelConfigError(
                f"{self.model_type} config key {key!r} must be a list of layer types, got {layer_types!r}."
            )
        if len(layer_types) != num_layers:
            raise ModelConfigError(
                f"{self.model_type} config has {len(layer_types)} {key} for {num_layers} layers."
            )
        unknown = [t for t in layer_types if not isinstance(t, str) or t not in known]
        if unknown:
            raise ModelConfigError(
                f"{self.model_type} config has an unknown layer type {unknown[0]!r} in {key!r}; known: "
                f"{sorted(known)}."
            )
        return [LAYER_TYPE_NAMES.get(str(t)) or str(t) for t in layer_types]

    def dtype(self, key: str, default: str) -> torch.dtype:
        """``cfg[key]`` (``default`` when unset), a dtype name of :data:`MODEL_DTYPES`."""
        name = self.cfg.get(key) or default
        if not isinstance(name, str) or name.lower() not in MODEL_DTYPES:
            raise ModelConfigError(
                f"{self.model_type} config key {key!r} must be one of {sorted(MODEL_DTYPES)}, got {name!r}."
            )
        return MODEL_DTYPES[name.lower()]

    def max_positions(self, max_model_len: int | None, defaults: Mapping[str, int]) -> int:
        """The model's context length: the config's ``max_position_embeddings``, else its Hugging Face
        class's default (``defaults``, by model type); with neither, the user must say (``max_model_len``)."""
        if not self.has("max_position_embeddings") and self.model_type not in defaults:
            if max_model_len is not None:
                return max_model_len
            raise ModelConfigError(
                f"{self.model_type} config has no 'max_position_embeddings' and kvspec knows no default for "
                "it; pass --max-model-len (max_model_len=) with the model's context length."
            )
        return self.positive_int("max_position_embeddings", defaults.get(self.model_type))


__all__ = [
    "ATTENTION_TYPES",
    "KV_HEAD_KEYS",
    "LAYER_TYPE_NAMES",
    "MAX_CONFIG_VALUES",
    "MODEL_DTYPES",
    "STANDARD_NAMES",
    "ConfigReader",
    "LayerCaches",
    "LayerKind",
    "single_cache",
    "with_standard_names",
]
