"""kvspec against vLLM 0.23.0's v1 KV-cache code, same workloads, one process, alternating runs.

Run: ``nox -s bench`` (builds a venv with vllm==0.23.0 --no-deps and CPU torch 2.13.0), or
``python -m benchmarks.vs_vllm [--rounds N] [--quick]`` in an environment that has both. If vLLM cannot be
imported, kvspec runs alone and the reason is printed.

W1  32-layer full attention, 8,192 blocks of 16 tokens: 256 requests of 2,048-token prompts (half share a
    1,024-token prefix), chunked prefill of 512 tokens in an 8,192-token step budget, 128 decode steps, free.
W2  the same on a 48-layer hybrid (5 sliding-window(1,024) : 1 full), 32,768 blocks.
W3  block hashing of 1M prompt tokens (sha256; and the fast option: kvspec xxhash vs vLLM xxhash).
W4  planning (get_kv_cache_configs) of a 128-layer hybrid (full + sliding window + Mamba); against vLLM 0.34
    its kv_cache_planning (grouping and configs) with a VllmConfig of the same settings.
Python's cyclic garbage collector is paused during each run (as timeit does), so a collection of the whole
shared heap is not charged to whichever library happens to be running. Per-step time = time spent inside
the KV-cache library's calls during one scheduler step (allocation,
prefix lookup, freeing, and appending generated tokens, which hashes newly full blocks). "step, mean over
the run" is a run's total library time divided by its steps (the figure the targets use: steps mix
decode-only and prefill work, so their median jumps between the two kinds); "step, median" is shown too.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

os.environ.setdefault("KVSPEC_TYPECHECK", "api")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("PYTHONHASHSEED", "0")

import torch

import kvspec
from kvspec.blocks.hashing import BlockHasher
from kvspec.contracts.release import VLLM_0_34, ReleaseProfile
from kvspec.planning import generate_scheduler_kv_cache_config, get_kv_cache_configs


def _installed_profile() -> ReleaseProfile:
    """The profile of the installed vLLM's release (0.23 when vLLM is absent)."""
    import importlib.metadata

    from kvspec.contracts.release import VLLM_0_23, profile_for_vllm_version

    try:
        return profile_for_vllm_version(importlib.metadata.version("vllm"))
    except importlib.metadata.PackageNotFoundError:
        return VLLM_0_23


def _release_profile() -> ReleaseProfile:
    """The profile of the installed vLLM (kvspec reproduces that release; 0.23 when vLLM is absent), or the one
    KVSPEC_BENCH_PROFILE names."""

    from kvspec.contracts.release import PROFILES

    forced = os.environ.get(
        "KVSPEC_BENCH_PROFILE"
    )  # e.g. vllm-0.23 against 0.34: shows the check is sensitive
    return PROFILES[forced] if forced else _installed_profile()


PROFILE = _release_profile()
#: Mamba with prefix caching: vLLM 0.34 runs it in "align" mode only; 0.23's shape keeps "none" (cached).
MAMBA_MODE: Literal["none", "align"] = "align" if PROFILE.mamba.cache_modes == ("none", "align") else "none"
BLOCK = 16
HEADS, HEAD_SIZE, DTYPE = 8, 128, torch.bfloat16
MAX_MODEL_LEN = 4096
BUDGET, CHUNK, DECODE_STEPS = 8192, 512, 128
VOCAB = 32_000


def layer_kinds(model: str) -> list[str]:
    if model == "full32":
        return ["full"] * 32
    if model == "hybrid48":
        return ["full" if i % 6 == 5 else "sliding" for i in range(48)]
    if model == "chunked32":
        return ["full" if i % 4 == 3 else "chunked" for i in range(32)]
    if model == "hybrid128":
        return ["full" if i % 8 == 7 else "mamba" if i % 8 == 3 else "sliding" for i in range(128)]
    if model == "rswa_ring32":  # vLLM 0.34's families: R-SWA layers, one ring layer, full attention
        return ["ring" if i == 0 else "full" if i % 4 == 3 else "rswa" for i in range(32)]
    raise ValueError(model)


