"""Fleet and replay speed, in one run: kvspec's fleet beside DynoSim's, and each eviction policy's replay
beside LRU's.

    python -m benchmarks.fleet_speed [--dynosim-python PY] [--instances 8] [--router precise_prefix]
        [--policy-model gemma-3-27b] [--policy-limit 3000] [--policy-rounds 5]

1. The whole Mooncake conversation trace on ``--instances`` instances (Llama 3.1 8B at 64-token blocks,
   16,384 blocks each, DynoSim's step time) with ``--router``, this checkout's build (pure or compiled:
   the report says which), against DynoSim's ``kv_router`` on the same trace and settings: wall seconds of
   each, and the ratio.
2. A pure cache replay of the conversation trace's first ``--policy-limit`` requests through
   ``--policy-model`` at a tenth of what an unlimited replay keeps (eviction at work), under LRU, LFU, SLRU
   and the hybrid policy: wall seconds and each policy's ratio to LRU's, alternating, median of
   ``--policy-rounds`` (5); each replay starts after a full garbage collection.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from benchmarks.dynosim import TRACES, run_dynosim


def fleet_speed(args: argparse.Namespace) -> None:
    from kvspec.build_info import build_info
    from kvspec.fleet.sweep import SweepPoint, run_point

    point = SweepPoint(
        model="llama-3.1-8b",
        trace=TRACES["conversation"],
        num_instances=args.instances,
        router=args.router,
        num_blocks=16384,
        block_size=64,
        step_time="dynosim",
    )
    start = time.perf_counter()
    row = run_point(point)
    mine = time.perf_counter() - start
    print(
        f"kvspec ({build_info().build} build), {args.instances} instances, {args.router}: {mine:.1f} s wall "
        f"({row['wall_seconds']:.1f} s in the fleet loop), reuse {row['total']['reuse_ratio']}"
    )
    if args.dynosim_python:
        theirs = run_dynosim(args.dynosim_python, TRACES["conversation"], args.instances, 16384, "kv_router")
        print(f"DynoSim kv_router: {theirs['wall_s']:.1f} s wall, reuse {theirs['reuse']:.4f}")
        print(f"kvspec / DynoSim wall: {mine / theirs['wall_s']:.2f}")


def policy_speed(args: argparse.Namespace) -> None:
    import dataclasses

    from kvspec.contracts.spec import SchedulerLimits
    from kvspec.engine.replay import (
        TraceClock,
        blocks_retained,
        blocks_to_hold_every_prompt,
        replay_cache,
        replay_coordinator,
    )
    from kvspec.engine.traces import read_trace
    from kvspec.models import build_model_layout
    from kvspec.planning import get_kv_cache_config

    layout = build_model_layout(
        args.policy_model, block_size=16, max_model_len=None, mamba_cache_mode="align"
    )
    limits = SchedulerLimits(
        max_model_len=layout.max_model_len, max_num_batched_tokens=8192, mamba_cache_mode="align"
    )
    trace = list(
        read_trace(TRACES["conversation"], limit=args.policy_limit, max_prompt_tokens=layout.max_model_len)
    )
    config = get_kv_cache_config(layout.layer_specs, 1 << 50, limits)
    sizes = [g.kv_cache_spec.block_size for g in config.kv_cache_groups]
    unlimited = dataclasses.replace(config, num_blocks=blocks_to_hold_every_prompt(trace, sizes))
    top = blocks_retained(trace, unlimited, limits, chunk_tokens=8192)
    small = dataclasses.replace(config, num_blocks=max(2, top // 10) + 1)
    times: dict[str, list[float]] = {p: [] for p in ("lru", "lfu", "slru", "hybrid")}
    hits: dict[str, int] = {}
    for _ in range(args.policy_rounds):
        for policy in times:
            clock = TraceClock()
            coordinator = replay_coordinator(small, limits, eviction_policy=policy, clock=clock)
            # The previous replay's garbage is collected now, not inside this one's timing: a full
            # collection over a replay's blocks costs up to a second and otherwise lands on whichever
            # policy runs next.
            gc.collect()
            start = time.perf_counter()
            stats = replay_cache(trace, coordinator, chunk_tokens=8192, clock=clock)
            times[policy].append(time.perf_counter() - start)
            hits[policy] = stats.hit_tokens
    base = statistics.median(times["lru"])
    print(
        f"{args.policy_model}, conversation trace's first {len(trace)} requests, {small.num_blocks - 1} blocks:"
    )
    for policy, values in times.items():
        median = statistics.median(values)
        print(f"  {policy:>7}: {median:6.2f} s  ({median / base:.2f}x LRU)  hit tokens {hits[policy]:,}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dynosim-python", default=None)
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--router", default="precise_prefix")
    parser.add_argument("--policy-model", default="gemma-3-27b")
    parser.add_argument("--policy-limit", type=int, default=3000)
    parser.add_argument("--policy-rounds", type=int, default=5)
    parser.add_argument("--only", choices=("fleet", "policies"), default=None)
    args = parser.parse_args(argv)
    if args.only != "policies":
        fleet_speed(args)
    if args.only != "fleet":
        policy_speed(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
