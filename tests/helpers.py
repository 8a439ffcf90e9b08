"""Builders shared by the runtime tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from typing_extensions import Self

from kvspec import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheCoordinator,
    KVCacheGroupSpec,
    KVCacheSpec,
    Request,
    SchedulerLimits,
    SlidingWindowSpec,
    SpecCollection,
)
from kvspec.contracts.release import ReleaseProfile


def full_spec(block_size: int = 16, dtype: torch.dtype = torch.float32, heads: int = 1) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=1, dtype=dtype)


def sw_spec(window: int, block_size: int = 16, dtype: torch.dtype = torch.float32) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=dtype, sliding_window=window
    )


def make_config(specs: Sequence[KVCacheSpec], num_blocks: int) -> KVCacheConfig:
    groups = tuple(
        KVCacheGroupSpec(layer_names=(f"layer_{i}",), kv_cache_spec=spec) for i, spec in enumerate(specs)
    )
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=(), kv_cache_groups=groups)


def make_coordinator(
    specs: Sequence[KVCacheSpec],
    num_blocks: int,
    *,
    max_model_len: int = 8192,
    max_num_batched_tokens: int | None = None,
    enable_caching: bool = True,
    use_eagle: bool = False,
    events: bool = False,
    log_stats: bool = False,
    hash_algorithm: str = "sha256",
    profile: ReleaseProfile | None = None,
) -> KVCacheCoordinator:
    return KVCacheCoordinator(
        make_config(specs, num_blocks),
        SchedulerLimits(max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens),
        enable_caching=enable_caching,
        use_eagle=use_eagle,
        enable_kv_cache_events=events,
        log_stats=log_stats,
        hash_algorithm=hash_algorithm,
        profile=profile,
    )


def make_request(
    coord: KVCacheCoordinator, request_id: str, tokens: Sequence[int], **kwargs: object
) -> Request:
    return Request(request_id, tokens, block_hasher=coord.make_block_hasher(seed="tests"), **kwargs)  # type: ignore[arg-type]


def ids(blocks: Sequence[object]) -> list[int]:
    return [b.block_id for b in blocks]  # type: ignore[attr-defined]


def free_ids(coord: KVCacheCoordinator) -> list[int]:
    return [b.block_id for b in coord.block_pool.free_block_queue.get_all_free_blocks()]


def schedule(
    coord: KVCacheCoordinator, request: Request, num_new_tokens: int | None = None
) -> list[list[int]]:
    """Admit ``request`` with its prefix hit and allocate the rest of its tokens; returns new block ids."""
    computed, num_computed = coord.get_computed_blocks(request)
    n = request.num_tokens - num_computed if num_new_tokens is None else num_new_tokens
    new = coord.allocate_slots(request, n, num_computed, computed)
    assert new is not None
    request.num_computed_tokens = num_computed + n
    return [list(g) for g in new.get_block_ids()]


@dataclass(frozen=True, kw_only=True, slots=True)
class ForeignSpec:
    """A spec that satisfies KVCacheSpec structurally but whose lineage no registry knows."""

    block_size: int = 16
    page_size_bytes: int = 64

    def max_memory_usage_bytes(self, limits: SchedulerLimits) -> int:
        return self.page_size_bytes

    def copy_with_new_block_size(self, block_size: int) -> Self:
        return self

    @classmethod
    def merge(cls, specs: Sequence[Self]) -> Self:
        return specs[0]

    def is_uniform_with_collection(self, specs: SpecCollection) -> bool:
        return True