def make_prompts(num: int, length: int, shared: int, seed: int = 0) -> list[list[int]]:
    """``num`` prompts; every other one starts with the same ``shared``-token prefix."""
    import random

    rng = random.Random(seed)
    prefix = [rng.randrange(VOCAB) for _ in range(shared)]
    prompts = []
    for i in range(num):
        if i % 2 == 0:
            prompts.append(prefix + [rng.randrange(VOCAB) for _ in range(length - shared)])
        else:
            prompts.append([rng.randrange(VOCAB) for _ in range(length)])
    return prompts


# -- adapters -----------------------------------------------------------------------------------


class KvspecAdapter:
    name = "kvspec"

    def __init__(self, eviction_policy: str | None = None) -> None:
        #: None: vLLM's LRU (the pool's own list); "lru-protocol": the same order through the policy protocol
        self.eviction_policy = eviction_policy

    def specs(self, model: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        attn_page = BLOCK * 2 * HEADS * HEAD_SIZE * 2
        for i, kind in enumerate(layer_kinds(model)):
            common: dict[str, Any] = dict(
                block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=DTYPE
            )
            if kind == "full":
                out[f"layers.{i}"] = kvspec.FullAttentionSpec(**common)
            elif kind == "sliding":
                out[f"layers.{i}"] = kvspec.SlidingWindowSpec(sliding_window=1024, **common)
            elif kind == "chunked":
                out[f"layers.{i}"] = kvspec.ChunkedLocalAttentionSpec(attention_chunk_size=1024, **common)
            elif kind == "rswa":
                out[f"layers.{i}"] = kvspec.RSWASpec(rswa_window=256, **common)
            elif kind == "ring":
                out[f"layers.{i}"] = kvspec.CircularBufferSpec(**common)
            else:
                out[f"layers.{i}"] = kvspec.MambaSpec(
                    block_size=BLOCK,
                    shapes=((1024, 3), (16, 64, 16)),
                    dtypes=(DTYPE, DTYPE),
                    page_size_padded=attn_page,
                    mamba_cache_mode=MAMBA_MODE,
                )
        return out

    def limits(self) -> kvspec.SchedulerLimits:
        return kvspec.SchedulerLimits(
            max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=BUDGET, mamba_cache_mode=MAMBA_MODE
        )

    def plan(self, specs: dict[str, Any], memory: int) -> Any:
        try:
            return get_kv_cache_configs([specs], [memory], self.limits(), profile=PROFILE)
        except TypeError:  # a baseline build from before the one-profile planner
            return get_kv_cache_configs([specs], [memory], self.limits())

    def build(self, model: str, num_blocks: int) -> None:
        # As README builds it: the profile plans the config, which carries the planned retention (vLLM 0.34:
        # sparse, 0; 0.23: dense, None) that the coordinator runs. A baseline build from before the one-profile
        # planner (issue 35) plans without a profile and is given the retention explicitly.
        try:
            (config,) = get_kv_cache_configs(
                [self.specs(model)], [1 << 50], self.limits(), num_blocks_override=num_blocks, profile=PROFILE
            )
            retention: dict[str, Any] = {}
        except TypeError:
            (config,) = get_kv_cache_configs(
                [self.specs(model)], [1 << 50], self.limits(), num_blocks_override=num_blocks
            )
            retention = {"prefix_cache_retention_interval": PROFILE.planning.prefix_cache_retention_interval}
        self.kv = kvspec.KVCacheCoordinator(
            generate_scheduler_kv_cache_config([config]),
            self.limits(),
            profile=PROFILE,
            **retention,
            # Only when asked: a worker may run a kvspec from before eviction policies (a baseline build).
            **(
                {}
                if self.eviction_policy is None
                else {"eviction_policy": _policy_factory(self.eviction_policy)}
            ),
        )
        self.hasher = self.kv.make_block_hasher()

    def make_request(self, rid: str, tokens: list[int]) -> Any:
        return kvspec.Request(rid, tokens, block_hasher=self.hasher)

    def hasher_for(self, algorithm: str) -> Callable[[list[int]], int]:
        hasher = BlockHasher(BLOCK, algorithm=algorithm)

        def run(tokens: list[int]) -> int:
            req = kvspec.Request("h", tokens)
            return len(hasher.hash_new_blocks(req))

        return run


class VllmAdapter:
    name = "vllm"

    def __init__(self) -> None:
        from benchmarks.vllm_scheduler_loop import _setup_offline_hub

        # Before vLLM (and huggingface_hub, which reads its cache location once) is imported: W4 against
        # vLLM 0.34 builds a ModelConfig, read from this offline cache.
        _setup_offline_hub()
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1 import kv_cache_interface as kvi
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.request import Request

        self.kvi, self.utils, self.Manager, self.Request = kvi, kv_cache_utils, KVCacheManager, Request
        self.get_hash_fn_by_name = get_hash_fn_by_name
        self.sampling = SamplingParams(max_tokens=DECODE_STEPS)
        import vllm

        self.version = vllm.__version__
        kv_cache_utils.init_none_hash(get_hash_fn_by_name("sha256"))

    def config(self) -> Any:
        return SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN, original_max_model_len=MAX_MODEL_LEN),
            cache_config=SimpleNamespace(
                block_size=BLOCK,
                num_gpu_blocks_override=None,
                mamba_cache_mode="none",
                enable_prefix_caching=True,
                hash_block_size=None,
            ),
            scheduler_config=SimpleNamespace(
                disable_hybrid_kv_cache_manager=False,
                max_num_batched_tokens=BUDGET,
                max_num_encoder_input_tokens=0,
            ),
            parallel_config=SimpleNamespace(decode_context_parallel_size=1, prefill_context_parallel_size=1),
            speculative_config=None,
            kv_transfer_config=None,
        )

    def specs(self, model: str) -> dict[str, Any]:
        kvi = self.kvi
        out: dict[str, Any] = {}
        attn_page = BLOCK * 2 * HEADS * HEAD_SIZE * 2
        for i, kind in enumerate(layer_kinds(model)):
            common = dict(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=DTYPE)
            if kind == "full":
                out[f"layers.{i}"] = kvi.FullAttentionSpec(**common)
            elif kind == "sliding":
                out[f"layers.{i}"] = kvi.SlidingWindowSpec(sliding_window=1024, **common)
            elif kind == "chunked":
                out[f"layers.{i}"] = kvi.ChunkedLocalAttentionSpec(attention_chunk_size=1024, **common)
            else:
                out[f"layers.{i}"] = kvi.MambaSpec(
                    block_size=BLOCK,
                    shapes=((1024, 3), (16, 64, 16)),
                    dtypes=(DTYPE, DTYPE),
                    page_size_padded=attn_page,
                    mamba_cache_mode=MAMBA_MODE,
                )
        return out

    def plan(self, specs: dict[str, Any], memory: int) -> Any:
        if not hasattr(self.utils, "get_kv_cache_configs"):
            # vLLM 0.34 plans in kv_cache_planning from a whole VllmConfig: grouping, then the configs.
            planning, config = self._planner_034()
            groups = planning.get_global_kv_cache_groups(config, [specs])
            return planning.get_kv_cache_configs(config, [specs], [memory], groups)
        return self.utils.get_kv_cache_configs(self.config(), [specs], [memory])

    def _planner_034(self) -> tuple[Any, Any]:
        """vLLM 0.34's planner and a VllmConfig with this benchmark's settings (built once, untimed)."""
        cached = getattr(self, "_planner", None)
        if cached is None:
            from benchmarks.vllm_scheduler_loop import vllm_034_planner

            cached = self._planner = vllm_034_planner(BLOCK, MAX_MODEL_LEN, MAMBA_MODE)
        return cached

    def build(self, model: str, num_blocks: int) -> None:
        if not hasattr(self.utils, "get_kv_cache_configs"):
            self._build_034(model, num_blocks)
            return
        cfg = self.config()
        cfg.cache_config.num_gpu_blocks_override = num_blocks
        (config,) = self.utils.get_kv_cache_configs(cfg, [self.specs(model)], [1 << 50])
        sched = self.utils.generate_scheduler_kv_cache_config([config])
        scheduler_bs, hash_bs = self.utils.resolve_kv_cache_block_sizes(sched, cfg)
        self.kv = self.Manager(
            sched, MAX_MODEL_LEN, scheduler_bs, hash_bs, max_num_batched_tokens=BUDGET, enable_caching=True
        )
        self.block_hasher = self.utils.get_request_block_hasher(hash_bs, self.get_hash_fn_by_name("sha256"))

    def _build_034(self, model: str, num_blocks: int) -> None:
        """vLLM 0.34: the same planned groups (kvspec plans them as 0.34 does for these shapes: one group per
        kind, layers in order; planning is compared apart), with 0.34's planned retention (0)."""
        from kvspec.integrations.vllm_planning import config_to_vllm

        ours = KvspecAdapter()
        (config,) = get_kv_cache_configs(
            [ours.specs(model)], [1 << 50], ours.limits(), num_blocks_override=num_blocks
        )
        sched = dataclasses.replace(
            config_to_vllm(generate_scheduler_kv_cache_config([config])), prefix_cache_retention_interval=0
        )
        self.kv = self.Manager(
            sched, MAX_MODEL_LEN, BLOCK, BLOCK, max_in_flight_tokens=BUDGET, enable_caching=True
        )
        self.block_hasher = self.utils.get_request_block_hasher(BLOCK, self.get_hash_fn_by_name("sha256"))

    def make_request(self, rid: str, tokens: list[int]) -> Any:
        return self.Request(rid, tokens, self.sampling, None, block_hasher=self.block_hasher)

    def hasher_for(self, algorithm: str) -> Callable[[list[int]], int]:
        fn = self.get_hash_fn_by_name(algorithm)
        self.utils.init_none_hash(fn)
        hasher = self.utils.get_request_block_hasher(BLOCK, fn)
        sampling = self.sampling

        def run(tokens: list[int]) -> int:
            req = self.Request("h", tokens, sampling, None)
            return len(hasher(req))

        return run


