"""Model configs -> per-layer KV cache specs, from a Hugging Face ``config.json`` or an embedded preset.

Reads JSON only (no network, no transformers). Supported families: dense decoders (Llama, Mistral,
Qwen2/3 and anything shaped like them), Gemma 2 and 3 (interleaved sliding window), DeepSeek V2/V3 (MLA),
Llama 4 (chunked local attention), Jamba (Mamba hybrid), and Whisper (encoder-decoder, cross attention).
Tensor parallelism divides KV heads (at least one per rank, as engines replicate them); MLA latents are
not split. Pipeline parallelism splits layers into contiguous stages.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch

from kvspec.contracts.release import DEFAULT_BLOCK_SIZE
from kvspec.contracts.spec import KVCacheSpec, MambaCacheMode
from kvspec.errors import KVSpecError, ModelConfigError
from kvspec.models import families as _families  # noqa: F401  (registers the built-in families)
from kvspec.models.config_reader import MODEL_DTYPES, ConfigReader, with_standard_names
from kvspec.models.decoder import BuildSettings
from kvspec.models.family import recognise_family
from kvspec.models.layout_file import is_layout_file, layer_specs_from_layout
from kvspec.presets import DEFAULT_MODEL as DEFAULT_MODEL
from kvspec.presets import KV_CACHE_DTYPES as KV_CACHE_DTYPES
from kvspec.presets import _preset_files
from kvspec.presets import preset_names as preset_names
from kvspec.specs.dtypes import KVQuantMode, get_kv_quant_mode

P = ParamSpec("P")
R = TypeVar("R")

#: A config file larger than this is not a model config (the biggest real ones are a few KiB).
MAX_CONFIG_BYTES = 1 << 24


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
    block_size: int = DEFAULT_BLOCK_SIZE,
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
    max_len = max_model_len or ConfigReader(cfg, "kvspec layout").positive_int("max_model_len")
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
    block_size: int = DEFAULT_BLOCK_SIZE,
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
    architectures = cfg.get("architectures")
    family = recognise_family(
        model_type,
        inner_type,
        assume_dense=assume_dense,
        architectures=[a for a in architectures if isinstance(a, str)]
        if isinstance(architectures, list)
        else (),
    )
    model_dtype = resolve_model_dtype(dtype, cfg)
    kv_dtype, quant = _kv_dtype(kv_cache_dtype, model_dtype)
    if kv_cache_dtype == "fp8_ds_mla" and not family.latent_attention:
        raise ModelConfigError("kv cache dtype 'fp8_ds_mla' applies to MLA (DeepSeek) models only.")
    settings = BuildSettings(
        block_size=block_size,
        kv_dtype=kv_dtype,
        quant=quant,
        kv_cache_dtype=kv_cache_dtype,
        model_dtype=model_dtype,
        tp=tensor_parallel_size,
        max_model_len=max_model_len,
        mamba_cache_mode=mamba_cache_mode,
        align_to_block_size=align_to_block_size,
    )
    built = family.build(ConfigReader(with_standard_names(text), inner_type), settings)
    max_len = built.max_len
    notes = list(built.notes)
    if max_model_len is not None and max_model_len > max_len:
        raise ModelConfigError(
            f"max_model_len {max_model_len:,} is larger than the model's context length {max_len:,} (its "
            "config's max_position_embeddings); vLLM refuses it too. Pass at most that (--max-model-len)."
        )
    assumed = not {model_type, inner_type} & set(family.model_types)
    if assumed:
        notes.insert(
            0, f"model_type {inner_type!r} is not a known family: planned as a dense decoder (--assume-dense)"
        )
    return ModelLayout(
        name=name,
        model_type=model_type,
        stage_specs=_split_stages(built.specs, pipeline_parallel_size),
        max_model_len=max_model_len or max_len,
        max_num_encoder_input_tokens=built.encoder_tokens,
        notes=tuple(notes),
        family=family.name,
        assumed_dense=assumed,
    )
