"""compute_slot_mapping + commit for 256 requests x 2,048 tokens against a plain-Python loop.

Run: ``python -m benchmarks.slot_mapping``. Both run in the same process, interleaved; medians reported.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from kvspec.device import BlockTable

NUM_REQS, TOKENS, BLOCK = 256, 2048, 16


def main(rounds: int = 5) -> dict[str, float]:
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 1 << 20, size=(NUM_REQS, TOKENS // BLOCK))
    table = BlockTable(
        block_size=BLOCK,
        max_num_reqs=NUM_REQS,
        max_num_blocks_per_req=TOKENS // BLOCK,
        max_num_batched_tokens=NUM_REQS * TOKENS,
    )
    for r in range(NUM_REQS):
        table.add_row(rows[r], r)
    req = np.repeat(np.arange(NUM_REQS, dtype=np.int64), TOKENS)
    pos = np.tile(np.arange(TOKENS, dtype=np.int64), NUM_REQS)
    py_rows = rows.tolist()

    def kvspec_step() -> torch.Tensor:
        table.compute_slot_mapping(req, pos)
        table.commit_block_table(NUM_REQS)
        return table.commit_slot_mapping(NUM_REQS * TOKENS)

    def python_step() -> torch.Tensor:
        slots = []
        for r in range(NUM_REQS):
            row = py_rows[r]
            for p in range(TOKENS):
                slots.append(row[p // BLOCK] * BLOCK + p % BLOCK)
        return torch.tensor(slots, dtype=torch.int64)

    assert torch.equal(kvspec_step(), python_step())
    times: dict[str, list[float]] = {"kvspec": [], "python": []}
    for _ in range(rounds):
        for name, fn in (("kvspec", kvspec_step), ("python", python_step)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"slot mapping + commit, {NUM_REQS} requests x {TOKENS} tokens ({NUM_REQS * TOKENS:,} slots)")
    print(f"  kvspec (numpy, one copy)  {med['kvspec'] * 1e3:8.2f} ms")
    print(f"  plain Python loop         {med['python'] * 1e3:8.2f} ms")
    print(
        f"  ratio kvspec / python     {med['kvspec'] / med['python']:.4f}  ({med['python'] / med['kvspec']:.0f}x faster)"
    )
    return med


if __name__ == "__main__":
    main()
