"""vLLM 0.23.0's real ``Scheduler`` with its own KVCacheManager vs kvspec's adapter, on one workload.

Both runs drive the same scheduler loop (schedule -> a fake model output of one token per running request
-> update_from_output) over 256 requests: shared prefixes (prefix-cache hits), a block budget small enough
to force preemptions, prefill chunks. Every step's ``SchedulerOutput`` is reduced to what the KV cache
decides (request ids, block ids, scheduled tokens, computed tokens, preemptions, common prefix blocks) and
the two runs must agree step for step. The per-step time ratio kvspec / stock is reported (median of the
interleaved rounds).

Run in the ``bench`` or ``vllm`` nox session (vLLM installed): ``python -m benchmarks.vllm_scheduler_loop``.
The model config comes from the offline hub cache ``tests/vllm_suite`` writes (no network here).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODEL = "facebook/opt-125m"
_RUNNER_OUTPUT_HAS_INDEX = True


def _setup_offline_hub() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "vllm_suite"))
    from run_suite import write_hf_cache  # type: ignore[import-not-found]

    hub = Path(tempfile.mkdtemp(prefix="kvspec-hub-"))
    write_hf_cache(hub)
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_CACHE=str(hub))


def vllm_034_planner(block_size: int, max_model_len: int, mamba_cache_mode: str) -> tuple[Any, Any]:
    """vLLM 0.34's ``kv_cache_planning`` module and a ``VllmConfig`` to plan with: ``block_size`` tokens,
    ``mamba_cache_mode``, the layer-major tensor layout, the hybrid KV cache manager on (vLLM turns it off for
    a model config that does not need it; the layers planned are the caller's, not that model's). vLLM's CPU
    platform with its triton-cpu check lifted, as the suite's runs set it (no device here); the model config
    (vLLM 0.34 tests' default model) is read from the offline cache ``_setup_offline_hub`` writes."""
    sys.path.insert(0, str(ROOT / "tests" / "vllm_suite"))
    import stock_conftest  # type: ignore[import-not-found]  # noqa: F401  (vLLM's CPU platform)
    import vllm.v1.core.kv_cache_planning as planning
    from vllm.config import ModelConfig, VllmConfig

    config = VllmConfig(model_config=ModelConfig(max_model_len=max_model_len))
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    config.cache_config.block_size = block_size
    config.cache_config.mamba_cache_mode = mamba_cache_mode
    config.cache_config.kv_cache_layout = "LBNHC"
    return planning, config


def make_scheduler(num_blocks: int, block_size: int, budget: int, max_seqs: int, layout: str = "full") -> Any:
    """vLLM's Scheduler over one full-attention group, or (``layout="mamba-align"``) over full attention,
    a 128-token sliding window and a Mamba group in "align" mode (the Scheduler then cuts prefill chunks at
    block boundaries, ``_mamba_block_aligned_split``)."""
    import torch
    import vllm.platforms as platforms
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    platforms._current_platform = CpuPlatform()  # the CUDA wheel finds no device here
    model_config = ModelConfig(model=MODEL, dtype="float16", seed=0, max_model_len=2048)
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        max_model_len=2048,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    mamba = layout == "mamba-align"
    cache_config = CacheConfig(
        block_size=block_size, enable_prefix_caching=True, mamba_cache_mode="align" if mamba else "none"
    )
    cache_config.num_gpu_blocks = num_blocks
    vllm_config = VllmConfig(
        model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config
    )
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=64, dtype=torch.float16)
    groups = [KVCacheGroupSpec(["layer.0"], spec)]
    if mamba:
        window = SlidingWindowSpec(
            block_size=block_size, num_kv_heads=8, head_size=64, dtype=torch.float16, sliding_window=128
        )
        state = MambaSpec(
            block_size=block_size, shapes=((16, 4),), dtypes=(torch.float32,), mamba_cache_mode="align"
        )
        groups += [KVCacheGroupSpec(["swa.0"], window), KVCacheGroupSpec(["mamba.0"], state)]
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=block_size,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )


def make_requests(num: int, block_size: int, seed: int) -> list[Any]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(block_size, sha256)
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000, 30000) for _ in range(rng.randrange(64, 512))] for _ in range(8)]
    out = []
    for i in range(num):
        prompt = list(rng.choice(prefixes)) if i % 2 == 0 else []
        prompt += [rng.randrange(1000, 30000) for _ in range(rng.randrange(16, 600))]
        params = SamplingParams(max_tokens=rng.randrange(4, 48), ignore_eos=True)
        out.append(Request(f"r{i}", prompt, params, None, None, block_hasher=hasher))
    return out


