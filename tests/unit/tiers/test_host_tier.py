"""The host tier's rules on exact scenarios (vLLM 0.34's CPU offloading; tests/vllm/test_offload_vs_vllm.py
holds it to vLLM's own manager), and its invariants under random traffic (hypothesis, through the kit)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.errors import KVSpecError, TierConfigError, TierStateError, UnknownTierError
from kvspec.tiers import HostTier, LookupResult, TierRequest, check_tier, offload_key


def _key(i: int, group: int = 0) -> bytes:
    return offload_key(i.to_bytes(8, "big"), group)


def _store(
    tier: HostTier, request: TierRequest, keys: list[bytes], *, positions: bool = True
) -> tuple[bytes, ...]:
    if positions:
        for i, key in enumerate(keys):
            request.set_position(key, 16 * (i + 1))
    plan = tier.prepare_store(keys, request)
    assert plan is not None
    tier.complete_store(plan.keys_to_store, request)
    return plan.evicted_keys


def test_lru_evicts_a_finished_request_tail_first() -> None:
    tier = HostTier(3)
    a, b, c, d = _key(1), _key(2), _key(3), _key(4)
    r1 = TierRequest("r1")
    _store(tier, r1, [a, b, c])
    tier.on_request_finished(r1)
    evicted: list[bytes] = []
    for i, key in enumerate([d, _key(5), _key(6)]):
        evicted += _store(tier, TierRequest(f"n{i}"), [key], positions=False)
    assert evicted == [c, b, a]  # the tail (c) is the least recent, the head (a) the most


def test_a_pinned_key_is_not_evicted_and_a_store_that_cannot_make_room_changes_nothing() -> None:
    tier = HostTier(2)
    a, b = _key(1), _key(2)
    _store(tier, TierRequest("r1"), [a, b])
    reader = TierRequest("reader")
    tier.prepare_load([a], reader)
    assert _store(tier, TierRequest("r2"), [_key(3)]) == (b,)
    tier.prepare_load([_key(3)], reader)
    assert tier.prepare_store([_key(4)], TierRequest("r3")) is None  # both held keys are pinned
    assert tier.lookup(_key(4), reader) is LookupResult.MISS
    assert tier.lookup(a, reader) is LookupResult.HIT and tier.num_blocks == 2
    tier.complete_load([a], reader)
    assert _store(tier, TierRequest("r4"), [_key(4)]) == (a,)


def test_an_offered_key_is_never_evicted_for_its_own_offer() -> None:
    tier = HostTier(2)
    a, b = _key(1), _key(2)
    _store(tier, TierRequest("r1"), [a, b])
    # a and b are idle, but both are part of the offer: nothing can make room for c.
    assert tier.prepare_store([a, b, _key(3)], TierRequest("r2")) is None


def test_arc_keeps_a_reused_key_through_a_scan_that_lru_evicts() -> None:
    kept = {}
    for policy in ("lru", "arc"):
        tier = HostTier(2, policy=policy)
        hot = _key(1)
        _store(tier, TierRequest("w"), [hot], positions=False)
        reader = TierRequest("reader")
        tier.prepare_load([hot], reader)
        tier.complete_load([hot], reader)
        tier.on_request_finished(reader)
        for i in range(2, 6):  # one-time keys, each its own request
            scan = TierRequest(f"s{i}")
            _store(tier, scan, [_key(i)], positions=False)
            tier.on_request_finished(scan)
        kept[policy] = tier.lookup(hot, reader)
    assert kept == {"lru": LookupResult.MISS, "arc": LookupResult.HIT}


def test_a_store_is_pending_until_it_completes_and_a_failed_one_is_released() -> None:
    tier = HostTier(4)
    r = TierRequest("r")
    plan = tier.prepare_store([_key(1), _key(2)], r)
    assert plan is not None and plan.keys_to_store == (_key(1), _key(2))
    assert tier.lookup(_key(1), r) is LookupResult.HIT_PENDING
    with pytest.raises(TierStateError, match="does not hold ready"):
        tier.prepare_load([_key(1)], r)
    tier.complete_store([_key(1)], r)
    tier.complete_store([_key(2)], r, success=False)
    assert tier.lookup(_key(1), r) is LookupResult.HIT
    assert tier.lookup(_key(2), r) is LookupResult.MISS
    events = tier.take_events()
    assert [(e.keys, e.removed, e.metadata_only) for e in events] == [
        ((_key(1),), False, False),
        ((_key(2),), True, True),
    ]
    assert tier.take_events() == []


def test_the_store_threshold_counts_each_request_once() -> None:
    tier = HostTier(4, store_threshold=2)
    a = _key(1)
    first = TierRequest("r1")
    for _ in range(3):  # a request's re-offers are one use
        plan = tier.prepare_store([a], first)
        assert plan is not None and plan.keys_to_store == ()
    assert tier.stores_skipped == 1
    plan = tier.prepare_store([a], TierRequest("r2"))
    assert plan is not None and plan.keys_to_store == (a,)


def test_bad_settings_and_calls_are_refused_by_name() -> None:
    with pytest.raises(TierConfigError, match="at least one block"):
        HostTier(0)
    with pytest.raises(TierConfigError, match="store_threshold"):
        HostTier(4, store_threshold=0)
    with pytest.raises(UnknownTierError, match="known: arc, lru"):
        HostTier(4, policy="mru")
    tier = HostTier(4)
    with pytest.raises(TierStateError, match="no prepare_load pinned"):
        tier.complete_load([_key(1)], TierRequest("r"))
    done = TierRequest("done")
    _store(tier, done, [_key(1)])
    tier.on_request_finished(done)
    with pytest.raises(KVSpecError, match="after it finished"):
        tier.prepare_store([_key(2)], done)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    capacity=st.integers(1, 12),
    policy=st.sampled_from(["lru", "arc"]),
    threshold=st.integers(1, 3),
)
def test_host_tier_keeps_the_kits_invariants_under_random_traffic(
    seed: int, capacity: int, policy: str, threshold: int
) -> None:
    check_tier(
        "host",
        capacity_blocks=capacity,
        options={"policy": policy, "store_threshold": threshold},
        seed=seed,
        steps=150,
    )
