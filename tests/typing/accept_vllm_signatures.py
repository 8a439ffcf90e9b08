"""Every checker must accept: a spec ported from vLLM keeps vLLM's signatures (issue 18, item 2; issue 48).

vLLM's specs write ``merge(cls, specs: list[Self])`` and ``max_memory_usage_bytes(self, vllm_config)``;
a platform plugin (vllm-ascend's specs, for one) subclasses a built-in with them. The protocol's parameters
are positional-only (a port's names are its own), the built-ins' merge takes ``list[Any]`` (so a
``list[Self]`` override is valid under pyright too), and ``kvspec.contracts.vllm_config.VllmConfig`` (which
``SchedulerLimits`` satisfies) types the vLLM form: both are valid overrides with only the imports changed.
"""

from dataclasses import dataclass, replace

import torch
from typing_extensions import Self

from kvspec import FullAttentionManager, MLAAttentionSpec, SchedulerLimits, default_registry
from kvspec.contracts.vllm_config import VllmConfig
from kvspec.intmath import cdiv
from kvspec.specs.dtypes import dtype_size


@dataclass(frozen=True, kw_only=True)
class PortedLatentSpec(MLAAttentionSpec):
    """A latent cache with an extra rope head, as a platform writes it for vLLM."""

    rope_head_size: int = 0

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * (self.head_size + self.rope_head_size) * dtype_size(self.dtype)

    def max_memory_usage_bytes(self, vllm_config: VllmConfig) -> int:
        max_model_len = vllm_config.model_config.max_model_len
        dcp = vllm_config.parallel_config.decode_context_parallel_size
        return cdiv(max_model_len, self.block_size * dcp) * self.page_size_bytes

    @classmethod
    def merge(cls, specs: list[Self]) -> Self:
        assert all(s.rope_head_size == specs[0].rope_head_size for s in specs)
        return replace(specs[0])


default_registry.register(PortedLatentSpec, FullAttentionManager, MLAAttentionSpec)
spec = PortedLatentSpec(
    block_size=128, num_kv_heads=1, head_size=512, dtype=torch.bfloat16, rope_head_size=64
)
limits = SchedulerLimits(max_model_len=4096)
needed: int = spec.max_memory_usage_bytes(limits)
merged: PortedLatentSpec = PortedLatentSpec.merge([spec, spec])
