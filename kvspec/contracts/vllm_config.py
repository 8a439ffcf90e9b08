"""The typed home of vLLM's ``max_memory_usage_bytes(self, vllm_config)`` form.

vLLM's specs (and the platform plugins written for vLLM, such as vllm-ascend's) bound a request's memory
from vLLM's big ``VllmConfig``; kvspec's planner passes its small ``SchedulerLimits``. ``SchedulerLimits``
carries the parts of ``VllmConfig`` that KV-cache specs read (``model_config.max_model_len``,
``scheduler_config.max_num_batched_tokens``, ``parallel_config.decode_context_parallel_size``, ...), so a
spec written in vLLM's form runs unchanged, and :class:`VllmConfig` (the protocol of those parts) is what
such a spec annotates its parameter with: ``SchedulerLimits`` satisfies it, so mypy accepts the method as
an override of kvspec's ``max_memory_usage_bytes(self, limits: SchedulerLimits)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfigView:
    """vLLM's ``model_config``, as far as KV-cache specs read it (tokens)."""

    max_model_len: int


@dataclass(frozen=True, kw_only=True, slots=True)
class SchedulerConfigView:
    """vLLM's ``scheduler_config``, as far as KV-cache specs read it (tokens)."""

    max_model_len: int
    max_num_batched_tokens: int
    max_num_encoder_input_tokens: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelConfigView:
    """vLLM's ``parallel_config``, as far as KV-cache specs read it (ranks)."""

    decode_context_parallel_size: int
    prefill_context_parallel_size: int


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheConfigView:
    """vLLM's ``cache_config``, as far as KV-cache specs read it."""

    mamba_cache_mode: str


class VllmConfig(Protocol):
    """The parts of vLLM's ``VllmConfig`` a KV-cache spec reads; ``kvspec.SchedulerLimits`` satisfies it.

    A spec ported from vLLM keeps ``def max_memory_usage_bytes(self, vllm_config: VllmConfig) -> int`` with
    this import in place of vLLM's."""

    @property
    def model_config(self) -> ModelConfigView: ...

    @property
    def scheduler_config(self) -> SchedulerConfigView: ...

    @property
    def parallel_config(self) -> ParallelConfigView: ...

    @property
    def cache_config(self) -> CacheConfigView: ...
