"""plan, simulate and inspect load installed kvspec.plugins entry points (issue 18, item 4)."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from examples.ring_window.plugin import register as register_ring
from kvspec.cli.main import main

LAYOUT = {
    "kvspec_layout": 1,
    "name": "ring window, plugin installed",
    "max_model_len": 4096,
    "layers": [
        {
            "name": "layers.{i}",
            "count": 4,
            "spec": "acme.ring_window",
            "args": {
                "block_size": 16,
                "num_kv_heads": 8,
                "head_size": 128,
                "dtype": "bfloat16",
                "window": 1024,
            },
        }
    ],
}


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The ring-window example installed as an entry point (not named in the layout file)."""
    entry = SimpleNamespace(
        name="ring",
        value="examples.ring_window.plugin:register",
        dist=SimpleNamespace(name="acme-ring"),
        load=lambda: register_ring,
    )
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group: [entry] if group == "kvspec.plugins" else []
    )
    monkeypatch.delenv("KVSPEC_PLUGINS", raising=False)
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(LAYOUT))
    return path


def test_plan_loads_installed_plugins(installed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(installed), "--memory", "1GiB", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["fits"] and plan["stages"][0]["groups"][0]["layers"] == 4


def test_simulate_loads_installed_plugins(installed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(installed), "--memory", "1GiB", "--requests", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 4


def test_inspect_lists_installed_plugins(installed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["plugins_loaded"] == ["ring"]


def test_no_plugins_and_the_allow_list_are_obeyed(
    installed: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", str(installed), "--no-plugins"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "names spec 'acme.ring_window', which no registration has" in err
    assert "kvspec.plugins' entry point loads by itself" in err
    monkeypatch.setenv("KVSPEC_PLUGINS", "other")
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", str(installed)])
    assert exit_info.value.code == 2
    assert (
        "kvspec plugin 'other' named in the allow-list matches no installed entry point"
        in capsys.readouterr().err
    )
