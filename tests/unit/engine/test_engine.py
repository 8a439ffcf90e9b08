"""End to end: what kvspec manages is what attention reads. Greedy outputs of the tiny paged model equal
a contiguous (cache-free) computation, with prefix caching on and off, for full and hybrid models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec import SchedulingError
from kvspec.engine import TINY_FULL, TINY_HYBRID, Engine, TinyDecoder, TinyModelConfig, make_workload


def run(
    cfg: TinyModelConfig, prompts: list[list[int]], max_tokens: int, *, caching: bool, num_blocks: int
) -> tuple[list[list[int]], Engine]:
    # 16-token blocks: prompts of 56-90 tokens then span several blocks, and small pools preempt.
    engine = Engine.tiny(
        cfg,
        num_blocks=num_blocks,
        block_size=16,
        enable_caching=caching,
        max_num_batched_tokens=48,
        max_num_seqs=6,
    )
    ids = [engine.add_request(p, max_tokens) for p in prompts]
    outputs = engine.run()
    engine.coordinator.check_invariants()
    assert engine.coordinator.num_free_blocks == engine.coordinator.block_pool.num_gpu_blocks - 1
    return [outputs[i] for i in ids], engine


@pytest.mark.parametrize("cfg", [TINY_FULL, TINY_HYBRID], ids=["full", "hybrid"])
def test_paged_equals_contiguous_with_and_without_prefix_caching(cfg: TinyModelConfig) -> None:
    work = make_workload(
        "shared-prefix", num_requests=10, prompt_len=56, max_tokens=8, vocab_size=cfg.vocab_size, seed=3
    )
    prompts = [w.prompt for w in work]
    reference = [TinyDecoder(cfg).generate_contiguous(p, 8) for p in prompts]
    cached, engine_on = run(cfg, prompts, 8, caching=True, num_blocks=200)
    uncached, engine_off = run(cfg, prompts, 8, caching=False, num_blocks=200)
    assert cached == uncached == reference
    assert engine_on.stats.hit_rate > 0.3  # the shared prefixes really were served from the cache
    assert engine_off.stats.hit_rate == 0


@pytest.mark.parametrize(("cfg", "num_blocks"), [(TINY_FULL, 16), (TINY_HYBRID, 20)], ids=["full", "hybrid"])
def test_preemption_keeps_outputs_exact(cfg: TinyModelConfig, num_blocks: int) -> None:
    work = make_workload(
        "random", num_requests=8, prompt_len=60, max_tokens=24, vocab_size=cfg.vocab_size, seed=5
    )
    prompts = [w.prompt for w in work]
    outputs, engine = run(cfg, prompts, 24, caching=True, num_blocks=num_blocks)
    assert engine.stats.preemptions > 0  # the pool is too small for the batch: requests were recomputed
    assert outputs == [TinyDecoder(cfg).generate_contiguous(p, 24) for p in prompts]


def test_chunked_prefill_longer_than_window() -> None:
    cfg = TinyModelConfig(layer_kinds=("sliding", "full"), sliding_window=8)
    prompt = list(range(1, 90))
    outputs, _ = run(cfg, [prompt, prompt[:70]], 6, caching=True, num_blocks=40)
    model = TinyDecoder(cfg)
    assert outputs == [model.generate_contiguous(prompt, 6), model.generate_contiguous(prompt[:70], 6)]


def test_engine_rejects_impossible_prompt() -> None:
    engine = Engine.tiny(TINY_FULL, num_blocks=3, block_size=16, max_num_batched_tokens=64)
    engine.add_request(list(range(80)), 2)
    with pytest.raises(SchedulingError, match="'0' can never be admitted"):
        engine.run()


def test_simulate_command(tmp_path: Path) -> None:
    png = tmp_path / "sim.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvspec.cli.main",
            "simulate",
            "tiny-hybrid",
            "--requests",
            "12",
            "--workload",
            "chat",
            "--json",
            "--plot",
            str(png),
            "--num-blocks",
            "96",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["requests"] == 12 and report["generated_tokens"] == 12 * 16
    assert 0 < report["prefix_cache_hit_rate"] < 1 and report["peak_block_usage"] <= 1
    assert report["scheduler_cpu_us_per_step_median"] > 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    big = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvspec.cli.main",
            "simulate",
            "llama-3.1-8b",
            "--requests",
            "20",
            "--memory",
            "2GiB",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert big.returncode == 0, big.stderr
    data = json.loads(big.stdout)
    assert data["requests"] == 20 and data["prefix_cache_hit_rate"] > 0.5
    bad = subprocess.run(
        [sys.executable, "-m", "kvspec.cli.main", "simulate", "no-such-model"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "Unknown model" in bad.stderr


def test_attention_window_matches_what_the_manager_frees() -> None:
    """The first key a query at position n can see is exactly the first token the sliding-window
    manager keeps: a mismatch would read freed (possibly reused) blocks."""
    import torch

    from kvspec import BlockPool, ManagerContext, SlidingWindowManager

    cfg = TinyModelConfig(
        layer_kinds=("sliding",), sliding_window=24, num_heads=1, num_kv_heads=1, head_dim=1
    )
    model = TinyDecoder(cfg)
    spec = cfg.kv_cache_specs(16)["layers.0"]
    manager = SlidingWindowManager(ManagerContext.for_spec(spec, BlockPool(4)))
    for n in range(0, 100, 7):
        q = torch.ones(1, 1, 1, dtype=cfg.dtype)
        kv = torch.arange(n + 1, dtype=cfg.dtype).view(-1, 1, 1)
        # values = key positions and uniform scores: the output is the mean of the visible positions
        out = model._attend(q, torch.zeros_like(kv), kv, torch.tensor([n]), cfg.sliding_window)
        first_visible = manager.get_num_skipped_tokens(n)
        assert float(out) == pytest.approx(sum(range(first_visible, n + 1)) / (n + 1 - first_visible))
