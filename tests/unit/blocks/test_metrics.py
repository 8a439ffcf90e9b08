"""Block residency metrics: the collector's arithmetic, and the pool telling it about blocks."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any
from unittest.mock import patch

import pytest

from kvspec.blocks.metrics import KVCacheMetricsCollector
from kvspec.blocks.pool import BlockPool
from kvspec.errors import UnsupportedConfigurationError

S = 1_000_000_000


def at(seconds: float) -> AbstractContextManager[Any]:
    return patch("time.monotonic_ns", return_value=int(seconds * S))


@pytest.mark.parametrize("rate", [0, -0.1, 1.5, float("nan"), True, "0.5"])
def test_sample_rate_outside_0_1_is_refused(rate: object) -> None:
    with pytest.raises(UnsupportedConfigurationError, match=r"sample_rate must be in \(0, 1\]"):
        KVCacheMetricsCollector(sample_rate=rate)  # type: ignore[arg-type]


def test_pool_reports_allocation_hits_and_reallocation() -> None:
    pool = BlockPool(4, enable_caching=True, hash_block_size=1)
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    pool.metrics_collector = collector
    with at(1):
        (block,) = pool.get_new_blocks(1)
    assert set(collector.block_metrics) == {block.block_id}
    with at(2):
        pool.touch([block])
    with at(3.5):
        pool.touch([block])
    pool.free_blocks([block, block, block])  # its allocation and two hits
    assert collector.drain_events() == []  # freed but not evicted: the content may still be hit
    with at(4):
        taken = pool.get_new_blocks(3)  # the whole pool: the block is reallocated
    assert block in taken
    (event,) = collector.drain_events()
    assert event.lifetime_seconds == pytest.approx(3.0)
    assert event.idle_seconds == pytest.approx(0.5)
    assert event.reuse_gaps_seconds == pytest.approx((1.5,))
    assert set(collector.block_metrics) == {b.block_id for b in taken}


def test_explicit_eviction_and_reset() -> None:
    pool = BlockPool(4, enable_caching=True, hash_block_size=1)
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    pool.metrics_collector = collector
    with at(1):
        blocks = pool.get_new_blocks(2)
    with at(3):
        pool.evict_blocks([blocks[0].block_id])
    (event,) = collector.drain_events()
    assert event.lifetime_seconds == pytest.approx(2.0) and event.reuse_gaps_seconds == ()
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache()
    assert collector.block_metrics == {}


def test_access_history_keeps_the_last_four_accesses() -> None:
    pool = BlockPool(2, enable_caching=True, hash_block_size=1)
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    pool.metrics_collector = collector
    with at(0):
        (block,) = pool.get_new_blocks(1)
    for t in (1, 2, 4, 7, 11):
        with at(t):
            pool.touch([block])
    with at(12):
        pool.evict_blocks([block.block_id])
    (event,) = collector.drain_events()
    assert event.reuse_gaps_seconds == pytest.approx((2.0, 3.0, 4.0))
    assert event.idle_seconds == pytest.approx(1.0)
