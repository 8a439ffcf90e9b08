"""kvspec layout files: a model's layers as registered specs, with the plugins that define them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from kvspec import FullAttentionSpec, default_registry
from kvspec.errors import ModelConfigError, PluginError
from kvspec.models import is_layout_file, layer_specs_from_layout

ROOT = Path(__file__).resolve().parents[3]
FULL_ARGS = {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"}


def _layout(**overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "kvspec_layout": 1,
        "layers": [{"name": "layers.{i}", "count": 3, "spec": "kvspec.full_attention", "args": FULL_ARGS}],
    }
    cfg.update(overrides)
    return cfg


def test_built_in_layers_by_capability_identifier() -> None:
    assert is_layout_file(_layout()) and not is_layout_file({"model_type": "llama"})
    specs = layer_specs_from_layout(_layout(), base_dir=ROOT)
    full = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    assert specs == {"layers.0": full, "layers.1": full, "layers.2": full}


def test_the_example_layout_loads_its_plugin_into_the_given_registry() -> None:
    path = ROOT / "examples/ring_window/layout.json"
    with default_registry.isolated() as registry:
        specs = layer_specs_from_layout(json.loads(path.read_text()), base_dir=path.parent, registry=registry)
        assert len(specs) == 24
        kinds = sorted({type(s).__name__ for s in specs.values()})
        assert kinds == ["FullAttentionSpec", "RingWindowSpec"]
        # Numbering continues across entries that share one pattern.
        assert type(specs["layers.0"]).__name__ == "RingWindowSpec"
        assert type(specs["layers.23"]).__name__ == "FullAttentionSpec"


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (_layout(layers=[]), "'layers' must be a non-empty list"),
        (
            _layout(layers=[{"spec": "kvspec.full_attention", "count": 0, "args": FULL_ARGS}]),
            r"count must be an int in \[1, 100000\], got 0",
        ),
        (
            _layout(layers=[{"spec": "acme.nothing", "args": FULL_ARGS}]),
            "names spec 'acme.nothing', which no registration has",
        ),
        (
            _layout(layers=[{"spec": "kvspec.full_attention", "args": {**FULL_ARGS, "dtype": "bf17"}}]),
            "dtype='bf17' is not a torch dtype name",
        ),
        (
            _layout(layers=[{"name": "x", "count": 2, "spec": "kvspec.full_attention", "args": FULL_ARGS}]),
            "names layer 'x' twice",
        ),
        (_layout(plugins="plugin.py:register"), "'plugins' must be a list"),
    ],
)
def test_bad_layouts_name_what_is_wrong(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        layer_specs_from_layout(cfg, base_dir=ROOT)


def test_a_failing_plugin_leaves_the_registry_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("def register(registry):\n    raise RuntimeError('boom')\n")
    with default_registry.isolated() as registry:
        before = len(registry)
        with pytest.raises(
            PluginError, match=r"Layout plugin 'bad.py:register' failed to register \(RuntimeError: boom\)"
        ):
            layer_specs_from_layout(
                _layout(plugins=["bad.py:register"]), base_dir=tmp_path, registry=registry
            )
        assert len(registry) == before


@pytest.mark.parametrize(
    ("body", "when"),
    [
        ("import sys\nsys.exit(0)\n", "importing"),
        ("import sys\ndef register(r):\n    sys.exit(0)\n", "registering"),
    ],
)
def test_a_layout_plugin_that_exits_the_process_is_an_error_not_a_success(
    tmp_path: Path, body: str, when: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 51: a plugin calling sys.exit(0) ended `kvspec plan` with status 0 and no plan."""
    from kvspec.cli.main import main

    (tmp_path / f"exiting_{when}.py").write_text(
        body + ("def register(r):\n    pass\n" if when == "importing" else "")
    )
    layout = _layout(plugins=[f"exiting_{when}.py:register"])
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(layout))
    with default_registry.isolated(), pytest.raises(SystemExit) as info:
        main(["plan", str(path), "--memory", "1GiB", "--no-plugins"])
    assert info.value.code == 2
    assert (
        f"exited the process while {when} (0); a plugin must raise an exception, not exit"
        in capsys.readouterr().err
    )