# -- W1/W2 driver -------------------------------------------------------------------------------


@dataclass
class RunResult:
    step_times: list[float] = field(default_factory=list)
    calls: dict[str, list[float]] = field(
        default_factory=lambda: {
            "allocate_slots decode": [],
            "allocate_slots prefill": [],
            "get_computed_blocks": [],
            "free": [],
            "Request() incl. hashing": [],
        }
    )
    hit_tokens: int = 0
    admitted_tokens: int = 0
    preemptions: int = 0
    finished: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.admitted_tokens if self.admitted_tokens else 0.0


def drive(
    adapter: Any, model: str, num_blocks: int, prompts: Sequence[list[int]], trace: list[Any] | None = None
) -> RunResult:
    """A scheduler loop identical for both libraries (FCFS, chunked prefill, preempt the newest).

    With ``trace``, every allocation's block ids and every prefix hit are appended to it, so two
    libraries' runs can be compared block id by block id.
    """
    adapter.build(model, num_blocks)
    kv = adapter.kv
    result = RunResult()
    clock = time.perf_counter
    calls = result.calls
    waiting: deque[Any] = deque()
    for i, prompt in enumerate(prompts):
        t0 = clock()
        req = adapter.make_request(str(i), prompt)
        calls["Request() incl. hashing"].append(clock() - t0)
        waiting.append(req)
    prompt_len = {req.request_id: req.num_tokens for req in waiting}
    generated: dict[str, int] = {}
    running: list[Any] = []
    gc.collect()
    gc.disable()  # as timeit does: a collection of the whole heap (both libraries' objects) is not a step's cost
    try:
        _loop(kv, waiting, running, prompt_len, generated, result, clock, calls, trace)
    finally:
        gc.enable()
    return result