def digest(output: Any) -> tuple[Any, ...]:
    """What the KV cache decided in one step, in a stable order."""
    new = tuple(
        (r.req_id, tuple(tuple(g) for g in r.block_ids), r.num_computed_tokens)
        for r in sorted(output.scheduled_new_reqs, key=lambda r: r.req_id)
    )
    cached = output.scheduled_cached_reqs
    cached_view = tuple(
        (
            rid,
            None if blocks is None else tuple(tuple(g) for g in blocks),
            cached.num_computed_tokens[i],
            rid in getattr(cached, "resumed_req_ids", ()),
        )
        for i, (rid, blocks) in enumerate(zip(cached.req_ids, cached.new_block_ids, strict=True))
    )
    return (
        new,
        cached_view,
        tuple(sorted(output.num_scheduled_tokens.items())),
        tuple(sorted(getattr(output, "preempted_req_ids", None) or ())),
        tuple(getattr(output, "num_common_prefix_blocks", ())),  # cascade attention: 0.23 only
        tuple(sorted(output.finished_req_ids)),
    )


def run(use_kvspec: bool, args: argparse.Namespace) -> tuple[list[tuple[Any, ...]], list[float], int]:
    import dataclasses

    from vllm.v1.outputs import ModelRunnerOutput

    from kvspec.integrations import vllm_kv_cache_manager

    global _RUNNER_OUTPUT_HAS_INDEX
    _RUNNER_OUTPUT_HAS_INDEX = "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}

    if use_kvspec:
        vllm_kv_cache_manager.install()
    try:
        scheduler = make_scheduler(
            args.blocks, args.block_size, args.budget, args.max_seqs, getattr(args, "layout", "full")
        )
    finally:
        vllm_kv_cache_manager.uninstall()
    expected = vllm_kv_cache_manager.adapter_class().__name__ if use_kvspec else "KVCacheManager"
    assert type(scheduler.kv_cache_manager).__name__ == expected, type(scheduler.kv_cache_manager)
    for request in make_requests(args.requests, args.block_size, args.seed):
        scheduler.add_request(request)
    digests: list[tuple[Any, ...]] = []
    times: list[float] = []
    preemptions = 0
    while scheduler.has_unfinished_requests():
        t0 = time.perf_counter()
        output = scheduler.schedule()
        ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in ids:
            request = scheduler.requests[rid]
            done_prefill = (
                request.num_computed_tokens + output.num_scheduled_tokens[rid] >= request.num_tokens
            )
            sampled.append([7] if done_prefill else [])
        fields: dict[str, Any] = dict(
            req_ids=ids, sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[]
        )
        if _RUNNER_OUTPUT_HAS_INDEX:  # vLLM 0.23 (0.34 derives the index from req_ids)
            fields["req_id_to_index"] = {rid: i for i, rid in enumerate(ids)}
        runner_output = ModelRunnerOutput(**fields)
        scheduler.update_from_output(output, runner_output)
        times.append(time.perf_counter() - t0)
        preemptions += len(getattr(output, "preempted_req_ids", None) or ())
        digests.append(digest(output))
        if len(digests) > 100_000:
            raise RuntimeError("the loop does not finish")
    return digests, times, preemptions


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=1200)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--max-seqs", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    _setup_offline_hub()
    stock_means: list[float] = []
    kvspec_means: list[float] = []
    for round_no in range(args.rounds):  # interleaved: the machine's noise hits both alike
        stock, stock_times, stock_pre = run(False, args)
        ours, our_times, our_pre = run(True, args)
        if stock != ours:
            step = next(i for i, (a, b) in enumerate(zip(stock, ours, strict=False)) if a != b)
            sys.exit(
                f"round {round_no}: scheduling outputs differ at step {step} of {len(stock)}/{len(ours)}:\n"
                f"  stock : {stock[step] if step < len(stock) else None}\n"
                f"  kvspec: {ours[step] if step < len(ours) else None}"
            )
        if our_pre != stock_pre:
            sys.exit(f"round {round_no}: {stock_pre} preemptions on stock, {our_pre} on kvspec")
        stock_means.append(statistics.fmean(stock_times))
        kvspec_means.append(statistics.fmean(our_times))
        fingerprint = hashlib.sha256(repr(stock).encode()).hexdigest()[:16]
        print(
            f"round {round_no}: {len(stock)} steps identical (sha {fingerprint}), {stock_pre} preemptions; "
            f"mean step stock {stock_means[-1] * 1e6:.0f} us, kvspec {kvspec_means[-1] * 1e6:.0f} us, "
            f"ratio {kvspec_means[-1] / stock_means[-1]:.2f}"
        )
    ratios = [k / s for k, s in zip(kvspec_means, stock_means, strict=True)]
    print(
        f"per-step time kvspec adapter / stock KVCacheManager under vLLM's Scheduler: median "
        f"{statistics.median(ratios):.2f} (rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
    )


if __name__ == "__main__":
    main()
