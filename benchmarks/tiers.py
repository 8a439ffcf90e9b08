"""The tier figures of docs/TIERS.md: reuse and TTFT against host memory per instance, with and without a
shared pool, and the Mooncake FAST'25 Fig. 10 reproduction. Resumable (rows kept in ``--out``).

    python -m benchmarks.tiers [--out tiers.jsonl] [--workers 2] [--limit N]
        [--models llama-3.1-8b gemma-3-27b] [--traces conversation synthetic] [--instances 4]
        [--memory 24GiB] [--router exact] [--fig10-only | --no-fig10] [--dynosim-python PY]

**Host memory sweep.** Per model and trace, ``--instances`` instances with ``--memory`` of GPU KV cache
each (the model's plan at 64-token blocks, DynoSim's step time, LRU, one router), host memory per instance
at five sizes from 0 to what holds every distinct block of the trace (all layers of every offloaded
group: 0, 1/64, 1/16, 1/4 and all of it), without a pool and with a shared pool of a quarter of it.

**Fig. 10.** Mooncake's setup: 10 instances, outputs capped at one token, each instance's own 3M-token
cache ("local": a host tier of 3M tokens of Llama 3.1 8B's KV each) against one 30M-token pool all share
("global"), 4,096 GPU blocks of 64 tokens each, per router at the trace's arrival times, and the ``exact``
router with arrivals sped up ``--fig10-speedups`` times (load pushes a cache-aware router off its caches);
the ratio of global to local reuse beside the paper's (conversation 2.22x, synthetic 2.36x). Beside it,
one cache of 3M and one of 30M tokens seeing the whole trace (one instance; with ``--dynosim-python``,
DynoSim's one worker too): what the paper's local scheduler, "the node with the higher prefix-match
ratio" (``longest_prefix``), makes of ten nodes when every request shares a first block.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.dynosim import TRACES
from benchmarks.fleet_sweep import sweep_rows

#: Mooncake FAST'25 Fig. 10: global / local cache hit rate.
PAPER_FIG10 = {"conversation": 2.22, "tool_agent": 1.38, "synthetic": 2.36}
FIG10_TOKENS = 3_000_000
FIG10_ROUTERS = ["longest_prefix", "exact", "kv_cost", "cache_aware", "least_loaded", "round_robin"]


def _bytes(text: str) -> int:
    from kvspec.cli.args import parse_bytes

    return parse_bytes(text)


def bytes_per_token(model: str) -> int:
    """One token's KV bytes over every group's layers (what a tier stores of a token, all groups offloaded)."""
    from kvspec.contracts.spec import SchedulerLimits
    from kvspec.models import build_model_layout
    from kvspec.planning import get_kv_cache_config

    layout = build_model_layout(model, block_size=64, max_model_len=None, mamba_cache_mode="align")
    limits = SchedulerLimits(max_model_len=layout.max_model_len, mamba_cache_mode="align")
    config = get_kv_cache_config(layout.layer_specs, 1 << 40, limits)
    total = 0.0
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        total += spec.page_size_bytes * len(group.layer_names) / spec.block_size
    return round(total)


def distinct_tokens(trace: str, limit: int | None) -> int:
    """Tokens in the trace's distinct hash blocks (its first ``limit`` lines)."""
    from kvspec.engine.traces import read_trace

    seen: set[int] = set()
    block = 512
    for request in read_trace(trace, limit=limit):
        block = request.hash_block_size or block
        seen.update(request.hash_ids or ())
    return len(seen) * block