def _loop(
    kv: Any,
    waiting: deque[Any],
    running: list[Any],
    prompt_len: dict[str, int],
    generated: dict[str, int],
    result: RunResult,
    clock: Callable[[], float],
    calls: dict[str, list[float]],
    trace: list[Any] | None,
) -> None:
    while waiting or running:
        t0 = clock()
        kv.new_step_starts()  # as both engines' schedulers do (Mamba defers states cached this step)
        step = clock() - t0
        budget = BUDGET
        scheduled: list[tuple[Any, int]] = []
        idx = 0
        while idx < len(running) and budget > 0:
            req = running[idx]
            prefill = (
                req.num_computed_tokens < req.num_tokens
                and req.num_computed_tokens < prompt_len[req.request_id]
            )
            n = min(req.num_tokens - req.num_computed_tokens, CHUNK, budget)
            t0 = clock()
            new = kv.allocate_slots(req, n)
            dt = clock() - t0
            if trace is not None:
                trace.append((req.request_id, n, None if new is None else new.get_block_ids()))
            step += dt
            calls["allocate_slots prefill" if prefill else "allocate_slots decode"].append(dt)
            if new is None:
                victim = running.pop()
                t0 = clock()
                kv.free(victim)
                step += clock() - t0
                victim.num_computed_tokens = 0
                victim.num_preemptions += 1
                result.preemptions += 1
                waiting.appendleft(victim)
                continue
            scheduled.append((req, n))
            budget -= n
            idx += 1
        while waiting and budget > 0:
            req = waiting[0]
            t0 = clock()
            found = kv.get_computed_blocks(req)  # vLLM 0.34 adds a third value (the shared-prefix boundary)
            dt = clock() - t0
            computed, hit = found[0], found[1]
            # vLLM 0.34's Scheduler pins the shared-prefix junction (kvspec's lookup pins it itself).
            if len(found) > 2:
                req.shared_prefix_boundary = found[2]
            calls["get_computed_blocks"].append(dt)
            n = min(req.num_tokens - hit, CHUNK, budget)
            t1 = clock()
            new = kv.allocate_slots(req, n, hit, computed)
            dt2 = clock() - t1
            if trace is not None:
                trace.append(
                    (
                        req.request_id,
                        hit,
                        computed.get_block_ids(),
                        None if new is None else new.get_block_ids(),
                    )
                )
            step += dt + dt2
            if new is None:
                break
            calls["allocate_slots prefill"].append(dt2)
            waiting.popleft()
            req.num_computed_tokens = hit
            result.hit_tokens += hit
            result.admitted_tokens += req.num_tokens
            running.append(req)
            scheduled.append((req, n))
            budget -= n
        for req, n in scheduled:
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue
            rid = req.request_id
            done = generated.get(rid, 0)
            if done >= DECODE_STEPS:
                t0 = clock()
                kv.free(req)
                dt = clock() - t0
                step += dt
                calls["free"].append(dt)
                running.remove(req)
                result.finished += 1
                continue
            t0 = clock()
            req.append_output_token_ids((int(rid) * 7919 + done) % VOCAB)
            step += clock() - t0
            generated[rid] = done + 1
        result.step_times.append(step)


