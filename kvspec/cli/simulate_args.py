"""The ``kvspec simulate`` command line: its parser, in three groups of options (the synthetic workload,
the cache and engine, the trace replay). Light at import: ``kvspec --help`` builds it without torch."""

from __future__ import annotations

import argparse
from typing import Any

from kvspec.cli.args import block_size, bounded_int, parse_bytes
from kvspec.cli.args import positive_int as _positive
from kvspec.cli.plugins import add_plugin_options
from kvspec.cli.simulate import MAX_REQUESTS, cmd_simulate
from kvspec.cli.tiers import add_tier_options
from kvspec.contracts.release import DEFAULT_BLOCK_SIZE
from kvspec.engine.workloads import WORKLOADS


def _retention_interval(text: str) -> int | str:
    """argparse type for --retention-interval: tokens >= 0, 'dense' or 'planned' (what the release plans)."""
    if text in ("planned", "dense"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a retention interval: give tokens (e.g. 0 or 1024) or 'dense'"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"retention interval {value} is negative: give tokens >= 0 or 'dense'"
        )
    return value


def add_simulate_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate",
        help="run a synthetic workload through the coordinator (tiny torch model, or bookkeeping for a preset)",
    )
    p.add_argument(
        "model",
        nargs="?",
        default="tiny-hybrid",
        help="tiny-full or tiny-hybrid (a real paged-attention model), or a preset/config.json (bookkeeping only)",
    )
    _add_workload_options(p)
    _add_cache_options(p)
    _add_trace_options(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", metavar="PNG", default=None, help="draw block usage and hit rate over time")
    add_tier_options(p, sweep=False)
    add_plugin_options(p)
    p.set_defaults(func=cmd_simulate)


def _add_workload_options(p: argparse.ArgumentParser) -> None:
    """The synthetic workload's options (a --trace replay takes these from the trace)."""
    p.add_argument(
        "--requests",
        type=bounded_int(MAX_REQUESTS, "--requests"),
        default=None,
        help=f"number of requests of the synthetic workload (default 32, at most {MAX_REQUESTS:,})",
    )
    p.add_argument(
        "--workload", choices=WORKLOADS, default=None, help="the synthetic workload (default shared-prefix)"
    )
    p.add_argument("--device", default=None, help="cpu, cuda or npu (tiny models only; default cpu)")
    p.add_argument(
        "--prompt-len",
        type=bounded_int(1 << 20, "--prompt-len"),
        default=None,
        help="prompt tokens (default 96 tiny, 2048 preset)",
    )
    p.add_argument(
        "--max-tokens",
        type=bounded_int(1 << 20, "--max-tokens"),
        default=None,
        help="tokens to generate per request of the synthetic workload (default 16)",
    )


def _add_cache_options(p: argparse.ArgumentParser) -> None:
    """The cache's and the engine's options (and the synthetic workload's seed, listed with them)."""
    p.add_argument(
        "--num-blocks",
        type=bounded_int(1 << 20, "--num-blocks"),
        default=None,
        help="KV cache blocks (tiny models, default 256; or a --trace replay's cache)",
    )
    p.add_argument(
        "--memory",
        type=parse_bytes,
        default=None,
        help="KV cache memory (presets; default 8GiB, with --trace room for every prompt)",
    )
    p.add_argument(
        "--max-model-len",
        type=_positive,
        default=None,
        help="tokens per request (presets; default 8192 for the synthetic workload, the model's context length "
        "for --trace)",
    )
    p.add_argument("--max-num-batched-tokens", type=_positive, default=None, help="tokens per step")
    p.add_argument("--max-num-seqs", type=_positive, default=None, help="running requests at most")
    p.add_argument(
        "--block-size", type=block_size, default=None, help=f"tokens per block (default {DEFAULT_BLOCK_SIZE})"
    )
    p.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    p.add_argument(
        "--assume-dense",
        action="store_true",
        help="plan a config.json of a model_type kvspec does not know as a dense decoder",
    )
    p.add_argument("--seed", type=int, default=None, help="the synthetic workload's seed (default 0)")


def _add_trace_options(p: argparse.ArgumentParser) -> None:
    """The options of a --trace replay."""
    p.add_argument(
        "--trace",
        metavar="FILE",
        default=None,
        help="replay a request trace (Mooncake or kvspec JSONL) instead of a synthetic workload: each request "
        "in arrival order, alone, through the coordinator (a pure cache replay) for a preset/config; the "
        "cache holds every prompt unless --num-blocks or --memory says otherwise",
    )
    p.add_argument("--limit", type=_positive, default=None, help="replay only the trace's first N requests")
    p.add_argument(
        "--sweep",
        type=bounded_int(32, "--sweep"),
        default=None,
        metavar="N",
        help="with --trace: replay at N cache sizes, log-spaced from a tenth of what an unlimited cache keeps "
        "of the trace (plus room for its longest prompt) to all of it, and print the hit rate at each (--plot "
        "draws it against KV memory)",
    )
    p.add_argument(
        "--policy",
        metavar="NAMES",
        default=None,
        help="with --trace: eviction policies to compare, comma-separated (lru = vLLM's order, the default; "
        "lfu, slru, retention, hybrid, or a plugin's); each replays at every size",
    )
    p.add_argument(
        "--retention-interval",
        type=_retention_interval,
        default=None,
        metavar="TOKENS|dense",
        help="with --trace: prefix-cache retention of sliding-window and Mamba groups: tokens (a multiple of "
        "the block size; 0 keeps only the blocks at replay boundaries and shared-prefix junctions), or "
        "dense (cache every block, vLLM 0.23); default: what vLLM 0.34 plans, 0",
    )
    p.add_argument(
        "--per-group",
        action="store_true",
        help="with --trace (a hybrid, pure replay): each KV-cache group's own hit rate and the group that "
        "limits the hit (one more search per request)",
    )
    p.add_argument(
        "--timed",
        action="store_true",
        help="with --trace: a timed replay instead of the pure one: arrivals at the trace's timestamps, "
        "kvspec's scheduler (chunked prefill, decode, preemption) on a simulated clock; reports hit rate, "
        "time to first token, latency and preemptions",
    )
    p.add_argument(
        "--step-time",
        metavar="BASE,PER_TOKEN,PER_REQUEST",
        default=None,
        help="with --timed: the step-time model in milliseconds: a fixed cost per step, per computed token "
        "and per request in the batch (default 6,0.06,0.01: illustrative, an 8B model on one GPU), or dynosim (Dynamo mocker's polynomial)",
    )
    p.add_argument(
        "--workers",
        type=_positive,
        default=None,
        help="with --trace: replays at once in a process pool when several run (--sweep, --policy a,b); "
        "default one per core",
    )


__all__ = ["add_simulate_parser"]
