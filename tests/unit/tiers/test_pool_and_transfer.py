"""The shared pool (Mooncake Store's batch eviction at its high-water mark) and transfer times."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.errors import TierConfigError
from kvspec.tiers import SharedPool, TierRequest, TransferModel, check_tier, offload_key, parse_link


def _key(i: int) -> bytes:
    return offload_key(i.to_bytes(8, "big"), 0)


def _put(pool: SharedPool, keys: list[bytes]) -> tuple[bytes, ...]:
    r = TierRequest("r")
    plan = pool.prepare_store(keys, r)
    assert plan is not None
    pool.complete_store(plan.keys_to_store, r)
    return plan.evicted_keys


def test_the_pool_evicts_five_percent_lru_first_above_its_high_water_mark() -> None:
    pool = SharedPool(100)
    for i in range(90):
        assert _put(pool, [_key(i)]) == ()
    assert _put(pool, [_key(0)]) == ()  # a re-offer touches key 0
    reader = TierRequest("reader")
    pool.prepare_load([_key(1)], reader)  # a load touches and pins key 1
    assert _put(pool, [_key(90)]) == tuple(_key(i) for i in range(2, 7))
    assert pool.num_blocks == 86 and pool.evictions == 1
    pool.complete_load([_key(1)], reader)


def test_a_put_the_pool_cannot_make_room_for_is_refused_whole() -> None:
    pool = SharedPool(2, high_watermark=1.0)
    _put(pool, [_key(1), _key(2)])
    r = TierRequest("r")
    pool.prepare_load([_key(1), _key(2)], r)
    assert pool.prepare_store([_key(3)], r) is None
    assert pool.num_blocks == 2


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), capacity=st.integers(1, 10))
def test_the_pool_keeps_the_kits_invariants(seed: int, capacity: int) -> None:
    check_tier("mooncake", capacity_blocks=capacity, seed=seed, steps=150)


def test_a_link_is_read_as_bandwidth_and_latency() -> None:
    default = TransferModel()
    assert parse_link("default", default) is default
    assert parse_link("8", default) == TransferModel(load_gb_per_s=8, store_gb_per_s=8)
    assert parse_link("8,50", default) == TransferModel(
        load_gb_per_s=8, store_gb_per_s=8, load_latency_us=50, store_latency_us=50
    )
    with pytest.raises(TierConfigError, match="give GB/s, or GB/s,latency-in-us"):
        parse_link("fast", default)
    with pytest.raises(TierConfigError, match="must be a positive number"):
        parse_link("0", default)


def test_a_transfer_costs_its_latency_plus_bytes_over_bandwidth() -> None:
    link = TransferModel(load_gb_per_s=10.0, store_gb_per_s=5.0, load_latency_us=20.0, store_latency_us=0.0)
    assert link.load_ms(10**9) == pytest.approx(0.02 + 100.0)
    assert link.store_ms(10**9) == pytest.approx(200.0)
    assert link.load_ms(0) == 0.0
    with pytest.raises(TierConfigError, match="load_gb_per_s must be a positive number"):
        TransferModel(load_gb_per_s=0)
    with pytest.raises(TierConfigError, match="store_latency_us must be a number >= 0"):
        TransferModel(store_latency_us=-1)
