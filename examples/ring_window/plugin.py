"""A sliding-window spec family written from scratch: no built-in base class, only the KVCacheSpec protocol.

Everything kvspec does for its own sliding-window layers comes from the traits this spec declares: the
admission cap, the window the built-in SlidingWindowManager frees blocks by, hybrid-off conversion to full
attention, its own KV event kind and window, and its device view.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from typing_extensions import Self

from kvspec import (
    AnyRegistry,
    Capabilities,
    FullAttentionSpec,
    KVCacheSpec,
    PageView,
    SchedulerLimits,
    SlidingWindowManager,
    SpecCollection,
    SpecTraits,
    SpecValidationError,
    as_spec_list,
)
from kvspec.errors import SpecMergeError
from kvspec.specs.dtypes import dtype_size


@dataclass(frozen=True, kw_only=True, slots=True)
class RingWindowSpec:
    """Each token attends to the last ``window`` tokens; K and V of ``head_size`` per token and KV head."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    window: int

    def __post_init__(self) -> None:
        for name in ("block_size", "num_kv_heads", "head_size", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecValidationError(f"RingWindowSpec.{name} must be a positive int, got {value!r}.")

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * dtype_size(self.dtype)

    def max_memory_usage_bytes(self, limits: SchedulerLimits) -> int:
        cap = self.kv_cache_traits().admission_cap_blocks(
            self.block_size, limits.batched_tokens, limits.max_model_len
        )
        return (cap or 0) * self.page_size_bytes

    def copy_with_new_block_size(self, block_size: int) -> Self:
        return dataclasses.replace(self, block_size=block_size)

    @classmethod
    def merge(cls, specs: Sequence[Self]) -> Self:
        if not specs or any(s != specs[0] for s in specs):
            raise SpecMergeError("RingWindowSpec layers of one group must be identical.")
        return specs[0]

    def is_uniform_with_collection(self, specs: SpecCollection) -> bool:
        return all(isinstance(s, RingWindowSpec) and s.window == self.window for s in as_spec_list(specs))

    def kv_cache_traits(self) -> SpecTraits:
        return SpecTraits(
            admission_lookback_tokens=self.window - 1,
            admission_extra_blocks=1,
            sliding_window=self.window,
            event_sliding_window=self.window,
            hybrid_off_families=("kv",),
            kind="acme_ring_window",
            device_views=(
                PageView(
                    name="kv",
                    dtype=self.dtype,
                    shape=(self.block_size, self.num_kv_heads, 2 * self.head_size),
                ),
            ),
        )

    def to_full_attention(self, template: KVCacheSpec) -> KVCacheSpec:
        return FullAttentionSpec(
            block_size=self.block_size,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            dtype=self.dtype,
            sliding_window=self.window,
        )


CAPABILITIES = Capabilities(identifier="acme.ring_window", storage_layout="paged_kv")


def register(registry: AnyRegistry) -> None:
    """Run RingWindowSpec layers with the built-in sliding-window manager (it reads the declared window)."""
    registry.register(RingWindowSpec, SlidingWindowManager, capabilities=CAPABILITIES)
