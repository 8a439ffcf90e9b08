"""An Ascend-style quantised attention spec: int8 K/V plus one fp16 scale per token and KV head for K and V.

It derives from the built-in FullAttentionSpec (so it groups, merges and is planned like full attention)
and changes only what differs: the page holds the scales after the values, the KV events report its own
kind, and the device code views a page as three tensors (values, K scales, V scales).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kvspec import (
    AnyRegistry,
    Capabilities,
    FullAttentionManager,
    FullAttentionSpec,
    PageView,
    SpecTraits,
    SpecValidationError,
)
from kvspec.specs.dtypes import dtype_size


@dataclass(frozen=True, kw_only=True, slots=True)
class AscendInt8KVSpec(FullAttentionSpec):
    """int8 K and V of ``head_size`` per token and KV head, then ``scale_dtype`` scales (K's, then V's)."""

    scale_dtype: torch.dtype = torch.float16

    def __post_init__(self) -> None:
        if self.dtype != torch.int8:
            raise SpecValidationError(f"AscendInt8KVSpec.dtype must be torch.int8, got {self.dtype}.")
        FullAttentionSpec.__post_init__(self)

    @property
    def scale_bytes(self) -> int:
        """Bytes of one block's scales: one per token and KV head, for K and for V."""
        return 2 * self.block_size * self.num_kv_heads * dtype_size(self.scale_dtype)

    @property
    def unpadded_page_size_bytes(self) -> int:
        return self.real_page_size_bytes + self.scale_bytes

    def kv_cache_traits(self) -> SpecTraits:
        values = self.real_page_size_bytes
        scales = (self.block_size, self.num_kv_heads)
        return dataclasses.replace(
            FullAttentionSpec.kv_cache_traits(self),
            kind="ascend_int8_attention",
            device_views=(
                PageView(
                    name="kv",
                    dtype=torch.int8,
                    shape=(self.block_size, self.num_kv_heads, 2 * self.head_size),
                ),
                PageView(name="k_scale", dtype=self.scale_dtype, shape=scales, offset_bytes=values),
                PageView(
                    name="v_scale",
                    dtype=self.scale_dtype,
                    shape=scales,
                    offset_bytes=values + self.scale_bytes // 2,
                ),
            ),
            device_view_is_tuple=True,
        )


class AscendInt8AttentionManager(FullAttentionManager):
    """Full attention's block management; refuses specs whose scales it cannot place."""

    def setup(self) -> None:
        if getattr(self.kv_cache_spec, "scale_dtype", None) not in (
            torch.float16,
            torch.bfloat16,
            torch.float32,
        ):
            raise SpecValidationError("AscendInt8AttentionManager needs a float scale_dtype.")


CAPABILITIES = Capabilities(
    identifier="ascend.int8_attention", storage_layout="paged_kv", devices=frozenset({"npu", "cpu"})
)


def register(registry: AnyRegistry) -> None:
    """The plugin's entry point (``kvspec.plugins`` group, or a layout file's ``plugins``)."""
    registry.register(
        AscendInt8KVSpec, AscendInt8AttentionManager, FullAttentionSpec, capabilities=CAPABILITIES
    )
