"""Model configs -> per-layer KV cache specs, from a Hugging Face ``config.json`` or an embedded preset.

Reads JSON only (no network, no transformers). Supported families: dense decoders (Llama, Mistral,
Qwen2/3 and anything shaped like them), Gemma 2 and 3 (interleaved sliding window), DeepSeek V2/V3 (MLA),
Llama 4 (chunked local attention), Jamba (Mamba hybrid), and Whisper (encoder-decoder, cross attention).
Tensor parallelism divides KV heads (at least one per rank, as engines replicate them); MLA latents are
not split. Pipeline parallelism splits layers into contiguous stages.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch

import kvspec.models.families as families
import kvspec.models.state_shapes as state_shapes
from kvspec.contracts.spec import KVCacheSpec, MambaCacheMode
from kvspec.errors import KVSpecError, ModelConfigError
from kvspec.intmath import cdiv
from kvspec.models.families import ModelFamily, recognise_family
from kvspec.models.layout_file import is_layout_file, layer_specs_from_layout
from kvspec.models.state_shapes import StateLayout
from kvspec.presets import DEFAULT_MODEL as DEFAULT_MODEL
from kvspec.presets import KV_CACHE_DTYPES as KV_CACHE_DTYPES
from kvspec.presets import _preset_files
from kvspec.presets import preset_names as preset_names
from kvspec.specs.attention import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    SlidingWindowSpec,
)
from kvspec.specs.dtypes import KVQuantMode, dtype_size, get_kv_quant_mode
from kvspec.specs.mamba import MambaSpec
from kvspec.specs.mla import FP8_DS_MLA, MLAAttentionSpec

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
P = ParamSpec("P")
R = TypeVar("R")

#: A config file larger than this is not a model config (the biggest real ones are a few KiB).
MAX_CONFIG_BYTES = 1 << 24
#: Upper bounds on config values that drive work: a typo must not make planning run for minutes.
MAX_CONFIG_VALUES = {
    "num_hidden_layers": 10_000,
    "decoder_layers": 10_000,
    "max_position_embeddings": 1 << 26,
    "max_target_positions": 1 << 26,
    "max_source_positions": 1 << 26,
}

#: Attention block sizes are kept a multiple of this when padded up to hold a Mamba state.
KERNEL_BLOCK_ALIGNMENT = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelLayout:
    """A model's KV cache layers, split into pipeline stages (one dict per stage, same for every TP rank)."""

    name: str
    model_type: str
    stage_specs: tuple[dict[str, KVCacheSpec], ...]
    max_model_len: int
    max_num_encoder_input_tokens: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    family: str = ""  # the model family kvspec recognised (kvspec.models.families), "" for a layout file
    assumed_dense: bool = False  # an unknown model_type planned as a dense decoder (assume_dense=True)

    @property
    def layer_specs(self) -> dict[str, KVCacheSpec]:
        return {name: spec for stage in self.stage_specs for name, spec in stage.items()}

    def per_worker_specs(self, tensor_parallel_size: int) -> list[dict[str, KVCacheSpec]]:
        """One dict per worker: every TP rank of a stage holds that stage's layers."""
        return [stage for stage in self.stage_specs for _ in range(tensor_parallel_size)]


