"""Models: Hugging Face ``config.json`` files, embedded presets and kvspec layout files -> per-layer specs.

``build_model_layout(model)`` takes a preset name, a ``config.json`` path or a layout file and returns the
layer -> spec map the planner groups. Importing this package loads torch; the light names the CLI shows
before any work (presets, default model, cache dtypes) live in :mod:`kvspec.presets`.
"""

from kvspec.models.config_reader import MODEL_DTYPES, ConfigReader
from kvspec.models.decoder import BuildSettings, FamilyLayers
from kvspec.models.family import FAMILIES, ModelFamily, check_tensor_parallel, model_families
from kvspec.models.hf_config import (
    ModelLayout,
    build_model_layout,
    layout_from_config,
    load_model_config,
    resolve_model_dtype,
)
from kvspec.models.layout_file import is_layout_file, layer_specs_from_layout
from kvspec.presets import DEFAULT_MODEL, KV_CACHE_DTYPES, preset_names

__all__ = [
    "FAMILIES",
    "BuildSettings",
    "ConfigReader",
    "DEFAULT_MODEL",
    "FamilyLayers",
    "ModelFamily",
    "model_families",
    "KV_CACHE_DTYPES",
    "MODEL_DTYPES",
    "ModelLayout",
    "build_model_layout",
    "check_tensor_parallel",
    "is_layout_file",
    "layer_specs_from_layout",
    "layout_from_config",
    "load_model_config",
    "preset_names",
    "resolve_model_dtype",
]
