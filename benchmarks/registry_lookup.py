"""Cost of a cached registry lookup against a plain dict lookup, measured in the same run.

Run: ``python -m benchmarks.registry_lookup``. Prints ns per lookup (best of several interleaved rounds)
and the ratios; the target is <= 2x a plain dict lookup for the cached hot path.
"""

from __future__ import annotations

import os
import timeit

os.environ.setdefault("KVSPEC_TYPECHECK", "api")

import torch

from kvspec import FullAttentionManager, FullAttentionSpec, default_registry


def main(number: int = 2_000_000, rounds: int = 7) -> dict[str, float]:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    plain: dict[type, type] = {FullAttentionSpec: FullAttentionManager}
    managers = default_registry.manager_classes
    get = default_registry.get_manager_class
    assert managers[type(spec)] is get(spec) is plain[type(spec)]
    cases = {
        "plain dict[type(spec)]": lambda: plain[type(spec)],
        "registry.manager_classes[type(spec)]": lambda: managers[type(spec)],
        "registry.get_manager_class(spec)": lambda: get(spec),
    }
    best = {name: float("inf") for name in cases}
    for _ in range(rounds):  # interleave the cases so machine noise hits all of them alike
        for name, fn in cases.items():
            t = timeit.timeit(fn, number=number) / number * 1e9
            best[name] = min(best[name], t)
    base = best["plain dict[type(spec)]"]
    for name, ns in best.items():
        print(f"{name:40s} {ns:7.1f} ns   ratio {ns / base:4.2f}x")
    return best


if __name__ == "__main__":
    main()
