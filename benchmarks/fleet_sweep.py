"""The fleet figures of docs/FLEET.md: models x traces x instances x memory x routers, resumable.

    python -m benchmarks.fleet_sweep [--out fleet.jsonl] [--limit 1000] [--workers 2]
        [--models llama-3.1-8b gemma-3-27b jamba-1.5-mini] [--traces conversation synthetic]
        [--instances 4 8] [--memory 24GiB 64GiB 256GiB] [--routers ...] [--dynosim-python PY]

Every fleet: the model's planned layout at 64-token blocks in ``--memory`` of KV cache per instance, the
trace's first ``--limit`` requests at their real arrival times, DynoSim's polynomial step time, LRU, 8,192
tokens and 256 sequences a step. The rows go to ``--out`` as they finish (a rerun skips those there). Prints,
per model and trace, reuse (prompt tokens served from the prefix cache over all prompt tokens) and mean TTFT
per router, and which router wins each row. With ``--dynosim-python`` (a Python with ai-dynamo 1.4.2), the
hybrid models are also replayed by DynoSim as a full-attention engine of the same memory (its
``num_gpu_blocks`` = the plan's token slots / 64: the tokens the memory holds when every layer keeps every
token), to show how far that model of the engine misjudges a hybrid's reuse.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.dynosim import TRACES, run_dynosim

ROUTERS = ["round_robin", "cache_aware", "precise_prefix", "exact_prefix", "kv_cost", "exact"]


def _gib(text: str) -> int:
    from kvspec.cli.args import parse_bytes

    return parse_bytes(text)


def tables(rows: list[dict[str, Any]], routers: list[str]) -> str:
    grouped: dict[tuple[str, str], dict[tuple[int, int], dict[str, Any]]] = defaultdict(dict)
    traces = {v: k for k, v in TRACES.items()}
    for row in rows:
        p = row["point"]
        trace = traces.get(p["trace"], Path(p["trace"]).stem)
        grouped[(p["model"], trace)].setdefault((p["num_instances"], p["memory"]), {})[p["router"]] = row
    out = []
    for (model, trace), by_size in grouped.items():
        out.append(f"#### {model}, {trace} trace")
        out.append("")
        out.append(
            "| instances | KV / instance | "
            + " | ".join(f"{r} reuse / TTFT ms" for r in routers)
            + " | best reuse | best TTFT |"
        )
        out.append("|---:|---:|" + "---|" * len(routers) + "---|---|")
        for (n, memory), cells in sorted(by_size.items()):
            present = [r for r in routers if r in cells]
            if not present:
                continue
            best_reuse = max(present, key=lambda r: cells[r]["total"]["reuse_ratio"])
            best_ttft = min(present, key=lambda r: cells[r]["total"]["ttft_ms_mean"])
            base = cells.get("round_robin")
            gain = ""
            if base and base["total"]["ttft_ms_mean"]:
                gain = (
                    f" ({base['total']['ttft_ms_mean'] / cells[best_ttft]['total']['ttft_ms_mean']:.2f}x RR)"
                )
            out.append(
                f"| {n} | {memory / 2**30:.0f} GiB | "
                + " | ".join(
                    f"{cells[r]['total']['reuse_ratio']:.4f} / {cells[r]['total']['ttft_ms_mean']:.0f}"
                    if r in cells
                    else "-"
                    for r in routers
                )
                + f" | {best_reuse} | {best_ttft}{gain} |"
            )
        out.append("")
    return "\n".join(out)


def sweep_rows(
    points: list[Any], *, out: str, workers: int | None, on_row: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """Run ``points`` through the process pool (the rows already in ``out`` are kept, not rerun) and return
    the rows of exactly those points, read back from ``out``."""
    from kvspec.fleet.sweep import run_sweep

    run_sweep(points, executor="process", workers=workers, out=out, on_row=on_row)
    keys = {p.key() for p in points}
    rows = [json.loads(line) for line in Path(out).read_text().splitlines() if line.strip()]
    return [r for r in rows if r["key"] in keys]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="fleet.jsonl")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--models", nargs="+", default=["llama-3.1-8b", "gemma-3-27b", "jamba-1.5-mini"])
    parser.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    parser.add_argument("--instances", nargs="+", type=int, default=[4, 8])
    parser.add_argument(
        "--memory", nargs="+", type=_gib, default=[_gib("24GiB"), _gib("64GiB"), _gib("256GiB")]
    )
    parser.add_argument("--routers", nargs="+", default=ROUTERS)
    parser.add_argument("--dynosim-python", default=None)
    args = parser.parse_args(argv)

    from kvspec.fleet.sweep import SweepPoint

    points = [
        SweepPoint(
            model=model,
            trace=TRACES[trace],
            num_instances=n,
            router=router,
            memory=memory,
            limit=args.limit,
            block_size=64,
            step_time="dynosim",
        )
        for model in args.models
        for trace in args.traces
        for n in args.instances
        for memory in args.memory
        for router in args.routers
    ]

    def note(row: dict[str, Any]) -> None:
        p, t = row["point"], row["total"]
        print(
            f"{p['model']} {Path(p['trace']).stem} {p['num_instances']}x{p['memory'] / 2**30:.0f}GiB "
            f"{p['router']}: reuse {t['reuse_ratio']} TTFT {t['ttft_ms_mean']} ({row['wall_seconds']} s)",
            file=sys.stderr,
            flush=True,
        )

    rows = sweep_rows(points, out=args.out, workers=args.workers, on_row=note)
    print(tables(rows, args.routers))
    if args.dynosim_python:
        print(misjudged(rows, args))
    return 0


def misjudged(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """DynoSim's full-attention engine against kvspec's planned hybrid, same memory and trace prefix."""
    import tempfile

    from kvspec.cli.main import _token_slots
    from kvspec.contracts.spec import SchedulerLimits
    from kvspec.models import build_model_layout
    from kvspec.planning import get_kv_cache_config

    lines = [
        "| model | trace | instances | KV / instance | DynoSim blocks (full attention) | RR reuse DynoSim / kvspec "
        "| KV-router reuse DynoSim / kvspec kv_cost / exact |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    index = {
        (
            r["point"]["model"],
            r["point"]["trace"],
            r["point"]["num_instances"],
            r["point"]["memory"],
            r["point"]["router"],
        ): r
        for r in rows
    }
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            layout = build_model_layout(model, block_size=64, max_model_len=None, mamba_cache_mode="align")
            limits = SchedulerLimits(
                max_model_len=layout.max_model_len, max_num_batched_tokens=8192, mamba_cache_mode="align"
            )
            for trace_name in args.traces:
                cut = Path(tmp) / f"{trace_name}.jsonl"
                with open(TRACES[trace_name]) as src:
                    cut.write_text("".join(line for _, line in zip(range(args.limit), src)))
                for n in args.instances:
                    for memory in args.memory:
                        config = get_kv_cache_config(layout.layer_specs, memory, limits)
                        blocks = max(1, _token_slots(config) // 64)
                        rr = run_dynosim(args.dynosim_python, str(cut), n, blocks, "round_robin")
                        kv = run_dynosim(args.dynosim_python, str(cut), n, blocks, "kv_router")
                        key = (model, TRACES[trace_name], n, memory)
                        mine = {r: index.get((*key, r)) for r in ("round_robin", "kv_cost", "exact")}
                        cell = {r: f"{m['total']['reuse_ratio']:.4f}" if m else "-" for r, m in mine.items()}
                        lines.append(
                            f"| {model} | {trace_name} | {n} | {memory / 2**30:.0f} GiB | {blocks:,} | "
                            f"{rr['reuse']:.4f} / {cell['round_robin']} | {kv['reuse']:.4f} / {cell['kv_cost']} / "
                            f"{cell['exact']} |"
                        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
