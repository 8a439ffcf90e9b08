"""The shared pool (Mooncake Store's batch eviction at its high-water mark) and transfer times and sizes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.errors import TierConfigError
from kvspec.tiers import SharedPool, TierRequest, TransferModel, check_tier, offload_key, parse_bytes


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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256GiB", 256 * 2**30),
        ("3TiB", 3 * 2**40),
        ("1.5TB", 1_500_000_000_000),
        ("0", 0),
        (4096, 4096),
        ("64 kb", 64_000),
    ],
)
def test_sizes_are_read_in_decimal_and_binary_units(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-3GiB"])
def test_an_unreadable_size_names_the_units(text: str) -> None:
    with pytest.raises(TierConfigError, match="KiB, MiB, GiB, TiB"):
        parse_bytes(text)


def test_a_transfer_costs_its_latency_plus_bytes_over_bandwidth() -> None:
    link = TransferModel(load_gb_per_s=10.0, store_gb_per_s=5.0, load_latency_us=20.0, store_latency_us=0.0)
    assert link.load_ms(10**9) == pytest.approx(0.02 + 100.0)
    assert link.store_ms(10**9) == pytest.approx(200.0)
    assert link.load_ms(0) == 0.0
    with pytest.raises(TierConfigError, match="load_gb_per_s must be a positive number"):
        TransferModel(load_gb_per_s=0)
    with pytest.raises(TierConfigError, match="store_latency_us must be a number >= 0"):
        TransferModel(store_latency_us=-1)
