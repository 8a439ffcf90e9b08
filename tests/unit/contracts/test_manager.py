"""The manager API (kvspec.contracts.manager): the context a manager is built from, hit values, the protocol."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvspec import (
    BlockPool,
    FullAttentionManager,
    FullAttentionSpec,
    HitResult,
    KVCacheManager,
    ManagerContext,
)
from kvspec.contracts.traits import traits_of

SPEC = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16)


def test_context_block_size_spans_the_context_parallel_ranks() -> None:
    pool = BlockPool(8)
    context = ManagerContext.for_spec(SPEC, pool)
    assert context.block_size == 16 and context.scheduler_block_size == 16
    assert context.traits == traits_of(SPEC) and context.kv_cache_group_id == 0
    wide = dataclasses.replace(context, dcp_world_size=2, pcp_world_size=4)
    assert wide.block_size == 128
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.enable_caching = False  # type: ignore[misc]


def test_the_manager_reads_its_settings_from_the_context() -> None:
    pool = BlockPool(8)
    context = dataclasses.replace(
        ManagerContext.for_spec(SPEC, pool, kv_cache_group_id=3, max_admission_blocks_per_request=2),
        dcp_world_size=2,
    )
    manager = FullAttentionManager(context)
    assert manager.context is context
    assert (manager.block_size, manager.kv_cache_group_id, manager.block_pool) == (32, 3, pool)
    # The admission cap in the context bounds what a full-sequence admission counts.
    assert manager.get_num_blocks_to_allocate("r", 32 * 5, (), 0, 32 * 5, apply_admission_cap=True) == 2
    assert manager.get_num_blocks_to_allocate("r", 32 * 5, (), 0, 32 * 5) == 5


def test_hit_result_counts_blocks_of_the_first_group() -> None:
    pool = BlockPool(4)
    assert HitResult(()).num_blocks == 0
    assert HitResult(([pool.blocks[1], pool.blocks[2]], [pool.null_block, pool.blocks[3]])).num_blocks == 2


def test_the_protocol_is_checked_structurally() -> None:
    assert isinstance(FullAttentionManager(ManagerContext.for_spec(SPEC, BlockPool(4))), KVCacheManager)

    class Partial:
        def free(self, request_id: str) -> None: ...

    assert not isinstance(Partial(), KVCacheManager)
