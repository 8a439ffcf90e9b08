"""The light names the CLI shows before any work (kvspec.presets)."""

from __future__ import annotations

import subprocess
import sys

from kvspec.presets import DEFAULT_MODEL, KV_CACHE_DTYPES, preset_names


def test_presets_are_listed_once_sorted_and_include_the_default() -> None:
    names = preset_names()
    assert names == sorted(set(names)) and len(names) == 9
    assert DEFAULT_MODEL in names
    assert {"google/gemma-3-27b-it", "openai/whisper-large-v3", "ai21labs/AI21-Jamba-1.5-Mini"} <= set(names)
    assert KV_CACHE_DTYPES[0] == "auto" and "fp8" in KV_CACHE_DTYPES


def test_presets_load_without_torch() -> None:
    code = "import sys, kvspec.presets as p; p.preset_names(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
