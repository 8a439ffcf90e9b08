"""kvspec's fleet side by side with Dynamo's offline replay ("DynoSim", ai-dynamo 1.4.2), one run.

    python -m benchmarks.dynosim [--traces conversation synthetic] [--workers 4 8]
        [--blocks 4096 16384 65536] [--kv-runs 3] [--kvspec-workers 2] [--limit N]
        [--dynosim-python PY] [--out results.json]

DynoSim's settings throughout: 64-token blocks, ``--blocks`` blocks per worker, 8,192 batched tokens and 256
sequences per step, its polynomial timing, LRU, the trace's 512-token hash blocks, real arrival times. Requests
longer than Llama 3.1 8B's 131,072-token context (10 of the synthetic trace's) are dropped for both, since
vLLM (and kvspec) refuse them and DynoSim, which knows no context length, would serve them.
kvspec replays the same trace on the same number of instances with those settings
(``--step-time dynosim``, a full-attention model: Llama 3.1 8B's layout at 64-token blocks, the block count
given), routing round robin (against DynoSim's round_robin) and ``kv_cost`` (against kv_router, whose ties go
to a random worker, so DynoSim's kv runs are repeated ``--kv-runs`` times and given as a range). Prints one
markdown table: reuse (``prefix_cache_reused_ratio``: reused prompt tokens over prompt tokens, first
admissions) and mean TTFT per simulator, and each one's wall time on this machine. Runs in
``nox -s dynosim`` (DynoSim in that session's virtualenv; not part of ``.ci/run``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Llama 3.1 8B's context length (its config's max_position_embeddings).
CONTEXT = 131_072

TRACES = {
    "conversation": "../shared/traces/mooncake_conversation_trace.jsonl",
    "synthetic": "../shared/traces/mooncake_synthetic_trace.jsonl",
}


def cut_trace(
    trace: str, out: Path, *, limit: int | None = None, output_length: int | None = None
) -> tuple[int, int]:
    """Write ``trace``'s first ``limit`` requests that fit Llama 3.1 8B's context to ``out`` (vLLM and
    kvspec refuse the others, DynoSim would serve them), each output set to ``output_length`` tokens if
    given; the requests (kept, dropped)."""
    kept = dropped = 0
    with open(trace) as src, out.open("w") as dst:
        for line in src:
            if limit and kept >= limit:
                break
            row = json.loads(line)
            if row["input_length"] + row["output_length"] > CONTEXT:
                dropped += 1
                continue
            if output_length is None:
                dst.write(line)
            else:
                row["output_length"] = output_length
                dst.write(json.dumps(row) + "\n")
            kept += 1
    return kept, dropped


def run_dynosim(python: str, trace: str, workers: int, blocks: int, router: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        start = time.perf_counter()
        subprocess.run(
            [
                python,
                "-m",
                "dynamo.replay",
                trace,
                "--num-workers",
                str(workers),
                "--router-mode",
                router,
                "--trace-format",
                "mooncake",
                "--trace-block-size",
                "512",
                "--report-json",
                str(report),
                "--extra-engine-args",
                json.dumps({"num_gpu_blocks": blocks, "block_size": 64}),
            ],
            check=True,
            capture_output=True,
            env={"DYN_LOG": "warn", "PATH": "/usr/bin:/bin"},
        )
        wall = time.perf_counter() - start
        data = json.loads(report.read_text())
    return {
        "reuse": data["prefix_cache_reused_ratio"],
        "ttft_mean": data["mean_ttft_ms"],
        "ttft_p90": data["p90_ttft_ms"],
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    parser.add_argument("--workers", nargs="+", type=int, default=[4, 8])
    parser.add_argument("--blocks", nargs="+", type=int, default=[4096, 16384, 65536])
    parser.add_argument("--kv-runs", type=int, default=3)
    parser.add_argument("--kvspec-workers", type=int, default=None, help="process pool size (default: cores)")
    parser.add_argument("--limit", type=int, default=None, help="the traces' first N requests")
    parser.add_argument("--dynosim-python", default=sys.executable)
    parser.add_argument("--out", default=None, help="write every figure as JSON here")
    args = parser.parse_args(argv)

    from kvspec.fleet.sweep import SweepPoint, run_sweep

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for trace_name in args.traces:
            trace = TRACES[trace_name]
            # vLLM refuses a request longer than Llama 3.1 8B's context (prompt and output over 131,072
            # tokens; kvspec too), DynoSim 1.4.2 has no such limit: both replay the trace without them.
            cut = Path(tmp) / f"{trace_name}.jsonl"
            kept, dropped = cut_trace(trace, cut, limit=args.limit)
            print(
                f"# {trace_name}: {kept} requests, {dropped} over {CONTEXT:,} tokens dropped", file=sys.stderr
            )
            trace = str(cut)
            points = [
                SweepPoint(
                    model="llama-3.1-8b",
                    trace=trace,
                    num_instances=w,
                    router=r,
                    num_blocks=b,
                    block_size=64,
                    step_time="dynosim",
                )
                for w in args.workers
                for b in args.blocks
                for r in ("round_robin", "kv_cost")
            ]
            start = time.perf_counter()
            kvspec_rows = {
                (row["point"]["num_instances"], row["point"]["num_blocks"], row["point"]["router"]): row
                for row in run_sweep(points, executor="process", workers=args.kvspec_workers)
            }
            sweep_wall = time.perf_counter() - start
            print(f"# {trace_name}: kvspec's {len(points)} fleets in {sweep_wall:.0f} s", file=sys.stderr)
            for w in args.workers:
                for b in args.blocks:
                    rr = run_dynosim(args.dynosim_python, trace, w, b, "round_robin")
                    kv = [
                        run_dynosim(args.dynosim_python, trace, w, b, "kv_router")
                        for _ in range(args.kv_runs)
                    ]
                    mine_rr = kvspec_rows[(w, b, "round_robin")]
                    mine_kv = kvspec_rows[(w, b, "kv_cost")]
                    rows.append(
                        {
                            "trace": trace_name,
                            "workers": w,
                            "blocks": b,
                            "dynosim_rr": rr,
                            "dynosim_kv": kv,
                            "kvspec_rr": {
                                "reuse": mine_rr["total"]["reuse_ratio"],
                                "ttft_mean": mine_rr["total"]["ttft_ms_mean"],
                                "ttft_p90": mine_rr["total"]["ttft_ms_p90"],
                                "wall_s": mine_rr["wall_seconds"],
                            },
                            "kvspec_kv": {
                                "reuse": mine_kv["total"]["reuse_ratio"],
                                "ttft_mean": mine_kv["total"]["ttft_ms_mean"],
                                "ttft_p90": mine_kv["total"]["ttft_ms_p90"],
                                "wall_s": mine_kv["wall_seconds"],
                            },
                        }
                    )
                    print(table_row(rows[-1]), flush=True)
    print()
    print(table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


HEADER = (
    "| trace | workers | blocks/worker | RR reuse DynoSim / kvspec | equal (< 0.0005) | kv_router reuse DynoSim "
    "(range) / kvspec kv_cost | in range (±0.005) | TTFT mean ms RR DynoSim / kvspec | TTFT mean ms kv DynoSim / kvspec "
    "| wall s RR DynoSim / kvspec |\n|---|---:|---:|---|---|---|---|---|---|---|"
)


def table_row(r: dict[str, Any]) -> str:
    kv = [run["reuse"] for run in r["dynosim_kv"]]
    kv_ttft = [run["ttft_mean"] for run in r["dynosim_kv"]]
    mine = r["kvspec_kv"]["reuse"]
    same = abs(r["dynosim_rr"]["reuse"] - r["kvspec_rr"]["reuse"]) < 0.0005
    inside = min(kv) - 0.005 <= mine <= max(kv) + 0.005
    return (
        f"| {r['trace']} | {r['workers']} | {r['blocks']:,} | {r['dynosim_rr']['reuse']:.4f} / "
        f"{r['kvspec_rr']['reuse']:.4f} | {'yes' if same else 'no'} | {min(kv):.4f}-{max(kv):.4f} / {mine:.4f} | "
        f"{'yes' if inside else 'no'} | {r['dynosim_rr']['ttft_mean']:.0f} / {r['kvspec_rr']['ttft_mean']:.0f} | "
        f"{min(kv_ttft):.0f}-{max(kv_ttft):.0f} / {r['kvspec_kv']['ttft_mean']:.0f} | "
        f"{r['dynosim_rr']['wall_s']:.1f} / {r['kvspec_rr']['wall_s']:.1f} |"
    )


def table(rows: list[dict[str, Any]]) -> str:
    return "\n".join([HEADER, *(table_row(r) for r in rows)])


if __name__ == "__main__":
    raise SystemExit(main())
