"""A compressed block domain: each block row holds ``compress_ratio`` tokens (a compressed latent cache in
the style of vllm-ascend's CompressAttentionManager, written for kvspec).

A block has ``block_size`` rows, so it holds ``block_size * compress_ratio`` logical tokens. The spec says so
once (``SpecTraits.tokens_per_block``) and kvspec counts allocation, caching, hashing and hits in logical
tokens. The manager reports its hits in those tokens (``HitResult.num_tokens``), sizes the block-table row
from the scheduler's ``max_model_len`` (``ManagerContext``), and is chosen per spec *instance*: an
uncompressed instance (``compress_ratio == 1``) runs the plain full-attention manager
(``register(..., manager_for=...)``).
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
    FullAttentionManager,
    KVCacheManager,
    PageView,
    SchedulerLimits,
    SpecCollection,
    SpecTraits,
    SpecValidationError,
    as_spec_list,
)
from kvspec.blocks.pool import KVCacheBlock
from kvspec.contracts.manager import HitQuery, HitResult
from kvspec.errors import SpecMergeError, UnsupportedConfigurationError
from kvspec.intmath import cdiv
from kvspec.specs.dtypes import dtype_size


@dataclass(frozen=True, kw_only=True, slots=True)
class CompressedLatentSpec:
    """One latent vector of ``head_size`` elements per row; a row covers ``compress_ratio`` tokens."""

    block_size: int  # rows per block
    head_size: int
    dtype: torch.dtype
    compress_ratio: int = 4

    def __post_init__(self) -> None:
        for name in ("block_size", "head_size", "compress_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecValidationError(
                    f"CompressedLatentSpec.{name} must be a positive int, got {value!r}."
                )

    @property
    def tokens_per_block(self) -> int:
        return self.block_size * self.compress_ratio

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.head_size * dtype_size(self.dtype)

    def max_memory_usage_bytes(self, limits: SchedulerLimits) -> int:
        return cdiv(limits.max_model_len, self.tokens_per_block) * self.page_size_bytes

    def copy_with_new_block_size(self, block_size: int) -> Self:
        return dataclasses.replace(self, block_size=block_size)

    @classmethod
    def merge(cls, specs: Sequence[Self]) -> Self:
        if not specs or any(s != specs[0] for s in specs):
            raise SpecMergeError("CompressedLatentSpec layers of one group must be identical.")
        return specs[0]

    def is_uniform_with_collection(self, specs: SpecCollection) -> bool:
        return all(
            isinstance(s, CompressedLatentSpec) and s.compress_ratio == self.compress_ratio
            for s in as_spec_list(specs)
        )

    def kv_cache_traits(self) -> SpecTraits:
        return SpecTraits(
            prefix_hits_left_closed=True,
            tokens_per_block=self.tokens_per_block if self.compress_ratio > 1 else None,
            kind="acme_compressed_latent",
            device_views=(
                PageView(name="latent", dtype=self.dtype, shape=(self.block_size, self.head_size)),
            ),
        )


class CompressedLatentManager(FullAttentionManager):
    """Full attention over compressed rows: hits in logical tokens, requests bounded by max_model_len."""

    #: Blocks one request may hold (a block-table row); None: unbounded. Set in ``setup``, declared here so
    #: that every checker knows the attribute (basedpyright requires it in the class body or ``__init__``).
    max_blocks_per_request: int | None = None

    def setup(self) -> None:
        super().setup()
        max_model_len = self.context.max_model_len
        # A runner sizes its block table from max_model_len: no request may hold more blocks than a row has.
        self.max_blocks_per_request = None if max_model_len is None else cdiv(max_model_len, self.block_size)

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        hit = super().find_longest_cache_hit(query)
        per_block = query.traits.block_tokens(query.kv_cache_spec.block_size)
        return HitResult(hit.blocks, num_tokens=hit.num_blocks * per_block)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        limit = self.max_blocks_per_request
        if limit is not None and cdiv(num_tokens, self.block_size) > limit:
            raise UnsupportedConfigurationError(
                f"Request {request_id!r} needs {cdiv(num_tokens, self.block_size)} compressed blocks, more than "
                f"the {limit} a block-table row holds at max_model_len={self.context.max_model_len}."
            )
        return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)


def manager_for(spec: CompressedLatentSpec) -> type[KVCacheManager]:
    """Compressed instances run the compressed manager; ``compress_ratio == 1`` is plain full attention."""
    return CompressedLatentManager if spec.compress_ratio > 1 else FullAttentionManager


CAPABILITIES = Capabilities(identifier="acme.compressed_latent", storage_layout="paged_kv")


def register(registry: AnyRegistry) -> None:
    registry.register(
        CompressedLatentSpec, CompressedLatentManager, capabilities=CAPABILITIES, manager_for=manager_for
    )
