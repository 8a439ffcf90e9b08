"""A plugin adds a quantised spec with per-token scales, run by its own manager."""

from dataclasses import dataclass

import torch
from typing_extensions import assert_type

from kvspec import FullAttentionManager, FullAttentionSpec, default_registry, register_kv_cache_spec


class NpuFullAttentionManager(FullAttentionManager):
    """Full attention's block bookkeeping; the NPU kernels read the pages their own way."""


@register_kv_cache_spec(NpuFullAttentionManager, uniform_type_base_spec=FullAttentionSpec)
@dataclass(frozen=True, kw_only=True, slots=True)
class NpuScaledSpec(FullAttentionSpec):
    scale_dim: int = 0  # fp16 scales per token and KV head, for K and V

    @property
    def page_size_bytes(self) -> int:
        return self.real_page_size_bytes + 2 * self.block_size * self.num_kv_heads * self.scale_dim * 2


spec = NpuScaledSpec(block_size=128, num_kv_heads=8, head_size=128, dtype=torch.int8, scale_dim=1)
assert_type(spec, NpuScaledSpec)  # the decorator keeps the class's own type
assert default_registry.get_manager_class(spec) is NpuFullAttentionManager
print(spec.page_size_bytes)  # 266240 = 262144 bytes of K and V + 4096 bytes of scales per block
