"""docs/ARCHITECTURE.md's "Add one of these" walkthroughs stay true: every path they name exists, and every
code block runs and registers what it says (issue 50). The registries are snapshotted and restored."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvspec.eviction import POLICIES, eviction_policy_names
from kvspec.fleet import ROUTERS, router_names
from kvspec.models import FAMILIES
from kvspec.tiers import tier_names
from kvspec.tiers.registry import TIERS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def _section() -> str:
    text = DOC.read_text()
    start = text.index("## Add one of these")
    return text[start : text.index("\n## ", start + 3)]


def _walkthroughs() -> dict[str, str]:
    parts = re.split(r"^### ", _section(), flags=re.M)[1:]
    return {part.splitlines()[0].strip(): part for part in parts}


@pytest.fixture
def saved_registries() -> Iterator[None]:
    families, routers, tiers = FAMILIES.snapshot(), ROUTERS.snapshot(), TIERS.snapshot()
    policies = POLICIES.snapshot()
    try:
        yield
    finally:
        FAMILIES.restore(families)
        ROUTERS.restore(routers)
        TIERS.restore(tiers)
        POLICIES.restore(policies)


def test_every_extension_point_has_a_walkthrough() -> None:
    assert set(_walkthroughs()) == {
        "A model family",
        "A router",
        "An offload tier",
        "An eviction policy",
        "A vLLM release",
    }


@pytest.mark.parametrize("title", sorted(_walkthroughs()))
def test_every_path_a_walkthrough_names_exists(title: str) -> None:
    paths = re.findall(r"`((?:kvspec|tests)/[^`<>]+|noxfile\.py)`", _walkthroughs()[title])
    assert paths, title
    missing = [p for p in paths if not (ROOT / p.rstrip("/")).exists()]
    assert missing == []


@pytest.mark.parametrize(
    ("title", "registered"),
    [
        ("A model family", lambda: "acme.fourths" in FAMILIES.names()),
        ("A router", lambda: "acme.sticky" in router_names()),
        ("An offload tier", lambda: "acme.half" in tier_names()),
        ("An eviction policy", lambda: "acme.release_order" in eviction_policy_names()),
        ("A vLLM release", lambda: True),
    ],
)
def test_every_walkthrough_runs_and_registers(title: str, registered: object, saved_registries: None) -> None:
    blocks = re.findall(r"```python\n(.*?)```", _walkthroughs()[title], flags=re.S)
    assert len(blocks) == 1, title
    # A module of its own, as a reader's file would be (dataclasses look their module up).
    module = types.ModuleType("kvspec_walkthrough")
    sys.modules[module.__name__] = module
    try:
        exec(compile(blocks[0], f"<{title}>", "exec", dont_inherit=True), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    assert callable(registered) and registered()
