"""vllm-ascend 0.23.0's plugin on vLLM 0.23.0's own KV cache manager and on kvspec, call for call.

The plugin is loaded from its wheel (``tests/vllm_ascend/platform.py``) and registers its specs in vLLM's
registry from the platform hook, unchanged. Each workload is tests/vllm/differential.py's, drawn over layouts
of the plugin's specs: ``AscendMLAAttentionSpec`` without compression (``ascend_mla``) and with
``compress_ratio`` 4 (``ascend_mla_c4``, run by the plugin's ``CompressAttentionManager`` in both), and
``AscendSlidingWindowMLASpec`` (``ascend_swmla``, vLLM's ``SlidingWindowManager``), alone, together, and beside
vLLM's built-in full and sliding-window attention. vLLM's ``KVCacheManager`` and kvspec's adapter (which
adopts the plugin's registrations: ``kvspec.integrations.vllm_adoption``) are driven in lockstep as vLLM's
Scheduler drives its manager; hit lengths, block ids, free blocks, block tables, events and stats are compared
after every call.

``python -m tests.vllm_ascend.differential --workloads 40`` (in ``nox -s vllm_ascend``'s environment) runs
that many workloads per Ascend spec shape and exits 1 on any divergence.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from tests.vllm import differential as diff
from tests.vllm_ascend import platform

#: The plugin's spec shapes, each a differential family.
SHAPES = ("ascend_mla", "ascend_mla_c4", "ascend_swmla")
CACHE = Path(__file__).resolve().parents[2] / ".vllm-ascend-cache"


def spec_makers(specs: ModuleType) -> dict[str, diff.SpecMaker]:
    import torch

    mla = dict(num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    return {
        "ascend_mla": lambda block_size, rng: specs.AscendMLAAttentionSpec(block_size=block_size, **mla),
        "ascend_mla_c4": lambda block_size, rng: specs.AscendMLAAttentionSpec(
            block_size=block_size, compress_ratio=4, **mla
        ),
        "ascend_swmla": lambda block_size, rng: specs.AscendSlidingWindowMLASpec(
            block_size=block_size, sliding_window=rng.choice((16, 48, 128)), **mla
        ),
    }


def layout_for(shape: str) -> Callable[[random.Random], tuple[str, ...]]:
    """Layouts that include ``shape``: alone, beside another Ascend shape, or beside vLLM's built-ins."""

    def draw(rng: random.Random) -> tuple[str, ...]:
        kind = rng.random()
        if kind < 0.35:
            return (shape,)
        if kind < 0.7:
            return (shape, rng.choice(tuple(s for s in SHAPES if s != shape)))
        return (shape, rng.choice(("full", "sliding_window")))

    return draw


def run(workloads_per_shape: int, first_seed: int = 0, verbose: bool = False) -> list[diff.Outcome]:
    specs, _ = platform.load(CACHE)
    makers = spec_makers(specs)
    outcomes: list[diff.Outcome] = []
    for index, shape in enumerate(SHAPES):
        for seed in range(first_seed, first_seed + workloads_per_shape):
            workload = diff.draw_workload(
                seed * len(SHAPES) + index, layout=layout_for(shape), extra_specs=makers
            )
            outcomes.append(diff.run_workload(workload, verbose))
    return outcomes


def summary(outcomes: list[diff.Outcome]) -> str:
    shapes: Counter[str] = Counter()
    for o in outcomes:
        shapes.update(set(o.families) & set(SHAPES))
    diverged = [o for o in outcomes if o.divergence or o.stalled]
    lines = [
        f"{len(outcomes)} workloads, {sum(o.steps for o in outcomes)} steps, {sum(o.calls for o in outcomes)} "
        f"comparisons, {sum(o.preemptions for o in outcomes)} preemptions, {sum(o.hit_tokens for o in outcomes)} "
        f"hit tokens, {sum(o.refused is not None for o in outcomes)} refused by both; {len(diverged)} divergences",
        "workloads per Ascend spec shape: " + ", ".join(f"{s} {shapes[s]}" for s in SHAPES),
    ]
    lines += [f"seed {o.seed} {o.families}: {o.divergence or 'stalled'}" for o in diverged[:10]]
    lines += [f"seed {o.seed} {o.families}: refused by both: {o.refused}" for o in outcomes if o.refused][:5]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workloads", type=int, default=40, help="workloads per Ascend spec shape")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    diff.quiet_logs()
    start = time.perf_counter()
    outcomes = run(args.workloads, args.seed, args.verbose)
    print(summary(outcomes))
    print(f"{time.perf_counter() - start:.0f} s")
    return 1 if any(o.divergence or o.stalled for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
