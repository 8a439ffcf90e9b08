"""The reference engine: coordinator + scheduler (+ model runner), and the statistics of a run."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from kvspec.blocks.request import Request
from kvspec.contracts.release import DEFAULT_BLOCK_SIZE
from kvspec.contracts.spec import KVCacheSpec, SchedulerLimits
from kvspec.coordinator import KVCacheCoordinator
from kvspec.engine.model import TinyDecoder, TinyModelConfig
from kvspec.engine.runner import ModelRunner
from kvspec.engine.scheduler import Scheduler
from kvspec.errors import SchedulingError
from kvspec.planning import (
    generate_scheduler_kv_cache_config,
    get_kv_cache_config,
    get_kv_cache_config_from_groups,
    get_kv_cache_groups,
)
from kvspec.planning.config import KVCacheConfig


@dataclass(kw_only=True, slots=True)
class EngineStats:
    """What a run did. Token counts in tokens; usage as a fraction of usable blocks."""

    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    preemptions: int = 0
    peak_usage: float = 0.0
    steps: int = 0
    step_cpu_seconds: list[float] = field(default_factory=list)
    usage_timeline: list[float] = field(default_factory=list)
    hit_rate_timeline: list[float] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def summary(self) -> dict[str, float | int]:
        steps_us = sorted(t * 1e6 for t in self.step_cpu_seconds) or [0.0]
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "prefix_cache_hit_rate": round(self.hit_rate, 4),
            "preemptions": self.preemptions,
            "peak_block_usage": round(self.peak_usage, 4),
            "steps": self.steps,
            "scheduler_cpu_us_per_step_median": round(statistics.median(steps_us), 1),
            "scheduler_cpu_us_per_step_p99": round(
                steps_us[min(len(steps_us) - 1, int(len(steps_us) * 0.99))], 1
            ),
        }


class Engine:
    """Runs requests to completion. With a model, tokens are the model's greedy choices; without one
    (bookkeeping only, for big presets), tokens are drawn at random and only the KV cache is simulated."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        limits: SchedulerLimits,
        *,
        model: TinyDecoder | None = None,
        enable_caching: bool = True,
        max_num_seqs: int = 16,
        device: str | torch.device = "cpu",
        vocab_size: int = 32_000,
        seed: int = 0,
    ) -> None:
        self.limits = limits
        self.coordinator = KVCacheCoordinator(
            generate_scheduler_kv_cache_config([kv_cache_config]),
            limits,
            enable_caching=enable_caching,
            log_stats=True,
        )
        self.hasher = self.coordinator.make_block_hasher(seed="kvspec-engine")
        self.scheduler = Scheduler(
            self.coordinator, max_num_batched_tokens=limits.batched_tokens, max_num_seqs=max_num_seqs
        )
        self.runner = (
            ModelRunner(
                model,
                kv_cache_config,
                max_num_reqs=max_num_seqs,
                max_num_batched_tokens=limits.batched_tokens,
                device=device,
            )
            if model is not None
            else None
        )
        self.vocab_size = model.config.vocab_size if model is not None else vocab_size
        self.rng = random.Random(seed)
        self.max_tokens: dict[str, int] = {}
        self.outputs: dict[str, list[int]] = {}
        self.stats = EngineStats()
        self._next_id = 0

    @classmethod
    def tiny(
        cls,
        model_config: TinyModelConfig,
        *,
        num_blocks: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        enable_caching: bool = True,
        max_num_batched_tokens: int = 64,
        max_num_seqs: int = 8,
        device: str | torch.device = "cpu",
    ) -> Engine:
        """An engine around the tiny torch model with exactly ``num_blocks`` blocks.

        Unlike the planner, this does not insist that one max-length request fits: small pools are how
        the tests force preemption.
        """
        specs = model_config.kv_cache_specs(block_size)
        limits = SchedulerLimits(
            max_model_len=model_config.max_model_len, max_num_batched_tokens=max_num_batched_tokens
        )
        groups = get_kv_cache_groups(specs)
        config = get_kv_cache_config_from_groups(groups, 0, num_blocks_override=num_blocks)
        return cls(
            config,
            limits,
            model=TinyDecoder(model_config, device),
            enable_caching=enable_caching,
            max_num_seqs=max_num_seqs,
            device=device,
        )

    @classmethod
    def bookkeeping(
        cls,
        layer_specs: Mapping[str, KVCacheSpec],
        limits: SchedulerLimits,
        *,
        memory_bytes: int,
        enable_caching: bool = True,
        max_num_seqs: int = 64,
        seed: int = 0,
    ) -> Engine:
        """An engine that runs only the KV cache bookkeeping of a (large) model in ``memory_bytes``."""
        config = get_kv_cache_config(layer_specs, memory_bytes, limits)
        return cls(config, limits, enable_caching=enable_caching, max_num_seqs=max_num_seqs, seed=seed)

    def add_request(self, prompt: list[int], max_tokens: int, *, cache_salt: str | None = None) -> str:
        rid = str(self._next_id)
        self._next_id += 1
        request = Request(rid, prompt, block_hasher=self.hasher, cache_salt=cache_salt)
        self.max_tokens[rid] = max_tokens
        self.outputs[rid] = []
        self.scheduler.add_request(request)
        self.stats.prompt_tokens += len(prompt)
        return rid

    def step(self) -> list[str]:
        """One scheduler step (+ model step); returns the ids of requests that finished."""
        output = self.scheduler.schedule()
        stats = self.stats
        stats.steps += 1
        stats.step_cpu_seconds.append(output.cpu_seconds)
        stats.preemptions += len(output.preempted)
        cache_stats = self.coordinator.make_prefix_cache_stats()
        if cache_stats is not None:
            stats.query_tokens += cache_stats.queries + cache_stats.preempted_queries
            stats.hit_tokens += cache_stats.hits + cache_stats.preempted_hits
        usage = self.coordinator.usage
        stats.peak_usage = max(stats.peak_usage, usage)
        stats.usage_timeline.append(usage)
        stats.hit_rate_timeline.append(stats.hit_rate)
        if not output.scheduled:
            if self.scheduler.waiting and not self.scheduler.running:
                raise SchedulingError(
                    f"Request {self.scheduler.waiting[0].request_id!r} can never be admitted: its prompt needs "
                    f"more blocks than the pool's {self.coordinator.block_pool.num_gpu_blocks - 1}."
                )
            return []
        sampled = self.runner.execute(output) if self.runner is not None else None
        finished: list[str] = []
        for i, item in enumerate(output.scheduled):
            request = item.request
            request.num_computed_tokens = item.num_computed + item.num_new_tokens
            if request.num_computed_tokens < request.num_tokens:
                continue  # chunked prefill continues next step
            token = sampled[i] if sampled is not None else self.rng.randrange(self.vocab_size)
            rid = request.request_id
            self.outputs[rid].append(token)
            request.append_output_token_ids(token)
            stats.generated_tokens += 1
            if (
                len(self.outputs[rid]) >= self.max_tokens[rid]
                or request.num_tokens >= self.limits.max_model_len
            ):
                self.scheduler.finish(request)
                if self.runner is not None:
                    self.runner.release(rid)
                stats.requests += 1
                finished.append(rid)
        return finished

    def run(self, on_finish: Callable[[str], None] | None = None) -> dict[str, list[int]]:
        """Step until every request finished; returns the generated tokens per request id."""
        while self.scheduler.has_unfinished():
            for rid in self.step():
                if on_finish is not None:
                    on_finish(rid)
        return self.outputs