# -- reporting ----------------------------------------------------------------------------------


def med_us(values: Sequence[float]) -> float:
    return statistics.median(values) * 1e6 if values else float("nan")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b and b == b else "n/a"


# -- runners: one library (or one kvspec build) each, here or in a worker process ----------------


def _hash_seconds(adapter: Any, algorithm: str, quick: bool) -> float:
    """Seconds to hash W3's prompts once with ``algorithm``."""
    fn = adapter.hasher_for(algorithm)
    prompts = _w3_prompts(quick)
    t0 = time.perf_counter()
    for p in prompts:
        fn(p)
    return time.perf_counter() - t0


def _plan_seconds(adapter: Any) -> float:
    specs = adapter.specs("hybrid128")  # fresh, untimed: W4 times the planner alone
    t0 = time.perf_counter()
    adapter.plan(specs, 40 << 30)
    return time.perf_counter() - t0


# Made once per process and shared by every round and library (as a single run always did): generating
# them (0.5-1 M random tokens) took longer than some of the runs that use them.
@functools.cache
def _w3_prompts(quick: bool) -> list[list[int]]:
    return make_prompts(128 if quick else 512, 2048, 0, seed=1)  # x 2,048 tokens: 1,048,576 in full mode


@functools.cache
def _w12_prompts(quick: bool) -> list[list[int]]:
    return make_prompts(64 if quick else 256, 2048, 1024)


def _policy_factory(name: str | None) -> Any:
    if name == "lru-protocol":
        from kvspec.eviction import ReleaseOrderLRU

        return ReleaseOrderLRU
    return name


class LocalRunner:
    """A library imported in this process (vLLM, and the kvspec build that is importable here)."""

    def __init__(self, adapter: Any, name: str) -> None:
        self.adapter = adapter
        self.name = name
        self.is_vllm = isinstance(adapter, VllmAdapter)

    def drive(self, model: str, blocks: int, quick: bool, trace: bool) -> tuple[RunResult, list[Any] | None]:
        out: list[Any] | None = [] if trace else None
        result = drive(self.adapter, model, blocks, _w12_prompts(quick), out)
        return result, None if out is None else json.loads(json.dumps(_normalise(out)))

    def hash_seconds(self, algorithm: str, quick: bool) -> float:
        return _hash_seconds(self.adapter, algorithm, quick)

    def plan_seconds(self) -> float:
        return _plan_seconds(self.adapter)

    def close(self) -> None:
        if self.is_vllm:  # W3 switched vLLM's NONE_HASH; later vLLM users expect sha256's
            self.adapter.utils.init_none_hash(self.adapter.get_hash_fn_by_name("sha256"))


