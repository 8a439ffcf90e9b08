"""Tiers by name, checked at the door, and the conformance kit catching broken tiers."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

import pytest

from kvspec.errors import OptionValueError, PluginContractError, TierConfigError, TierError, UnknownTierError
from kvspec.tiers import (
    HostTier,
    LookupResult,
    OffloadTier,
    StorePlan,
    TierContext,
    TierEvent,
    TierRequest,
    build_tier,
    check_tier,
    register_tier,
    registry,
    resolve_tier,
    tier_names,
)


@pytest.fixture(autouse=True)
def _restore_registry() -> Iterator[None]:
    saved = registry.snapshot()
    yield
    registry.restore(saved)


def test_the_built_ins_are_registered_and_pass_the_kit() -> None:
    assert {"host", "mooncake"} <= set(tier_names())
    check_tier("host")
    check_tier("host", options={"policy": "arc", "store_threshold": 2})
    check_tier("mooncake")


def test_the_door_refuses_bad_registrations_by_name() -> None:
    with pytest.raises(TierError, match="dotted lower-case words"):
        register_tier("Host Tier", lambda c: HostTier(c.capacity_blocks))
    with pytest.raises(TierError, match="must be callable"):
        register_tier("acme.nvme", "not a factory")  # type: ignore[arg-type]
    with pytest.raises(TierError, match="without lookup, prepare_load"):
        register_tier("acme.empty", lambda c: object())  # type: ignore[arg-type,return-value]
    with pytest.raises(TierError, match="the factory raised ZeroDivisionError"):
        register_tier("acme.broken", lambda c: HostTier(1 // 0))
    with pytest.raises(TierError, match="already registered"):
        register_tier("host", lambda c: HostTier(c.capacity_blocks))
    assert "acme.nvme" not in tier_names()
    with pytest.raises(UnknownTierError, match=r"registered: .*host.*mooncake"):
        resolve_tier("acme.nvme")
    with pytest.raises(
        TierConfigError,
        match=r"Tier 'host' takes no option 'ttl'; its options: policy \(default 'lru'\), store_threshold",
    ):
        build_tier(resolve_tier("host"), TierContext(capacity_blocks=4, options={"ttl": 3.0}))
    # Values are checked against the declared kinds, in the wording every registry uses.
    with pytest.raises(
        OptionValueError, match=r"Tier 'host': option 'store_threshold' must be a whole number, got 1\.5"
    ):
        build_tier(resolve_tier("host"), TierContext(capacity_blocks=4, options={"store_threshold": 1.5}))
    with pytest.raises(
        TierConfigError, match="Tier 'mooncake': option 'high_watermark' must be a number, got 'x'"
    ):
        build_tier(resolve_tier("mooncake"), TierContext(capacity_blocks=4, options={"high_watermark": "x"}))


class _Broken:
    """A host tier with one rule broken (``flaw``)."""

    def __init__(self, capacity: int, flaw: str) -> None:
        self._inner = HostTier(capacity)
        self._flaw = flaw
        self._calls = 0

    @property
    def medium(self) -> str:
        return self._inner.medium

    @property
    def capacity_blocks(self) -> int:
        return self._inner.capacity_blocks - (1 if self._flaw == "capacity" else 0)

    @property
    def num_blocks(self) -> int:
        return self._inner.num_blocks

    def lookup(self, key: bytes, request: TierRequest) -> LookupResult:
        return self._inner.lookup(key, request)

    def prepare_load(self, keys: Collection[bytes], request: TierRequest) -> None:
        if self._flaw == "pin":
            return  # never pins: its keys can be evicted under a load
        self._inner.prepare_load(keys, request)

    def complete_load(self, keys: Collection[bytes], request: TierRequest) -> None:
        if self._flaw != "pin":
            self._inner.complete_load(keys, request)

    def prepare_store(self, keys: Sequence[bytes], request: TierRequest) -> StorePlan | None:
        self._calls += 1
        if self._flaw == "random" and id(self) % 7 == self._calls % 7:
            return None
        return self._inner.prepare_store(keys, request)

    def complete_store(self, keys: Collection[bytes], request: TierRequest, success: bool = True) -> None:
        self._inner.complete_store(keys, request, success)

    def on_request_finished(self, request: TierRequest) -> None:
        self._inner.on_request_finished(request)

    def take_events(self) -> list[TierEvent]:
        return self._inner.take_events()

    def reset(self) -> None:
        self._inner.reset()


@pytest.mark.parametrize(
    ("flaw", "message"),
    [
        ("pin", "while a load pinned it|looks up MISS"),
        ("capacity", "holds .* keys, capacity"),
        ("random", "decided differently|different number"),
    ],
)
def test_the_kit_catches_a_broken_tier(flaw: str, message: str) -> None:
    def factory(context: TierContext) -> OffloadTier:
        return _Broken(context.capacity_blocks, flaw)

    with pytest.raises(PluginContractError, match=message):
        for seed in range(5):
            check_tier(factory, seed=seed)


def test_a_registered_plugin_tier_runs_in_the_kit() -> None:
    register_tier("acme.small_host", lambda c: HostTier(c.capacity_blocks, policy="arc"), description="ARC")
    check_tier("acme.small_host", capacity_blocks=3)
