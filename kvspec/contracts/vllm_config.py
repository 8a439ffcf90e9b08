"""The typed home of vLLM's ``max_memory_usage_bytes(self, vllm_config)`` form.

vLLM's specs (and the platform plugins written for vLLM) bound a request's memory from vLLM's big
``VllmConfig``; kvspec's planner passes its small ``SchedulerLimits``. A spec class written in vLLM's form is
adapted when it is registered, through either registry API: kvspec's method then calls the plugin's with a
:class:`VllmConfigView` of the limits (the parts of ``VllmConfig`` that KV-cache specs read), so planning
works unchanged.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from kvspec.contracts.spec import SchedulerLimits


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _ModelConfigView:
    max_model_len: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _SchedulerConfigView:
    max_model_len: int
    max_num_batched_tokens: int
    max_num_encoder_input_tokens: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _ParallelConfigView:
    decode_context_parallel_size: int
    prefill_context_parallel_size: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _CacheConfigView:
    mamba_cache_mode: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class VllmConfigView:
    """The parts of vLLM's ``VllmConfig`` that KV-cache specs read, taken from kvspec's ``SchedulerLimits``
    (a plugin's ``max_memory_usage_bytes(vllm_config)`` gets one of these under kvspec's planner)."""

    model_config: _ModelConfigView
    scheduler_config: _SchedulerConfigView
    parallel_config: _ParallelConfigView
    cache_config: _CacheConfigView

    @classmethod
    def from_limits(cls, limits: SchedulerLimits) -> VllmConfigView:
        batched = limits.max_num_batched_tokens or limits.max_model_len
        return cls(
            model_config=_ModelConfigView(max_model_len=limits.max_model_len),
            scheduler_config=_SchedulerConfigView(
                max_model_len=limits.max_model_len,
                max_num_batched_tokens=batched,
                max_num_encoder_input_tokens=limits.max_num_encoder_input_tokens,
            ),
            parallel_config=_ParallelConfigView(
                decode_context_parallel_size=limits.decode_context_parallel_size,
                prefill_context_parallel_size=limits.prefill_context_parallel_size,
            ),
            cache_config=_CacheConfigView(mamba_cache_mode=limits.mamba_cache_mode),
        )


def adapt_vllm_config_form(spec_cls: type[Any]) -> None:
    """A spec class that defines ``max_memory_usage_bytes(self, vllm_config)`` (vLLM's form) gets kvspec's
    form ``max_memory_usage_bytes(self, limits)`` calling it with a ``VllmConfigView`` of the limits. The
    plugin's function is kept as ``__vllm_form__`` on the new one; a class already adapted is left alone."""
    fn = spec_cls.__dict__.get("max_memory_usage_bytes")
    if fn is None or not callable(fn) or hasattr(fn, "__vllm_form__"):
        return
    params = list(inspect.signature(fn).parameters)
    if params[1:2] != ["vllm_config"]:
        return

    def max_memory_usage_bytes(self: Any, limits: SchedulerLimits) -> int:
        return int(fn(self, VllmConfigView.from_limits(limits)))

    max_memory_usage_bytes.__vllm_form__ = fn  # type: ignore[attr-defined]
    max_memory_usage_bytes.__doc__ = fn.__doc__
    max_memory_usage_bytes.__qualname__ = f"{spec_cls.__qualname__}.max_memory_usage_bytes"
    setattr(spec_cls, "max_memory_usage_bytes", max_memory_usage_bytes)  # noqa: B010