class WorkerRunner:
    """A kvspec build from another directory (``--kvspec-build DIR``: a compiled copy, say), run in a
    worker process of this script, because one process can import only one build of kvspec. The worker
    sits idle while the other libraries run, so the alternation of rounds is the same as in-process."""

    def __init__(self, root: str) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        # This file, not DIR's copy of it: every build runs the same driver; DIR's kvspec comes first on
        # the path (the script's own directory holds no kvspec).
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker"],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = self._call({"op": "hello"})
        self.build = str(hello["build"])
        self.name = f"kvspec {self.build}"
        self.is_vllm = False

    def _call(self, message: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the kvspec worker exited (code {self.proc.wait()}); its stderr says why")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"kvspec worker: {reply['error']}")
        return reply["value"]

    def drive(self, model: str, blocks: int, quick: bool, trace: bool) -> tuple[RunResult, list[Any] | None]:
        value = self._call({"op": "drive", "model": model, "blocks": blocks, "quick": quick, "trace": trace})
        return RunResult(**value["result"]), value["trace"]

    def hash_seconds(self, algorithm: str, quick: bool) -> float:
        return float(self._call({"op": "hash", "algorithm": algorithm, "quick": quick}))

    def plan_seconds(self) -> float:
        return float(self._call({"op": "plan"}))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def worker_main() -> int:
    """``--worker``: serve one JSON request per stdin line with this process's kvspec, one reply per line."""
    runner = LocalRunner(KvspecAdapter(), "kvspec")
    for line in sys.stdin:
        message = json.loads(line)
        op = message["op"]
        try:
            if op == "hello":
                value: Any = {"build": kvspec.__build__, "file": kvspec.__file__}
            elif op == "drive":
                result, trace = runner.drive(
                    message["model"], message["blocks"], message["quick"], message["trace"]
                )
                value = {"result": dataclasses.asdict(result), "trace": trace}
            elif op == "hash":
                value = runner.hash_seconds(message["algorithm"], message["quick"])
            elif op == "plan":
                value = runner.plan_seconds()
            else:
                raise ValueError(f"unknown op {op!r}")
            reply: dict[str, Any] = {"value": value}
        except Exception as exc:  # reported to the parent, which raises it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


# -- the workloads --------------------------------------------------------------------------------


def _ratio_columns(runners: list[Any]) -> tuple[list[Any], Any]:
    """The kvspec runners and the vLLM runner (None when vLLM is not there)."""
    vllm = next((r for r in runners if r.is_vllm), None)
    return [r for r in runners if not r.is_vllm], vllm


def _header(first: str, runners: list[Any], unit: str) -> list[str]:
    ours, vllm = _ratio_columns(runners)
    cols = [f"{r.name}{unit}" for r in runners]
    if vllm is not None:
        cols += [f"{r.name} / vLLM" for r in ours]
    return [f"| {first} | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]


def bench_w12(runners: list[Any], rounds: int, quick: bool, lines: list[str]) -> dict[str, Any]:
    num = 64 if quick else 256
    summary: dict[str, Any] = {}
    ours, vllm = _ratio_columns(runners)
    for label, model, blocks in (("W1", "full32", 8192), ("W2", "hybrid48", 32768)):
        results: dict[str, list[RunResult]] = {r.name: [] for r in runners}
        for _ in range(rounds):
            for runner in runners:
                results[runner.name].append(runner.drive(model, blocks, quick, False)[0])
        lines.append(f"\n### {label}: {model}, {blocks:,} blocks, {num} requests x 2,048 tokens\n")
        lines.extend(_header("figure", runners, " (median µs)"))
        keys = ["step, mean over the run", "step, median", *list(RunResult().calls)]
        row_values: dict[str, dict[str, float]] = {}
        for key in keys:
            per = {}
            for r in runners:
                runs = results[r.name]
                if key == "step, mean over the run":
                    per[r.name] = statistics.median(_step_mean_us(run) for run in runs)
                elif key == "step, median":
                    per[r.name] = statistics.median(
                        med_us([t for t in run.step_times if t > 0]) for run in runs
                    )
                else:
                    per[r.name] = statistics.median(med_us(run.calls[key]) for run in runs)
            row_values[key] = per
            cells = [f"{per[r.name]:,.1f}" for r in runners]
            if vllm is not None:
                cells += [ratio(per[r.name], per[vllm.name]) for r in ours]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        hits = {r.name: results[r.name][0].hit_rate for r in runners}
        pre = {r.name: results[r.name][0].preemptions for r in runners}
        tail = [""] * len(ours) if vllm is not None else []
        equal = ["equal" if hits[r.name] == hits[vllm.name] else "DIFFERENT" for r in ours] if vllm else []
        lines.append(
            "| prefix-cache hit rate (tokens) | "
            + " | ".join([f"{hits[r.name]:.4f}" for r in runners] + equal)
            + " |"
        )
        lines.append("| preemptions | " + " | ".join([str(pre[r.name]) for r in runners] + tail) + " |")
        per_round: dict[str, list[float]] = {}
        if vllm is not None:
            # The targets hold "in every run": each round's ratio of step means, not only their median.
            for r in ours:
                per_round[r.name] = [
                    _step_mean_us(a) / _step_mean_us(b)
                    for a, b in zip(results[r.name], results[vllm.name], strict=True)
                ]
                shown = ", ".join(f"{x:.3f}" for x in per_round[r.name])
                lines.append(
                    f"\n{r.name} / vLLM, step mean, each round: {shown} (max {max(per_round[r.name]):.3f})"
                )
        summary[label] = {
            "per_call_us": row_values,
            "hit_rate": hits,
            "preemptions": pre,
            "step_mean_ratio_per_round": per_round,
        }
    return summary


def _step_mean_us(run: RunResult) -> float:
    return sum(run.step_times) / len(run.step_times) * 1e6


def _normalise(trace: list[Any]) -> list[Any]:
    """Block ids as plain lists of ints (vLLM returns lists in tuples, as kvspec does)."""
    return [tuple(list(map(list, x)) if isinstance(x, tuple) else x for x in item) for item in trace]


def check_identical(runners: list[Any], quick: bool, lines: list[str]) -> bool:
    """Run W1, W2 and two more shapes once per library, recording every allocation's block ids and every
    hit, and compare each kvspec build's trace with vLLM's; True when every case is identical."""
    ours, vllm = _ratio_columns(runners)
    assert vllm is not None
    all_same = True
    cases = [
        ("W1", "full32", 8192),
        ("W2", "hybrid48", 32768),
        ("chunked local 3:1 full", "chunked32", 16384),
        ("SW + full + Mamba", "hybrid128", 65536),
    ]
    if _installed_profile() is VLLM_0_34:
        # 0.34's two new families get a shape of their own; its Mamba shape runs "align" (its only caching mode).
        cases.append(("R-SWA + circular buffer + full", "rswa_ring32", 16384))
    for label, model, blocks in cases:
        want = vllm.drive(model, blocks, quick, True)[1]
        for runner in ours:
            got = runner.drive(model, blocks, quick, True)[1]
            same = got == want
            all_same = all_same and same
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
            lines.append(
                f"{label} ({runner.name}): {len(want):,} allocations and prefix hits compared block id by "
                "block id with vLLM: "
                + (
                    "identical"
                    if same
                    else f"DIFFERENT (first at event {first}; lengths {len(got)}, {len(want)})"
                )
            )
    return all_same


def bench_w3(runners: list[Any], rounds: int, quick: bool, lines: list[str]) -> dict[str, Any]:
    total = len(_w3_prompts(quick)) * 2048
    ours, vllm = _ratio_columns(runners)
    out: dict[str, Any] = {}
    lines.append(f"\n### W3: block hashing of {total:,} prompt tokens (block size 16), tokens/s\n")
    lines.extend(_header("algorithm", runners, "").copy())
    lines[-2] = lines[-2].replace(" / vLLM |", " / vLLM (throughput) |")
    for algo in ("sha256", "xxhash"):
        best: dict[str, float] = {r.name: float("inf") for r in runners}
        for _ in range(rounds):
            for runner in runners:
                best[runner.name] = min(best[runner.name], runner.hash_seconds(algo, quick))
        tput = {k: total / v for k, v in best.items()}
        out[algo] = tput
        cells = [f"{tput[r.name]:,.0f}" for r in runners]
        if vllm is not None:
            cells += [f"{tput[r.name] / tput[vllm.name]:.2f}x" for r in ours]
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    return out


def bench_w4(runners: list[Any], rounds: int, lines: list[str]) -> dict[str, Any]:
    times: dict[str, list[float]] = {r.name: [] for r in runners}
    try:
        runners[-1].plan_seconds()
    except NotImplementedError as exc:  # vLLM 0.34: planning is compared apart
        runners = [r for r in runners if not r.is_vllm]
        times = {r.name: [] for r in runners}
        lines.append(f"\n(W4: {exc})")
    for _ in range(max(rounds, 5) * 4):
        for runner in runners:
            times[runner.name].append(runner.plan_seconds())
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ours, vllm = _ratio_columns(runners)
    lines.append("\n### W4: get_kv_cache_configs for a 128-layer hybrid (96 SW + 16 full + 16 Mamba), ms\n")
    lines.extend(_header("", runners, ""))
    cells = [f"{med[r.name]:.2f}" for r in runners]
    if vllm is not None:
        cells += [ratio(med[r.name], med[vllm.name]) for r in ours]
    lines.append("| median ms | " + " | ".join(cells) + " |")
    return med


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="64 requests instead of 256 (a smoke run)")
    parser.add_argument("--only", choices=["W1W2", "W3", "W4"], default=None)
    parser.add_argument(
        "--only-check",
        action="store_true",
        help="with --check-identical: compare the traces and time nothing (CI's check on each build)",
    )
    parser.add_argument(
        "--check-identical",
        action="store_true",
        help="also run W1, W2 and two more shapes once per library recording every block id, and compare",
    )
    parser.add_argument(
        "--kvspec-build",
        action="append",
        default=[],
        metavar="DIR",
        help="also run the kvspec in DIR (a checkout, e.g. the compiled copy `nox -s compiled` keeps) in a "
        "worker process, beside the kvspec importable here; repeatable",
    )
    parser.add_argument(
        "--with-policy",
        action="append",
        default=[],
        metavar="NAME",
        help="also run the kvspec importable here with eviction policy NAME (lfu, slru, ..., or lru-protocol: "
        "LRU through the policy protocol) as one more column; repeatable",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main()
    runners: list[Any] = [LocalRunner(KvspecAdapter(), f"kvspec {kvspec.__build__}")]
    runners += [
        LocalRunner(KvspecAdapter(eviction_policy=name), f"kvspec {kvspec.__build__} +{name}")
        for name in args.with_policy
    ]
    runners += [WorkerRunner(os.path.abspath(d)) for d in args.kvspec_build]
    for runner, root in zip(runners[1 + len(args.with_policy) :], args.kvspec_build, strict=True):
        if sum(r.name == runner.name for r in runners) > 1:  # two pure builds, say: name the directory
            runner.name += f" @{os.path.basename(os.path.abspath(root))}"
    try:
        runners.append(LocalRunner(VllmAdapter(), "vllm"))
        vllm_note = f"vLLM {runners[-1].adapter.version}"
    except Exception as exc:  # any import failure: report and run kvspec alone
        vllm_note = f"vLLM unavailable ({type(exc).__name__}: {exc}); kvspec ran alone"
    builds = ", ".join(
        f"{r.name} ({'here' if isinstance(r, LocalRunner) else 'worker'})" for r in runners[:-1]
    )
    lines = [
        f"kvspec {kvspec.__version__}: {builds}"
        f" vs {vllm_note}; torch {torch.__version__}; Python {sys.version.split()[0]}; "
        f"{os.cpu_count()} CPUs; {args.rounds} alternating rounds, medians",
    ]
    identical = True
    try:
        if args.check_identical and any(r.is_vllm for r in runners):
            identical = check_identical(runners, args.quick, lines)
        if not args.only_check:
            if args.only in (None, "W1W2"):
                bench_w12(runners, args.rounds, args.quick, lines)
            if args.only in (None, "W3"):
                bench_w3(runners, args.rounds, args.quick, lines)
            if args.only in (None, "W4"):
                bench_w4(runners, args.rounds, lines)
    finally:
        for runner in runners:
            runner.close()
    print("\n".join(lines))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
