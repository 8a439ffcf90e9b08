"""Every kvspec import path that README.md and docs/ show works (module, or a name in a module)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Dotted names in the docs that are not import paths: the entry-point group and a spec identifier.
NOT_PATHS = {"kvspec.plugins", "kvspec.full_attention"}


def documented_paths() -> list[str]:
    found: set[str] = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        found |= set(re.findall(r"\bkvspec(?:\.[A-Za-z_][A-Za-z0-9_]*)+", text))
        for module, names in re.findall(r"from (kvspec[\w.]*) import ([\w, ]+)", text):
            found |= {f"{module}.{n.strip()}" for n in names.split(",") if n.strip()}
    return sorted(found - NOT_PATHS)


def resolve(path: str) -> object:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            value = getattr(value, attr)
        return value
    raise ModuleNotFoundError(path)


def test_the_docs_show_paths() -> None:
    paths = documented_paths()
    assert {
        "kvspec.builtins",
        "kvspec.planning.get_kv_cache_configs",
        "kvspec.models.build_model_layout",
    } <= set(paths)


@pytest.mark.parametrize("path", documented_paths())
def test_documented_path_resolves(path: str) -> None:
    resolve(path)


def test_resolve_can_fail() -> None:
    with pytest.raises(AttributeError):
        resolve("kvspec.planning.no_such_function")
    with pytest.raises(ModuleNotFoundError):
        resolve("kvspecx.pool")