def host_sweep_points(args: argparse.Namespace) -> list[Any]:
    from kvspec.fleet.sweep import SweepPoint

    points = []
    for model in args.models:
        per_token = bytes_per_token(model)
        for trace in args.traces:
            whole = distinct_tokens(TRACES[trace], args.limit) * per_token
            sizes = [0, whole // 64, whole // 16, whole // 4, whole]
            for pool in (0, whole // 4):
                for host in sizes:
                    points.append(
                        SweepPoint(
                            model=model,
                            trace=TRACES[trace],
                            num_instances=args.instances,
                            router=args.router,
                            memory=args.memory,
                            limit=args.limit,
                            block_size=64,
                            step_time="dynosim",
                            host_memory=host,
                            shared_pool=pool,
                        )
                    )
    return points


def fig10_points(args: argparse.Namespace) -> list[Any]:
    from kvspec.fleet.sweep import SweepPoint

    per_token = bytes_per_token("llama-3.1-8b")
    points = []
    runs = [(router, 1.0) for router in args.fig10_routers]
    runs += [("exact", speedup) for speedup in args.fig10_speedups]
    for trace in ("conversation", "synthetic"):
        for router, speedup in runs:
            for local in (True, False):
                points.append(
                    SweepPoint(
                        model="llama-3.1-8b",
                        trace=TRACES[trace],
                        num_instances=10,
                        router=router,
                        num_blocks=4096,
                        limit=args.limit,
                        block_size=64,
                        speedup=speedup,
                        max_output_tokens=1,
                        host_memory=FIG10_TOKENS * per_token if local else 0,
                        shared_pool=0 if local else 10 * FIG10_TOKENS * per_token,
                    )
                )
    return points


def single_cache_points(args: argparse.Namespace) -> list[Any]:
    """One instance, the whole trace, one output token, a GPU cache of 3M and of 30M tokens: the local and
    global sides of Fig. 10 when one cache sees every request (what ``longest_prefix`` routing does)."""
    from kvspec.fleet.sweep import SweepPoint

    return [
        SweepPoint(
            model="llama-3.1-8b",
            trace=TRACES[trace],
            num_instances=1,
            router="round_robin",
            num_blocks=tokens // 64,
            limit=args.limit,
            block_size=64,
            max_output_tokens=1,
        )
        for trace in ("conversation", "synthetic")
        for tokens in (FIG10_TOKENS, 10 * FIG10_TOKENS)
    ]


def dynosim_single_cache(python: str, limit: int | None) -> dict[tuple[str, int], float]:
    """DynoSim's reuse with one worker and the same two caches, outputs capped at one token and requests
    over Llama 3.1 8B's context dropped (the traces rewritten so, as ``benchmarks.dynosim`` does): an
    independent full-attention LRU engine for the single-cache curve."""
    import tempfile

    from benchmarks.dynosim import cut_trace, run_dynosim

    out: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for trace in ("conversation", "synthetic"):
            path = Path(tmp) / f"{trace}.jsonl"
            cut_trace(TRACES[trace], path, limit=limit, output_length=1)
            for tokens in (FIG10_TOKENS, 10 * FIG10_TOKENS):
                out[(trace, tokens)] = run_dynosim(python, str(path), 1, tokens // 64, "round_robin")["reuse"]
    return out


def single_cache_table(rows: list[dict[str, Any]], dynosim: dict[tuple[str, int], float]) -> str:
    cells: dict[tuple[str, int], float] = {}
    for row in rows:
        p = row["point"]
        if p["num_instances"] == 1 and p.get("max_output_tokens") == 1:
            cells[(_trace_name(p["trace"]), p["num_blocks"] * 64)] = row["total"]["reuse_ratio"]
    out = [
        "| trace | one cache of 3M tokens | of 30M tokens | 30M / 3M | DynoSim 3M | DynoSim 30M | DynoSim 30M / 3M | paper |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for trace in ("conversation", "synthetic"):
        small, large = cells.get((trace, FIG10_TOKENS)), cells.get((trace, 10 * FIG10_TOKENS))
        if small is None or large is None:
            continue
        d_small, d_large = dynosim.get((trace, FIG10_TOKENS)), dynosim.get((trace, 10 * FIG10_TOKENS))
        theirs = (
            f"{d_small:.4f} | {d_large:.4f} | {d_large / d_small:.2f}x"
            if d_small and d_large
            else "-- | -- | --"
        )
        out.append(
            f"| {trace} | {small:.4f} | {large:.4f} | {large / small:.2f}x | {theirs} | "
            f"{PAPER_FIG10[trace]:.2f}x |"
        )
    return "\n".join(out)


def _trace_name(path: str) -> str:
    return {v: k for k, v in TRACES.items()}.get(path, Path(path).stem)


def host_tables(rows: list[dict[str, Any]]) -> str:
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        p = row["point"]
        if p.get("max_output_tokens") == 1:
            continue
        grouped[(p["model"], _trace_name(p["trace"]))].append(row)
    out = []
    for (model, trace), group in grouped.items():
        out.append(f"#### {model}, {trace} trace")
        out.append("")
        out.append(
            "| host / instance | pool | reuse | GPU | host | pool | TTFT mean ms | TTFT p90 ms | "
            "loaded GB | stored GB |"
        )
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in sorted(
            group, key=lambda r: (r["point"].get("shared_pool", 0), r["point"].get("host_memory", 0))
        ):
            p, t = row["point"], row["total"]
            loaded = (t.get("host_loaded_bytes", 0) + t.get("pool_loaded_bytes", 0)) / 1e9
            stored = (t.get("host_stored_bytes", 0) + t.get("pool_stored_bytes", 0)) / 1e9
            out.append(
                f"| {p.get('host_memory', 0) / 2**30:,.0f} GiB | {p.get('shared_pool', 0) / 2**30:,.0f} GiB | "
                f"{t['reuse_ratio']:.4f} | {t.get('gpu_reuse_ratio', t['reuse_ratio']):.4f} | "
                f"{t.get('host_reuse_ratio', 0.0):.4f} | {t.get('pool_reuse_ratio', 0.0):.4f} | "
                f"{t['ttft_ms_mean']:.0f} | {t['ttft_ms_p90']:.0f} | {loaded:,.0f} | {stored:,.0f} |"
            )
        out.append("")
    return "\n".join(out)


def fig10_table(rows: list[dict[str, Any]]) -> str:
    cells: dict[tuple[str, str, float], dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        p = row["point"]
        if p.get("max_output_tokens") != 1 or p["num_instances"] != 10:
            continue
        side = "local" if p.get("host_memory") else "global"
        cells[(_trace_name(p["trace"]), p["router"], p["speedup"])][side] = row
    out = [
        "| trace | router | arrivals | local reuse | global reuse | global / local | paper | within 15% | "
        "local TTFT ms | global TTFT ms |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for (trace, router, speedup), sides in sorted(cells.items()):
        if set(sides) != {"local", "global"}:
            continue
        local, glob = sides["local"]["total"], sides["global"]["total"]
        ratio = glob["reuse_ratio"] / local["reuse_ratio"] if local["reuse_ratio"] else float("inf")
        paper = PAPER_FIG10[trace]
        out.append(
            f"| {trace} | {router} | {speedup:g}x | {local['reuse_ratio']:.4f} | {glob['reuse_ratio']:.4f} | {ratio:.2f}x | "
            f"{paper:.2f}x | {'yes' if abs(ratio / paper - 1) <= 0.15 else 'no'} | {local['ttft_ms_mean']:.0f} | "
            f"{glob['ttft_ms_mean']:.0f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="tiers.jsonl")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--models", nargs="+", default=["llama-3.1-8b", "gemma-3-27b"])
    parser.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--memory", type=_bytes, default=_bytes("24GiB"))
    parser.add_argument("--router", default="exact")
    parser.add_argument("--fig10-routers", nargs="+", default=FIG10_ROUTERS)
    parser.add_argument("--fig10-speedups", nargs="*", type=float, default=[2.0, 4.0, 6.0, 8.0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--fig10-only", action="store_true")
    which.add_argument("--no-fig10", action="store_true")
    parser.add_argument(
        "--dynosim-python",
        default=None,
        help="a Python with ai-dynamo 1.4.2: adds DynoSim's single-cache reuse beside kvspec's (Fig. 10)",
    )
    args = parser.parse_args(argv)
    if args.dynosim_python and args.no_fig10:
        parser.error("--dynosim-python adds DynoSim to the Fig. 10 tables; it cannot go with --no-fig10")

    points = [] if args.fig10_only else host_sweep_points(args)
    if not args.no_fig10:
        points += fig10_points(args) + single_cache_points(args)

    def note(row: dict[str, Any]) -> None:
        p, t = row["point"], row["total"]
        print(
            f"{p['model']} {_trace_name(p['trace'])} {p['num_instances']}x {p['router']} host "
            f"{p.get('host_memory', 0) / 2**30:,.0f}GiB pool {p.get('shared_pool', 0) / 2**30:,.0f}GiB: reuse "
            f"{t['reuse_ratio']} TTFT {t['ttft_ms_mean']} ({row['wall_seconds']} s)",
            file=sys.stderr,
            flush=True,
        )

    rows = sweep_rows(points, out=args.out, workers=args.workers, on_row=note)
    if not args.fig10_only:
        print(host_tables(rows))
    if not args.no_fig10:
        print(fig10_table(rows))
        dynosim = dynosim_single_cache(args.dynosim_python, args.limit) if args.dynosim_python else {}
        print(single_cache_table(rows, dynosim))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