def load_model_config(model: str) -> tuple[str, dict[str, Any]]:
    """(display name, config dict) for a preset name/alias or a path to a config.json."""
    presets = _preset_files()
    if model.lower() in presets:
        data = dict(presets[model.lower()])
        return str(data["_name"]), data
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ModelConfigError(
            f"Unknown model {model!r}: not a preset and not a config.json path. "
            f"Presets: {', '.join(preset_names())}."
        )
    if not path.is_file():
        # A FIFO would block forever on read, a folder named config.json cannot be read at all.
        raise ModelConfigError(
            f"{path} is not a regular file; point at a config.json file or a model folder."
        )
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ModelConfigError(
                f"{path} is {size:,} bytes; a model config is at most {MAX_CONFIG_BYTES:,} (is this the right file?)."
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelConfigError(f"cannot read {path}: {exc.strerror or exc}.") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{path} is not UTF-8 text (byte {exc.start}); is it a config.json?") from None
    except RecursionError:
        raise ModelConfigError(f"{path} nests JSON too deeply to be a model config.") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from exc
    if not isinstance(data, dict):
        raise ModelConfigError(
            f"{path} must hold a JSON object (a Hugging Face config), got {type(data).__name__}."
        )
    return str(path), data


def _require(cfg: Mapping[str, Any], key: str, model_type: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise ModelConfigError(
            f"{model_type} config is missing {key!r}, which kvspec needs to size its KV cache."
        )
    return value


def _positive_int(
    cfg: Mapping[str, Any], key: str, model_type: str, default: int | None = None, *, minimum: int = 1
) -> int:
    value: object = cfg.get(key, default) if default is not None else _require(cfg, key, model_type)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ModelConfigError(f"{model_type} config key {key!r} must be {what}, got {value!r}.")
    limit = MAX_CONFIG_VALUES.get(key)
    if limit is not None and value > limit:
        raise ModelConfigError(
            f"{model_type} config key {key!r} is {value:,}; kvspec plans at most {limit:,} (is the config right?)."
        )
    return value


def resolve_model_dtype(dtype: str | None, cfg: Mapping[str, Any]) -> torch.dtype:
    raw: object = dtype or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if not isinstance(raw, str):
        raise ModelConfigError(
            f"config key 'torch_dtype' must be a dtype name such as 'bfloat16', got {raw!r}."
        )
    name = raw.lower()
    if name not in MODEL_DTYPES:
        raise ModelConfigError(f"Unknown dtype {name!r}; choose one of {sorted(MODEL_DTYPES)}.")
    return MODEL_DTYPES[name]


def _kv_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> tuple[torch.dtype, KVQuantMode]:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ModelConfigError(
            f"Unknown kv cache dtype {kv_cache_dtype!r}; choose one of {list(KV_CACHE_DTYPES)}."
        )
    mode = get_kv_quant_mode(kv_cache_dtype)
    if kv_cache_dtype == "auto":
        return model_dtype, mode
    if kv_cache_dtype == "fp8_e5m2":
        return torch.float8_e5m2, mode
    if kv_cache_dtype == "int8_per_token_head":
        return torch.int8, mode
    if kv_cache_dtype in ("nvfp4", "fp8_ds_mla"):
        return torch.uint8, mode
    return torch.float8_e4m3fn, mode


def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    text = cfg.get("text_config")
    return text if isinstance(text, Mapping) else cfg


#: The ``max_position_embeddings`` a family's Hugging Face config class defaults to when a config.json leaves
#: it out (transformers' defaults, which vLLM reads): a missing key must not plan another context length.
DEFAULT_MAX_POSITIONS = {
    "deepseek_v2": 2048,
    "deepseek_v3": 4096,
    "gemma2": 8192,
    "gemma3": 131_072,
    "gemma3_text": 131_072,
    "llama": 2048,
    "qwen3_next": 32_768,
}

#: Hugging Face layer-type names -> kvspec's layer kinds: "full" | "sliding" | "chunked" | "state" | "none".
_LAYER_TYPE_NAMES = {
    "full_attention": "full",
    "attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "mamba": "state",
    "linear_attention": "state",
}


def _layer_types(
    cfg: Mapping[str, Any], key: str, model_type: str, num_layers: int, known: set[str]
) -> list[str]:
    """``cfg[key]``, a list of one layer-type name per layer, as kvspec's layer kinds."""
    layer_types = cfg.get(key)
    if not isinstance(layer_types, list):
        raise ModelConfigError(
            f"{model_type} config key {key!r} must be a list of layer types, got {layer_types!r}."
        )
    if len(layer_types) != num_layers:
        raise ModelConfigError(f"{model_type} config has {len(layer_types)} {key} for {num_layers} layers.")
    unknown = [t for t in layer_types if not isinstance(t, str) or t not in known]
    if unknown:
        raise ModelConfigError(
            f"{model_type} config has an unknown layer type {unknown[0]!r} in {key!r}; known: {sorted(known)}."
        )
    return [_LAYER_TYPE_NAMES.get(str(t)) or str(t) for t in layer_types]


def _layer_kinds(
    cfg: Mapping[str, Any], family: ModelFamily, model_type: str, num_layers: int
) -> list[tuple[str, ...]]:
    """The caches each layer holds, as kinds: ("full",), ("state",), ("full", "state") or () (no cache)."""
    attention_names = {"full_attention", "sliding_attention", "chunked_attention"}
    if family is families.NEMOTRON_H:
        attention = "sliding" if cfg.get("sliding_window") is not None else "full"
        if cfg.get("hybrid_override_pattern") is None and cfg.get("layer_types") is not None:
            # transformers 5 writes the pattern out as layer_types
            known = {"linear_attention", "mamba", "full_attention", "attention", "mlp", "moe"}
            caches: dict[str, tuple[str, ...]] = {
                "state": ("state",),
                "full": (attention,),
                "mlp": (),
                "moe": (),
            }
            return [caches[k] for k in _layer_types(cfg, "layer_types", model_type, num_layers, known)]
        pattern = _require(cfg, "hybrid_override_pattern", model_type)
        if not isinstance(pattern, str) or len(pattern) != num_layers or set(pattern) - set("M*-E"):
            raise ModelConfigError(
                f"{model_type} config key 'hybrid_override_pattern' must be a string of {num_layers} characters "
                f"from M (Mamba2), * (attention), - (MLP), E (MoE), got {pattern!r}."
            )
        return [{"M": ("state",), "*": (attention,)}.get(c, ()) for c in pattern]
    if family is families.GRANITE_HYBRID:
        key = "layer_types" if cfg.get("layer_types") is not None else "layers_block_type"
        kinds = _layer_types(
            cfg, key, model_type, num_layers, {"mamba", "attention", "full_attention", "linear_attention"}
        )
        return [(k,) for k in kinds]
    if family is families.FALCON_H1:
        return [("full", "state")] * num_layers
    if family is families.ZAMBA2:
        key = "layers_block_type" if cfg.get("layers_block_type") is not None else "layer_types"
        kinds = _layer_types(cfg, key, model_type, num_layers, {"mamba", "linear_attention", "hybrid"})
        return [("full", "state") if k == "hybrid" else ("state",) for k in kinds]
    if family is families.QWEN3_NEXT:
        if cfg.get("layer_types") is not None:
            kinds = _layer_types(
                cfg, "layer_types", model_type, num_layers, {"full_attention", "linear_attention"}
            )
            return [(k,) for k in kinds]
        interval = _positive_int(cfg, "full_attention_interval", model_type, 4)
        return [("full",) if (i + 1) % interval == 0 else ("state",) for i in range(num_layers)]
    if family is families.MINIMAX:
        if model_type == "minimax_text_01" or cfg.get("attn_type_list") is not None:
            attn_types: object = _require(cfg, "attn_type_list", model_type)
            if (
                not isinstance(attn_types, list)
                or len(attn_types) != num_layers
                or any(t not in (0, 1) or isinstance(t, bool) for t in attn_types)
            ):
                raise ModelConfigError(
                    f"{model_type} config key 'attn_type_list' must list 0 (lightning) or 1 (softmax attention) "
                    f"for each of the {num_layers} layers, got {attn_types!r}."
                )
            return [("full",) if t == 1 else ("state",) for t in attn_types]
        kinds = _layer_types(
            cfg, "layer_types", model_type, num_layers, {"full_attention", "linear_attention"}
        )
        return [(k,) for k in kinds]
    if family is families.JAMBA:
        period = _positive_int(cfg, "attn_layer_period", model_type)
        _require(cfg, "attn_layer_offset", model_type)
        offset = _positive_int(cfg, "attn_layer_offset", model_type, minimum=0)
        return [("full",) if i % period == offset else ("state",) for i in range(num_layers)]
    if cfg.get("layer_types") is not None:
        kinds = _layer_types(cfg, "layer_types", model_type, num_layers, attention_names)
        return [(k,) for k in kinds]
    if family is families.GEMMA and model_type == "gemma2":
        return [("sliding",) if i % 2 == 0 else ("full",) for i in range(num_layers)]
    if family is families.GEMMA:
        pattern = _positive_int(cfg, "sliding_window_pattern", model_type, 6)
        return [("full",) if (i + 1) % pattern == 0 else ("sliding",) for i in range(num_layers)]
    if family is families.LLAMA4:
        interval = _positive_int(cfg, "no_rope_layer_interval", model_type, 4)
        nope = cfg.get("no_rope_layers") or [0 if (i + 1) % interval == 0 else 1 for i in range(num_layers)]
        if not isinstance(nope, list) or any(v not in (0, 1) or isinstance(v, float) for v in nope):
            raise ModelConfigError(
                f"llama4 config key 'no_rope_layers' must be a list of 0 and 1, got {nope!r}."
            )
        if len(nope) != num_layers:
            raise ModelConfigError(f"llama4 config has {len(nope)} no_rope_layers for {num_layers} layers.")
        chunked = cfg.get("attention_chunk_size") is not None
        return [("chunked",) if (use_rope and chunked) else ("full",) for use_rope in nope]
    if family is families.GPT_OSS:
        return [("sliding",) if i % 2 == 0 else ("full",) for i in range(num_layers)]
    if model_type in ("mistral", "phi3") and cfg.get("sliding_window") is not None:
        return [("sliding",)] * num_layers
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and cfg.get("use_sliding_window"):
        start = _positive_int(cfg, "max_window_layers", model_type, num_layers, minimum=0)
        return [("sliding",) if i >= start else ("full",) for i in range(num_layers)]
    return [("full",)] * num_layers


def _split_stages(
    specs: dict[str, KVCacheSpec], pipeline_parallel_size: int
) -> tuple[dict[str, KVCacheSpec], ...]:
    names = list(specs)
    if pipeline_parallel_size > max(len(names), 1):
        raise ModelConfigError(
            f"pipeline_parallel_size={pipeline_parallel_size} exceeds the model's {len(names)} KV cache layers."
        )
    base, extra = divmod(len(names), pipeline_parallel_size)
    stages: list[dict[str, KVCacheSpec]] = []
    start = 0
    for stage in range(pipeline_parallel_size):
        # later stages take the remainder: the first stage also runs the embedding
        count = base + (1 if stage >= pipeline_parallel_size - extra else 0)
        stages.append({n: specs[n] for n in names[start : start + count]})
        start += count
    return tuple(stages)


def build_model_layout(
    model: str = DEFAULT_MODEL,
    *,
    block_size: int = 16,
    dtype: str | None = None,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    max_model_len: int | None = None,
    mamba_cache_mode: MambaCacheMode = "none",
    assume_dense: bool = False,
    align_to_block_size: bool = True,
) -> ModelLayout:
    """Per-layer specs of ``model`` (preset, config.json or kvspec layout file) as one TP rank of each PP
    stage sees them. A layout file (kvspec.models.layout_file) gives its layers' specs directly, as one TP rank
    holds them; ``block_size``, ``dtype`` and ``kv_cache_dtype`` do not apply to it.

    A config of a ``model_type`` no family covers (:mod:`kvspec.models.families`) is refused unless
    ``assume_dense``. ``align_to_block_size``: a hybrid's attention block grows in steps of the block size
    (vLLM 0.34) rather than of the kernel's 16 tokens (0.23)."""
    name, cfg = load_model_config(model)
    if is_layout_file(cfg):
        return _layout_file(cfg, name, pipeline_parallel_size, max_model_len)
    return layout_from_config(
        cfg,
        name=name,
        block_size=block_size,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        max_model_len=max_model_len,
        mamba_cache_mode=mamba_cache_mode,
        assume_dense=assume_dense,
        align_to_block_size=align_to_block_size,
    )


def _layout_file(
    cfg: Mapping[str, Any], path: str, pipeline_parallel_size: int, max_model_len: int | None
) -> ModelLayout:
    specs = layer_specs_from_layout(cfg, base_dir=Path(path).parent)
    max_len = max_model_len or _positive_int(cfg, "max_model_len", "kvspec layout")
    enc = cfg.get("max_num_encoder_input_tokens", 0)
    if isinstance(enc, bool) or not isinstance(enc, int) or enc < 0:
        raise ModelConfigError(
            f"kvspec layout max_num_encoder_input_tokens must be an int >= 0, got {enc!r}."
        )
    return ModelLayout(
        name=str(cfg.get("name") or path),
        model_type="kvspec_layout",
        stage_specs=_split_stages(specs, pipeline_parallel_size),
        max_model_len=max_len,
        max_num_encoder_input_tokens=enc,
        notes=(f"layout file with plugins {', '.join(cfg.get('plugins', [])) or 'none'}",),
    )


def _config_errors_are_model_config_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """A config value of a shape no check foresaw (a list where a number belongs, say) still ends as a
    ModelConfigError naming the config, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except KVSpecError:
            raise
        except (
            TypeError,
            ValueError,
            KeyError,
            AttributeError,
            IndexError,
            OverflowError,
            ZeroDivisionError,
        ) as exc:
            name = kwargs.get("name", "config")
            raise ModelConfigError(
                f"{name}: a config value has an unexpected type or size ({type(exc).__name__}: {exc}); "
                "check the config against the model family's Hugging Face config."
            ) from exc

    return wrapper


@_config_errors_are_model_config_errors
def layout_from_config(
    cfg: Mapping[str, Any],
    *,
    name: str = "config",
    block_size: int = 16,
    dtype: str | None = None,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    max_model_len: int | None = None,
    mamba_cache_mode: MambaCacheMode = "none",
    assume_dense: bool = False,
    align_to_block_size: bool = True,
) -> ModelLayout:
    """Per-layer specs from a config dict; see :func:`build_model_layout`.

    Every problem with the config is a ModelConfigError naming the key (or, for shapes no check
    foresaw, the config).
    """
    if tensor_parallel_size <= 0 or pipeline_parallel_size <= 0 or block_size <= 0:
        raise ModelConfigError(
            "block_size, tensor_parallel_size and pipeline_parallel_size must be positive."
        )
    raw_type = cfg.get("model_type")
    if not isinstance(raw_type, str) or not raw_type:
        raise ModelConfigError(
            f"config key 'model_type' must be a non-empty string (e.g. 'llama'), got {raw_type!r}; "
            "is this a Hugging Face config.json?"
        )
    model_type = raw_type
    text = _text_config(cfg)
    inner = text.get("model_type")
    inner_type = inner if isinstance(inner, str) else model_type
    family = recognise_family(model_type, inner_type, assume_dense=assume_dense)
    model_dtype = resolve_model_dtype(dtype, cfg)
    kv_dtype, quant = _kv_dtype(kv_cache_dtype, model_dtype)
    if kv_cache_dtype == "fp8_ds_mla" and family is not families.MLA:
        raise ModelConfigError("kv cache dtype 'fp8_ds_mla' applies to MLA (DeepSeek) models only.")
    tp = tensor_parallel_size
    enc = 0
    if family is families.WHISPER:
        specs, max_len, enc, notes = _whisper(cfg, block_size, kv_dtype, quant, tp)
    elif family is families.MLA:
        specs, max_len, notes = _deepseek(
            text, inner_type, block_size, kv_dtype, quant, kv_cache_dtype, max_model_len
        )
    else:
        specs, max_len, notes = _decoder(
            text,
            inner_type,
            family,
            block_size,
            kv_dtype,
            quant,
            model_dtype,
            tp,
            max_model_len,
            mamba_cache_mode,
            align_to_block_size,
        )
    if max_model_len is not None and max_model_len > max_len:
        raise ModelConfigError(
            f"max_model_len {max_model_len:,} is larger than the model's context length {max_len:,} (its "
            "config's max_position_embeddings); vLLM refuses it too. Pass at most that (--max-model-len)."
        )
    assumed = family is families.DENSE and not {model_type, inner_type} & set(families.DENSE.model_types)
    if assumed:
        notes.insert(
            0, f"model_type {inner_type!r} is not a known family: planned as a dense decoder (--assume-dense)"
        )
    return ModelLayout(
        name=name,
        model_type=model_type,
        stage_specs=_split_stages(specs, pipeline_parallel_size),
        max_model_len=max_model_len or max_len,
        max_num_encoder_input_tokens=enc,
        notes=tuple(notes),
        family=family.name,
        assumed_dense=assumed,
    )


def check_tensor_parallel(heads: int, kv_heads: int, tp: int, model_type: str) -> int:
    """KV heads per rank under the rule engines use: attention heads divide by TP, and KV heads divide by
    TP (split) or TP by KV heads (each rank holds one replicated KV head)."""
    if heads % tp:
        raise ModelConfigError(
            f"tensor_parallel_size={tp} does not divide the {model_type} model's {heads} attention heads; "
            f"use a divisor of {heads}."
        )
    if kv_heads % tp and tp % kv_heads:
        raise ModelConfigError(
            f"tensor_parallel_size={tp} must divide the {kv_heads} KV heads (or be a multiple of them, so each "
            f"rank replicates one); use e.g. {', '.join(str(d) for d in range(1, kv_heads + 1) if kv_heads % d == 0)}."
        )
    return max(1, kv_heads // tp)


def _attention_dims(cfg: Mapping[str, Any], model_type: str, tp: int) -> tuple[int, int]:
    heads = _positive_int(cfg, "num_attention_heads", model_type)
    kv_heads = _positive_int(cfg, "num_key_value_heads", model_type, heads)
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        head_dim = _positive_int(cfg, "hidden_size", model_type) // heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ModelConfigError(
            f"{model_type} config key 'head_dim' must be a positive integer, got {head_dim!r}."
        )
    return check_tensor_parallel(heads, kv_heads, tp, model_type), head_dim


def _decoder(
    cfg: Mapping[str, Any],
    model_type: str,
    family: ModelFamily,
    block_size: int,
    kv_dtype: torch.dtype,
    quant: KVQuantMode,
    model_dtype: torch.dtype,
    tp: int,
    max_model_len: int | None,
    mamba_cache_mode: MambaCacheMode,
    align_to_block_size: bool,
) -> tuple[dict[str, KVCacheSpec], int, list[str]]:
    num_layers = _positive_int(cfg, "num_hidden_layers", model_type)
    max_len = _max_positions(cfg, model_type, max_model_len)
    kinds = _layer_kinds(cfg, family, model_type, num_layers)
    attention_layers = sum(1 for layer in kinds for k in layer if k != "state")
    kv_heads, head_dim = _family_attention_dims(cfg, family, model_type, tp) if attention_layers else (1, 1)
    notes: list[str] = []
    state_spec: MambaSpec | None = None
    if any("state" in layer for layer in kinds):
        if not attention_layers:
            raise ModelConfigError(
                f"{model_type} config has no attention layer: a model of state layers only is not supported."
            )
        state = _state_layout(cfg, family, model_type, tp, model_dtype)
        checkpoints = 1 if state.kind == "mamba2" else 0  # vLLM's MambaMixer2 exports one per prompt
        state_spec = MambaSpec(
            block_size=block_size,
            shapes=state.shapes,
            dtypes=state.dtypes,
            mamba_type=_MAMBA_TYPES[state.kind],
            mamba_cache_mode=mamba_cache_mode,
            num_prefill_checkpoint_blocks=checkpoints,
            prefill_checkpoint_alignment=1 if checkpoints else None,
        )
        state_page = state_spec.unpadded_page_size_bytes
        attn_per_token = 2 * kv_heads * head_dim * dtype_size(kv_dtype)
        # vLLM 0.34 (Platform._align_hybrid_block_size): the attention page must hold a whole state, so the
        # attention block grows in steps of the larger of the kernel's block (16) and the block size the
        # user or the release set (0.23 grew it in steps of 16 alone); the state page is padded to match.
        step = max(KERNEL_BLOCK_ALIGNMENT, block_size) if align_to_block_size else KERNEL_BLOCK_ALIGNMENT
        needed = step * cdiv(state_page, step * attn_per_token)
        needed = KERNEL_BLOCK_ALIGNMENT * cdiv(needed, KERNEL_BLOCK_ALIGNMENT)
        if needed > block_size:
            notes.append(
                f"attention block size raised from {block_size} to {needed} tokens to hold a "
                f"{_STATE_NAMES[state.kind]} state of {state_page:,} bytes"
            )
            block_size = needed
        state_spec = dataclasses.replace(
            state_spec,
            block_size=block_size if mamba_cache_mode != "none" else (max_model_len or max_len),
            page_size_padded=max(block_size * attn_per_token, state_page),
        )
    window = cfg.get("sliding_window")
    chunk = cfg.get("attention_chunk_size")
    specs: dict[str, KVCacheSpec] = {}
    common: dict[str, Any] = dict(
        block_size=block_size, num_kv_heads=kv_heads, head_size=head_dim, dtype=kv_dtype, kv_quant_mode=quant
    )
    for i, layer_kinds in enumerate(kinds):
        for kind in layer_kinds:
            layer = f"model.layers.{i}" if len(layer_kinds) == 1 else f"model.layers.{i}.{_SUFFIX[kind]}"
            if kind == "state":
                assert state_spec is not None
                specs[layer] = state_spec
            elif kind == "sliding":
                specs[layer] = SlidingWindowSpec(
                    sliding_window=_window(window, model_type, "sliding_window"), **common
                )
            elif kind == "chunked":
                specs[layer] = ChunkedLocalAttentionSpec(
                    attention_chunk_size=_window(chunk, model_type, "attention_chunk_size"), **common
                )
            else:
                specs[layer] = FullAttentionSpec(**common)
    skipped = sum(1 for layer in kinds if not layer)
    if skipped:
        notes.append(f"{skipped} of {num_layers} layers hold no cache (MLP or MoE only)")
    return specs, max_len, notes


_SUFFIX = {"full": "self_attn", "sliding": "self_attn", "chunked": "self_attn", "state": "mamba"}
_STATE_NAMES = {
    "mamba1": "Mamba1",
    "mamba2": "Mamba2",
    "gated_delta_net": "Gated DeltaNet",
    "linear_attention": "lightning attention",
}
#: kvspec's state kinds -> MambaSpec.mamba_type (vLLM's MambaAttentionBackendEnum member, lower case).
_MAMBA_TYPES = {
    "mamba1": "mamba1",
    "mamba2": "mamba2",
    "gated_delta_net": "gdn_attn",
    "linear_attention": "linear",
}


def _max_positions(cfg: Mapping[str, Any], model_type: str, max_model_len: int | None) -> int:
    """The model's context length: its config's, else its Hugging Face class's default; with neither, the
    user must say (``max_model_len``)."""
    if cfg.get("max_position_embeddings") is None and model_type not in DEFAULT_MAX_POSITIONS:
        if max_model_len is not None:
            return max_model_len
        raise ModelConfigError(
            f"{model_type} config has no 'max_position_embeddings' and kvspec knows no default for it; "
            "pass --max-model-len (max_model_len=) with the model's context length."
        )
    return _positive_int(cfg, "max_position_embeddings", model_type, DEFAULT_MAX_POSITIONS.get(model_type))


def _family_attention_dims(
    cfg: Mapping[str, Any], family: ModelFamily, model_type: str, tp: int
) -> tuple[int, int]:
    """(KV heads per TP rank, head size) of the family's attention layers."""
    if family is families.GRANITE_HYBRID:  # its attention ignores head_dim (vLLM granitemoehybrid.py)
        heads = _positive_int(cfg, "num_attention_heads", model_type)
        kv_heads = _positive_int(cfg, "num_key_value_heads", model_type, heads)
        return check_tensor_parallel(heads, kv_heads, tp, model_type), _positive_int(
            cfg, "hidden_size", model_type
        ) // heads
    if family is families.ZAMBA2:  # multi-head attention of attention_head_dim (vLLM zamba2.py)
        heads = _positive_int(cfg, "num_attention_heads", model_type)
        return check_tensor_parallel(heads, heads, tp, model_type), _positive_int(
            cfg, "attention_head_dim", model_type
        )
    return _attention_dims(cfg, model_type, tp)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Mamba2Keys:
    """The config keys a Mamba2 family names its state's sizes with."""

    n_groups: str
    heads: str
    head_dim: str
    state_size: str
    conv_kernel: str


_MAMBA2_KEYS: dict[ModelFamily, _Mamba2Keys] = {
    families.NEMOTRON_H: _Mamba2Keys(
        n_groups="n_groups",
        heads="mamba_num_heads",
        head_dim="mamba_head_dim",
        state_size="ssm_state_size",
        conv_kernel="conv_kernel",
    ),
    families.GRANITE_HYBRID: _Mamba2Keys(
        n_groups="mamba_n_groups",
        heads="mamba_n_heads",
        head_dim="mamba_d_head",
        state_size="mamba_d_state",
        conv_kernel="mamba_d_conv",
    ),
    families.ZAMBA2: _Mamba2Keys(
        n_groups="mamba_ngroups",
        heads="n_mamba_heads",
        head_dim="mamba_headdim",
        state_size="mamba_d_state",
        conv_kernel="mamba_d_conv",
    ),
}
_MAMBA2_KEYS[families.FALCON_H1] = _MAMBA2_KEYS[families.GRANITE_HYBRID]


def _mamba2_inner_size(cfg: Mapping[str, Any], family: ModelFamily, model_type: str, heads_size: int) -> int:
    """d_inner as each model class computes it: Nemotron-H heads x head_dim; Falcon-H1 mamba_d_ssm when set;
    otherwise mamba_expand x hidden_size (Falcon's expand may be fractional)."""
    if family is families.NEMOTRON_H:
        return heads_size
    if family is families.FALCON_H1 and cfg.get("mamba_d_ssm") is not None:
        return _positive_int(cfg, "mamba_d_ssm", model_type)
    expand = cfg.get("mamba_expand")
    if isinstance(expand, bool) or not isinstance(expand, int | float) or expand <= 0:
        raise ModelConfigError(
            f"{model_type} config key 'mamba_expand' must be a positive number, got {expand!r}."
        )
    return int(expand * _positive_int(cfg, "hidden_size", model_type))


def _ssm_dtype(
    cfg: Mapping[str, Any], family: ModelFamily, model_type: str, model_dtype: torch.dtype
) -> torch.dtype:
    """The SSM state's dtype: the model's, except Nemotron-H's, float32 unless its config names one (vLLM
    0.34's NemotronHForCausalLMConfig)."""
    if family is not families.NEMOTRON_H:
        return model_dtype
    ssm = cfg.get("mamba_ssm_cache_dtype") or "float32"
    if not isinstance(ssm, str) or ssm.lower() not in MODEL_DTYPES:
        raise ModelConfigError(
            f"{model_type} config key 'mamba_ssm_cache_dtype' must be one of {sorted(MODEL_DTYPES)}, got {ssm!r}."
        )
    return MODEL_DTYPES[ssm.lower()]


def _state_layout(
    cfg: Mapping[str, Any], family: ModelFamily, model_type: str, tp: int, model_dtype: torch.dtype
) -> StateLayout:
    """The recurrent state of the family's state layers, by vLLM 0.34's shape and dtype rules."""

    def key(name: str, default: int | None = None) -> int:
        return _positive_int(cfg, name, model_type, default)

    both = (model_dtype, model_dtype)
    if family is families.JAMBA:
        return state_shapes.mamba1_state(
            tp=tp,
            intermediate_size=key("mamba_expand", 2) * key("hidden_size"),
            state_size=key("mamba_d_state", 16),
            conv_kernel=key("mamba_d_conv", 4),
            dtypes=both,
        )
    names = _MAMBA2_KEYS.get(family)
    if names is not None:
        heads, head_dim = key(names.heads), key(names.head_dim)
        return state_shapes.mamba2_state(
            tp=tp,
            intermediate_size=_mamba2_inner_size(cfg, family, model_type, heads * head_dim),
            n_groups=key(names.n_groups),
            num_heads=heads,
            head_dim=head_dim,
            state_size=key(names.state_size),
            conv_kernel=key(names.conv_kernel),
            dtypes=(model_dtype, _ssm_dtype(cfg, family, model_type, model_dtype)),
        )
    if family is families.QWEN3_NEXT:
        return state_shapes.gated_delta_net_state(
            tp=tp,
            num_k_heads=key("linear_num_key_heads"),
            num_v_heads=key("linear_num_value_heads"),
            head_k_dim=key("linear_key_head_dim"),
            head_v_dim=key("linear_value_head_dim"),
            conv_kernel=key("linear_conv_kernel_dim"),
            dtypes=both,
        )
    if family is families.MINIMAX:
        heads = key("num_attention_heads")
        head_dim = cfg.get("head_dim") or key("hidden_size") // heads
        return state_shapes.linear_attention_state(
            tp=tp, num_heads=heads, head_dim=head_dim, dtype=model_dtype
        )
    raise ModelConfigError(
        f"{model_type} config names state layers, which the {family.name} family has none of."
    )


def _window(value: object, model_type: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(f"{model_type} config key {key!r} must be a positive integer, got {value!r}.")
    return value


def _deepseek(
    cfg: Mapping[str, Any],
    model_type: str,
    block_size: int,
    kv_dtype: torch.dtype,
    quant: KVQuantMode,
    kv_cache_dtype: str,
    max_model_len: int | None,
) -> tuple[dict[str, KVCacheSpec], int, list[str]]:
    num_layers = _positive_int(cfg, "num_hidden_layers", model_type)
    latent = _positive_int(cfg, "kv_lora_rank", model_type) + _positive_int(
        cfg, "qk_rope_head_dim", model_type
    )
    max_len = _max_positions(cfg, model_type, max_model_len)
    spec = MLAAttentionSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=latent,
        dtype=kv_dtype,
        kv_quant_mode=quant,
        cache_dtype_str=FP8_DS_MLA if kv_cache_dtype == FP8_DS_MLA else None,
    )
    notes = ["MLA: one latent of kv_lora_rank + qk_rope_head_dim per token, replicated on every TP rank"]
    return {f"model.layers.{i}": spec for i in range(num_layers)}, max_len, notes


def _whisper(
    cfg: Mapping[str, Any], block_size: int, kv_dtype: torch.dtype, quant: KVQuantMode, tp: int
) -> tuple[dict[str, KVCacheSpec], int, int, list[str]]:
    layers = _positive_int(cfg, "decoder_layers", "whisper")
    heads = _positive_int(cfg, "decoder_attention_heads", "whisper")
    d_model = _positive_int(cfg, "d_model", "whisper")
    head_dim = d_model // heads
    common: dict[str, Any] = dict(
        block_size=block_size,
        num_kv_heads=check_tensor_parallel(heads, heads, tp, "whisper"),
        head_size=head_dim,
        dtype=kv_dtype,
        kv_quant_mode=quant,
    )
    specs: dict[str, KVCacheSpec] = {}
    for i in range(layers):
        specs[f"model.decoder.layers.{i}.self_attn"] = FullAttentionSpec(**common)
        specs[f"model.decoder.layers.{i}.encoder_attn"] = CrossAttentionSpec(**common)
    max_len = _positive_int(cfg, "max_target_positions", "whisper", 448)
    enc = _positive_int(cfg, "max_source_positions", "whisper", 1500)
    notes = ["encoder self-attention is computed in one pass and not cached; run with prefix caching off"]
    return specs, max_len, enc, notes
