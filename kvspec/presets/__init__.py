"""The names the CLI offers before any work: the default model, the presets, the KV cache dtypes.

A light module (no torch): ``kvspec --help`` builds its parser from it without loading the library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B"

KV_CACHE_DTYPES = (
    "auto",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "fp8_ds_mla",
)


def _preset_files() -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for entry in resources.files("kvspec.presets").iterdir():
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text())
            for key in [data["_name"], *data.get("_aliases", [])]:
                out[key.lower()] = data
    return out


def preset_names() -> list[str]:
    """The canonical names of the embedded presets."""
    return sorted({data["_name"] for data in _preset_files().values()})
