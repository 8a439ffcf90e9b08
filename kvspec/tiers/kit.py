"""The tier conformance kit: :func:`check_tier` runs a tier through seeded random traffic and checks what
an engine relies on. A ``PluginContractError`` names the first broken rule, the step and the key:

- a key never stored looks up ``MISS``; a key taken by ``prepare_store`` is not ``MISS``, and ``HIT`` once
  its store completed, until the tier reports it evicted;
- the tier never holds more than ``capacity_blocks`` keys;
- a key pinned by ``prepare_load`` is never evicted before ``complete_load``, nor is a key of the offer
  being stored;
- a removal event names only keys the tier reported evicted (or a failed store's), a store event only
  keys whose store completed;
- ``prepare_load`` of a key the tier does not hold ready raises a ``KVSpecError``;
- two tiers built alike, given the same calls, decide the same (it must be deterministic).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from kvspec.errors import KVSpecError, PluginContractError
from kvspec.tiers.base import LookupResult, OffloadKey, OffloadTier, StorePlan, TierRequest, offload_key
from kvspec.tiers.registry import TierContext, build_tier, resolve_tier


def _fail(name: str, step: int, what: str) -> PluginContractError:
    return PluginContractError(f"Tier {name!r}, step {step}: {what}")


def _run(tier: OffloadTier, name: str, seed: int, steps: int, trace: list[object]) -> None:
    """``steps`` random operations (store, lookup, load, finish) on ``tier``, every invariant checked after
    each, then a load of a key it lacks, which must raise a KVSpecError. ``trace`` records what it saw."""
    walk = _TierWalk(tier, name, trace)
    rng = random.Random(seed)
    requests: list[TierRequest] = []
    for step in range(steps):
        if not requests or rng.random() < 0.2:
            requests.append(TierRequest(f"r{step}"))
        request = rng.choice(requests)
        op = rng.random()
        walk.step = step
        if op < 0.45:
            if not walk.store(rng.sample(walk.keys, rng.randint(1, 6)), request):
                continue  # nothing stored: the next step checks
        elif op < 0.7:
            walk.lookup_and_load(rng, request)
        elif op < 0.85 and walk.pinned:
            walk.complete_load(rng.choice(sorted(walk.pinned)), request)
        else:
            tier.on_request_finished(request)
            requests.remove(request)
        walk.check_held(request)
        walk.check_events()
    absent = offload_key(b"\xff" * 8, 0)
    try:
        tier.prepare_load([absent], TierRequest("kit"))
    except KVSpecError:
        pass
    except Exception as exc:
        raise _fail(
            name, steps, f"prepare_load of a key it lacks raised {type(exc).__name__}, not a KVSpecError"
        ) from exc
    else:
        raise _fail(name, steps, "prepare_load of a key it does not hold did not raise")


class _TierWalk:
    """What the kit knows a tier holds, and the checks of each operation against it: a key stored and
    never reported evicted looks up HIT; a key never stored, or reported evicted, looks up MISS; an
    eviction never takes a pinned, offered or pending key; events name only keys stored or evicted."""

    def __init__(self, tier: OffloadTier, name: str, trace: list[object]) -> None:
        self.tier = tier
        self.name = name
        self.trace = trace
        self.step = 0
        self.keys = [offload_key(i.to_bytes(8, "big"), i % 2) for i in range(24)]
        self.stored: set[OffloadKey] = set()  # completed and not reported evicted
        self.pending: set[OffloadKey] = set()
        self.pinned: dict[OffloadKey, int] = {}
        self.evicted_ever: set[OffloadKey] = set()
        self.completed_ever: set[OffloadKey] = set()

    def _fail(self, message: str) -> PluginContractError:
        return _fail(self.name, self.step, message)

    def store(self, offer: list[OffloadKey], request: TierRequest) -> bool:
        """Offer ``offer`` for storing and complete what the tier takes; False when it declines (None)."""
        tier = self.tier
        for i, key in enumerate(offer):
            request.set_position(key, 16 * (i + 1))
        plan = tier.prepare_store(offer, request)
        self.trace.append(("store", tuple(offer), plan))
        if plan is None:
            return False
        if not isinstance(plan, StorePlan):
            raise self._fail(f"prepare_store returned {type(plan).__name__}, not a StorePlan or None")
        for key in plan.evicted_keys:
            if key in self.pinned:
                raise self._fail(f"evicted key {key.hex()} while a load pinned it")
            if key in offer:
                raise self._fail(f"evicted key {key.hex()} of the offer being stored")
            if key in self.pending:
                raise self._fail(f"evicted key {key.hex()} whose store had not completed")
            self.stored.discard(key)
            self.evicted_ever.add(key)
            if tier.lookup(key, request) is not LookupResult.MISS:
                raise self._fail(f"key {key.hex()} reported evicted still looks up as held")
        for key in plan.keys_to_store:
            if key not in offer:
                raise self._fail(f"took key {key.hex()} that was not offered")
            if tier.lookup(key, request) is LookupResult.MISS:
                raise self._fail(f"key {key.hex()} taken for storing looks up MISS")
            self.pending.add(key)
        if tier.num_blocks > tier.capacity_blocks:
            raise self._fail(f"holds {tier.num_blocks} keys, capacity {tier.capacity_blocks}")
        done = list(plan.keys_to_store)
        tier.complete_store(done, request)
        self.pending.difference_update(done)
        self.stored.update(done)
        self.completed_ever.update(done)
        return True

    def lookup_and_load(self, rng: random.Random, request: TierRequest) -> None:
        ready = [k for k in self.keys if self.tier.lookup(k, request) is LookupResult.HIT]
        self.trace.append(("lookup", tuple(ready)))
        for key in self.stored:
            if key not in ready:
                raise self._fail(f"key {key.hex()} stored and never reported evicted looks up MISS")
        if ready:
            chosen = rng.sample(ready, rng.randint(1, min(3, len(ready))))
            self.tier.prepare_load(chosen, request)
            for key in chosen:
                self.pinned[key] = self.pinned.get(key, 0) + 1

    def complete_load(self, key: OffloadKey, request: TierRequest) -> None:
        self.tier.complete_load([key], request)
        self.pinned[key] -= 1
        if not self.pinned[key]:
            del self.pinned[key]

    def check_held(self, request: TierRequest) -> None:
        for key in self.keys:
            if (
                key not in self.stored
                and key not in self.pending
                and self.tier.lookup(key, request) is not LookupResult.MISS
            ):
                raise self._fail(f"key {key.hex()} looks up as held: never stored, or reported evicted")

    def check_events(self) -> None:
        for event in self.tier.take_events():
            self.trace.append(("event", event.keys, event.removed))
            if event.removed and not event.metadata_only:
                strays = [k for k in event.keys if k not in self.evicted_ever]
                if strays:
                    raise self._fail(f"a removal event names {strays[0].hex()}, never reported evicted")
            elif not event.removed:
                strays = [k for k in event.keys if k not in self.completed_ever]
                if strays:
                    raise self._fail(f"a store event names {strays[0].hex()}, whose store never completed")


def check_tier(
    tier: str | Callable[[TierContext], OffloadTier],
    *,
    capacity_blocks: int = 8,
    options: dict[str, str | float] | None = None,
    seed: int = 0,
    steps: int = 400,
) -> None:
    """Run the tier named ``tier`` (or built by a factory) through ``steps`` random calls, twice; raise a
    ``PluginContractError`` at the first broken rule (see the module docstring)."""
    if isinstance(tier, str):
        spec = resolve_tier(tier)
        name = tier

        def make() -> OffloadTier:
            return build_tier(spec, TierContext(capacity_blocks=capacity_blocks, options=options or {}))

    else:
        factory = tier
        name = getattr(factory, "__name__", type(factory).__name__)

        def make() -> OffloadTier:
            return factory(TierContext(capacity_blocks=capacity_blocks, options=options or {}))

    first: list[object] = []
    second: list[object] = []
    _run(make(), name, seed, steps, first)
    _run(make(), name, seed, steps, second)
    for step, (a, b) in enumerate(zip(first, second, strict=False)):
        if a != b:
            raise _fail(name, step, f"two tiers built alike decided differently: {a!r} against {b!r}")
    if len(first) != len(second):
        raise _fail(name, steps, "two tiers built alike made a different number of decisions")


__all__ = ["check_tier"]
