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
    rng = random.Random(seed)
    keys = [offload_key(i.to_bytes(8, "big"), i % 2) for i in range(24)]
    stored: set[OffloadKey] = set()  # completed and not reported evicted
    pending: set[OffloadKey] = set()
    pinned: dict[OffloadKey, int] = {}
    requests: list[TierRequest] = []
    evicted_ever: set[OffloadKey] = set()
    completed_ever: set[OffloadKey] = set()
    for step in range(steps):
        if not requests or rng.random() < 0.2:
            requests.append(TierRequest(f"r{step}"))
        request = rng.choice(requests)
        op = rng.random()
        if op < 0.45:
            offer = rng.sample(keys, rng.randint(1, 6))
            for i, key in enumerate(offer):
                request.set_position(key, 16 * (i + 1))
            plan = tier.prepare_store(offer, request)
            trace.append(("store", tuple(offer), plan))
            if plan is None:
                continue
            if not isinstance(plan, StorePlan):
                raise _fail(
                    name, step, f"prepare_store returned {type(plan).__name__}, not a StorePlan or None"
                )
            for key in plan.evicted_keys:
                if key in pinned:
                    raise _fail(name, step, f"evicted key {key.hex()} while a load pinned it")
                if key in offer:
                    raise _fail(name, step, f"evicted key {key.hex()} of the offer being stored")
                if key in pending:
                    raise _fail(name, step, f"evicted key {key.hex()} whose store had not completed")
                stored.discard(key)
                evicted_ever.add(key)
                if tier.lookup(key, request) is not LookupResult.MISS:
                    raise _fail(name, step, f"key {key.hex()} reported evicted still looks up as held")
            for key in plan.keys_to_store:
                if key not in offer:
                    raise _fail(name, step, f"took key {key.hex()} that was not offered")
                if tier.lookup(key, request) is LookupResult.MISS:
                    raise _fail(name, step, f"key {key.hex()} taken for storing looks up MISS")
                pending.add(key)
            if tier.num_blocks > tier.capacity_blocks:
                raise _fail(name, step, f"holds {tier.num_blocks} keys, capacity {tier.capacity_blocks}")
            done = list(plan.keys_to_store)
            tier.complete_store(done, request)
            pending.difference_update(done)
            stored.update(done)
            completed_ever.update(done)
        elif op < 0.7:
            ready = [k for k in keys if tier.lookup(k, request) is LookupResult.HIT]
            trace.append(("lookup", tuple(ready)))
            for key in stored:
                if key not in ready:
                    raise _fail(
                        name, step, f"key {key.hex()} stored and never reported evicted looks up MISS"
                    )
            if ready:
                chosen = rng.sample(ready, rng.randint(1, min(3, len(ready))))
                tier.prepare_load(chosen, request)
                for key in chosen:
                    pinned[key] = pinned.get(key, 0) + 1
        elif op < 0.85 and pinned:
            key = rng.choice(sorted(pinned))
            tier.complete_load([key], request)
            pinned[key] -= 1
            if not pinned[key]:
                del pinned[key]
        else:
            tier.on_request_finished(request)
            requests.remove(request)
        for key in keys:
            if (
                key not in stored
                and key not in pending
                and tier.lookup(key, request) is not LookupResult.MISS
            ):
                raise _fail(
                    name, step, f"key {key.hex()} looks up as held: never stored, or reported evicted"
                )
        for event in tier.take_events():
            trace.append(("event", event.keys, event.removed))
            if event.removed and not event.metadata_only:
                strays = [k for k in event.keys if k not in evicted_ever]
                if strays:
                    raise _fail(
                        name, step, f"a removal event names {strays[0].hex()}, never reported evicted"
                    )
            elif not event.removed:
                strays = [k for k in event.keys if k not in completed_ever]
                if strays:
                    raise _fail(
                        name, step, f"a store event names {strays[0].hex()}, whose store never completed"
                    )
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
