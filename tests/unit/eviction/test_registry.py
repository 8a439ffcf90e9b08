"""Eviction policies by name: checked at the door, nothing half-applied, snapshot and restore."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvspec import KVCacheCoordinator, SchedulerLimits
from kvspec.blocks.eviction import EvictionContext
from kvspec.errors import EvictionPolicyError, KVSpecError, UnknownEvictionPolicyError
from kvspec.eviction import (
    LFUPolicy,
    ReleaseOrderLRU,
    eviction_policy_names,
    register_eviction_policy,
    resolve_eviction_policy,
    restore,
    snapshot,
)
from tests.helpers import full_spec, make_config, make_request


@pytest.fixture(autouse=True)
def saved_registry() -> Iterator[None]:
    saved = snapshot()
    yield
    restore(saved)


class NotAPolicy:
    def __init__(self, context: EvictionContext) -> None:
        pass

    def add(self, block: object) -> None:
        pass


def test_the_builtin_names() -> None:
    assert eviction_policy_names() == ("lru", "hybrid", "lfu", "retention", "slru")
    assert resolve_eviction_policy(None) is None and resolve_eviction_policy("lru") is None
    assert resolve_eviction_policy("lfu") is LFUPolicy


def test_a_plugin_policy_registers_and_resolves() -> None:
    register_eviction_policy("acme.release_order", ReleaseOrderLRU)
    assert "acme.release_order" in eviction_policy_names()
    assert resolve_eviction_policy("acme.release_order") is ReleaseOrderLRU
    register_eviction_policy("acme.release_order", ReleaseOrderLRU)  # the same factory again: a no-op


@pytest.mark.parametrize(
    ("name", "factory", "message"),
    [
        ("Bad Name", ReleaseOrderLRU, "must be dotted lower-case words"),
        ("lru", ReleaseOrderLRU, "vLLM's own free-queue order"),
        ("acme.x", 42, "must be callable"),
        ("acme.x", NotAPolicy, "not an EvictionPolicy \\(missing or not callable: remove, pop_victim"),
        ("acme.x", lambda ctx: 1 / 0, "raised ZeroDivisionError"),
        ("lfu", ReleaseOrderLRU, "'lfu' is already registered.*replace=True"),
    ],
)
def test_bad_registrations_are_refused_and_change_nothing(name: str, factory: object, message: str) -> None:
    before = eviction_policy_names()
    with pytest.raises(EvictionPolicyError, match=message):
        register_eviction_policy(name, factory)  # type: ignore[arg-type]
    assert eviction_policy_names() == before and resolve_eviction_policy("lfu") is LFUPolicy


def test_replace_takes_a_name_over_and_restore_puts_it_back() -> None:
    saved = snapshot()
    register_eviction_policy("lfu", ReleaseOrderLRU, replace=True)
    assert resolve_eviction_policy("lfu") is ReleaseOrderLRU
    restore(saved)
    assert resolve_eviction_policy("lfu") is LFUPolicy


def test_an_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(
        UnknownEvictionPolicyError, match="Unknown eviction policy 'fifo'; registered: lru, hybrid"
    ):
        resolve_eviction_policy("fifo")
    assert issubclass(UnknownEvictionPolicyError, (KVSpecError, LookupError))


def test_the_coordinator_takes_a_name_or_a_factory_and_refuses_a_bad_one() -> None:
    config = make_config([full_spec(block_size=4)], 8)
    limits = SchedulerLimits(max_model_len=64)
    coord = KVCacheCoordinator(config, limits, eviction_policy="slru")
    assert type(coord.block_pool.eviction_policy).__name__ == "SLRUPolicy"
    coord = KVCacheCoordinator(config, limits, eviction_policy=ReleaseOrderLRU)
    assert isinstance(coord.block_pool.eviction_policy, ReleaseOrderLRU)
    assert KVCacheCoordinator(config, limits).block_pool.eviction_policy is None
    with pytest.raises(UnknownEvictionPolicyError):
        KVCacheCoordinator(config, limits, eviction_policy="fifo")
    with pytest.raises(EvictionPolicyError, match="not an EvictionPolicy"):
        KVCacheCoordinator(config, limits, eviction_policy=NotAPolicy)  # type: ignore[arg-type]


def test_the_coordinator_tells_the_policy_about_hits_with_the_requests_asks() -> None:
    seen: list[tuple[str, int, float | None, list[int]]] = []

    class Recording(ReleaseOrderLRU):
        def on_hit(self, blocks, use):  # type: ignore[no-untyped-def]
            seen.append((use.request_id, use.priority, use.retention_seconds, [b.block_id for b in blocks]))

    coord = KVCacheCoordinator(
        make_config([full_spec(block_size=4)], 16),
        SchedulerLimits(max_model_len=64),
        eviction_policy=Recording,
    )
    first = make_request(coord, "a", list(range(10)))
    coord.allocate_slots(first, 10)
    coord.free(first)
    second = make_request(coord, "b", list(range(10)), priority=2, retention_seconds=7.5)
    computed, hit = coord.get_computed_blocks(second)
    assert hit == 8
    coord.allocate_slots(second, 2, hit, computed)
    assert seen == [("b", 2, 7.5, coord.get_block_ids("b")[0][:2])]
    coord.check_invariants()
