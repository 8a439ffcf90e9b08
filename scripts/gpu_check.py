"""CUDA check of the device path: pinned block-table copies, slot mapping, and the end-to-end test.

Run on a machine with a GPU: ``bash scripts/gpu_check.sh``. Exits non-zero on any mismatch. CI never
runs it (CI has no GPU).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from kvspec.device import BlockTable, get_backend
from kvspec.engine import TINY_FULL, TINY_HYBRID, Engine, TinyDecoder, make_workload


def check(name: str, ok: bool) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}", flush=True)
    return ok


def main() -> int:
    if not torch.cuda.is_available():
        print("FAIL no CUDA device")
        return 1
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    ok = True
    backend = get_backend("cuda")
    ok &= check("backend pins host memory", backend.pin_memory)
    table = BlockTable(
        block_size=16,
        max_num_reqs=256,
        max_num_blocks_per_req=128,
        max_num_batched_tokens=8192,
        device="cuda",
    )
    ok &= check("host staging buffer is pinned", table.block_table.cpu.is_pinned())
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 100_000, size=(256, 128))
    for r in range(256):
        table.add_row(rows[r], r)
    dev = table.commit_block_table(256)
    torch.cuda.synchronize()
    ok &= check("block table copy", bool(torch.equal(dev.cpu(), torch.from_numpy(rows.astype(np.int32)))))
    req = rng.integers(0, 256, size=8192)
    pos = rng.integers(0, 128 * 16, size=8192)
    slots = table.compute_slot_mapping(req, pos)
    dev_slots = table.commit_slot_mapping()
    torch.cuda.synchronize()
    expected = rows[req, pos // 16] * 16 + pos % 16
    ok &= check("slot mapping (host)", bool((slots == expected).all()))
    ok &= check("slot mapping (device)", bool((dev_slots.cpu().numpy()[:8192] == expected).all()))
    for cfg, label in ((TINY_FULL, "full"), (TINY_HYBRID, "hybrid")):
        work = make_workload(
            "shared-prefix", num_requests=10, prompt_len=56, max_tokens=8, vocab_size=cfg.vocab_size, seed=3
        )
        prompts = [w.prompt for w in work]
        reference = [TinyDecoder(cfg, "cuda").generate_contiguous(p, 8) for p in prompts]
        for caching in (True, False):
            start = time.perf_counter()
            engine = Engine.tiny(
                cfg,
                num_blocks=200,
                enable_caching=caching,
                max_num_batched_tokens=48,
                max_num_seqs=6,
                device="cuda",
            )
            ids = [engine.add_request(p, 8) for p in prompts]
            outputs = engine.run()
            same = [outputs[i] for i in ids] == reference
            ok &= check(
                f"end-to-end {label} caching={caching}: paged == contiguous on cuda "
                f"(hit rate {engine.stats.hit_rate:.2f}, {time.perf_counter() - start:.2f}s)",
                same,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
