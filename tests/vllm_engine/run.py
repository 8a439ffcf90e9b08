"""Run one model's engine comparison and write what it found (one process per model: vLLM keeps
process-wide state, so each engine gets its own).

    python -m tests.vllm_engine.run --model llama-tiny --out DIR [--throughput N --rounds R]

writes ``DIR/<model>.json``: per manager (stock, kvspec, the two broken kvspecs) the run's summary (requests,
generated tokens, steps, preemptions, hit tokens), where it first differs from stock (None: identical
block ids every step and identical tokens) and the requests whose tokens differ; and
``DIR/<model>-<manager>-steps.jsonl``, every step's scheduled requests with their block ids, for stock and
kvspec. With ``--throughput N`` it also replays N requests ``R`` times on stock and on kvspec alternately
and reports engine steps per second and the time spent in the KV cache manager per step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from tests.vllm_engine.checkpoints import MODELS
from tests.vllm_engine.harness import (
    AS_BUILT,
    MANAGERS,
    NO_PREFIX_CACHING,
    Engine,
    correctness_workload,
    first_difference,
    throughput_workload,
    tokens_differ,
)


def compare(engine: Engine, out: Path) -> dict[str, Any]:
    workload = correctness_workload()
    runs = {kind: engine.run(kind, workload) for kind in MANAGERS}
    stock = runs["stock"]
    result: dict[str, Any] = {
        "model": engine.model.name,
        "description": engine.model.description,
        "prefix_caching": engine.model.name not in NO_PREFIX_CACHING,
        "no_prefix_caching_reason": NO_PREFIX_CACHING.get(engine.model.name),
        "kv_cache_groups": [type(g.kv_cache_spec).__name__ for g in engine.kv_cache_config.kv_cache_groups],
        "num_blocks": engine.kv_cache_config.num_blocks,
        "runs": {},
    }
    for kind, run in runs.items():
        result["runs"][kind] = {
            **run.summary(),
            "first_difference": None if kind == "stock" else first_difference(stock, run),
            "requests_with_other_tokens": [] if kind == "stock" else tokens_differ(stock, run),
        }
    for kind in ("stock", "kvspec"):
        with (out / f"{engine.model.name}-{kind}-steps.jsonl").open("w") as f:
            for index, step in enumerate(runs[kind].steps):
                f.write(json.dumps({"step": index, **dataclasses.asdict(step)}) + "\n")
    return result


def throughput(engine: Engine, num_requests: int, rounds: int) -> dict[str, Any]:
    """Stock and kvspec alternately, ``rounds`` times each; the per-round figures and their means."""
    workload = throughput_workload(num_requests)
    per_round: dict[str, list[dict[str, float]]] = {"stock": [], "kvspec": []}
    for _ in range(rounds):
        for kind in ("stock", "kvspec"):
            run = engine.run(kind, workload)
            steps = len(run.steps)
            per_round[kind].append(
                {
                    "steps": steps,
                    "steps_per_second": steps / run.step_seconds,
                    "kv_manager_ms_per_step": 1000 * run.kv_manager_seconds / steps,
                    "kv_manager_share": run.kv_manager_seconds / run.step_seconds,
                }
            )
    means = {
        kind: {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}
        for kind, rows in per_round.items()
    }
    return {
        "requests": num_requests,
        "rounds": rounds,
        "per_round": per_round,
        "mean": means,
        "kv_manager_time_ratio": means["kvspec"]["kv_manager_ms_per_step"]
        / means["stock"]["kv_manager_ms_per_step"],
        "steps_per_second_ratio": means["kvspec"]["steps_per_second"] / means["stock"]["steps_per_second"],
    }


def installed(model: str, out: Path) -> dict[str, Any]:
    """``kvspec.integrations.vllm_kv_cache_manager.install()`` before the engine is built, as a user would:
    vLLM's own Scheduler constructs kvspec's adapter, and the workload runs on it unswapped."""
    from kvspec.integrations.vllm_kv_cache_manager import VllmKVCacheManager, install, uninstall

    install()
    try:
        engine = Engine(MODELS[model], out)
    finally:
        uninstall()
    manager = engine.scheduler.kv_cache_manager
    assert isinstance(manager, VllmKVCacheManager), type(manager)
    run = engine.run(AS_BUILT, correctness_workload())
    # The engine's capturing subclass sits on top; name the kvspec class vLLM built.
    adapter = next(c for c in type(manager).__mro__ if c.__module__.startswith("kvspec."))
    return {"model": model, "manager_class": adapter.__name__, **run.summary()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--out", type=Path, required=True, help="folder for the results and checkpoints")
    parser.add_argument("--throughput", type=int, default=0, help="also time N requests (0: skip)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-compare", action="store_true", help="only the throughput figures")
    parser.add_argument(
        "--installed", action="store_true", help="only a run on the adapter vLLM builds after install()"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.installed:
        found = installed(args.model, args.out)
        (args.out / f"{args.model}-installed.json").write_text(json.dumps(found, indent=2) + "\n")
        print(json.dumps(found, indent=2))
        return 0
    engine = Engine(MODELS[args.model], args.out)
    result: dict[str, Any] = {"model": args.model}
    if not args.skip_compare:
        result = compare(engine, args.out)
    if args.throughput:
        result["throughput"] = throughput(engine, args.throughput, args.rounds)
    suffix = "-throughput" if args.skip_compare else ""
    (args.out / f"{args.model}{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
