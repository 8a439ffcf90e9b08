"""Offload tiers by name: a thread-safe registry checked at the door, with snapshot and restore (tests).

A tier is registered as a factory from a :class:`TierContext` (its capacity in blocks, the bytes of one
block, its own options by name) to an :class:`~kvspec.tiers.base.OffloadTier`. Registration builds the tier
once on a small context and refuses, with a ``TierError``, a name that is not dotted lower-case words, a
factory that is not callable, fails, or returns something without every call of the protocol, and options
the tier does not list. Built in: ``host`` (vLLM 0.34's CPU tier; options ``policy`` "lru" | "arc",
``store_threshold``) and ``mooncake`` (a shared pool; options ``high_watermark``, ``eviction_ratio``). The
conformance kit (:func:`kvspec.tiers.kit.check_tier`) goes further: it runs the tier.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kvspec.errors import TierConfigError, TierError, UnknownTierError
from kvspec.tiers.base import MEDIUM_CPU, MEDIUM_STORAGE, OffloadTier
from kvspec.tiers.host import HostTier
from kvspec.tiers.pool import SharedPool

_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")


@dataclass(frozen=True, kw_only=True, slots=True)
class TierContext:
    """What a tier is built with: ``capacity_blocks`` (keys it may hold, >= 1), ``block_bytes`` (one
    block, for tiers that account bytes) and ``options`` (its own settings, by name)."""

    capacity_blocks: int
    block_bytes: int = 1
    options: Mapping[str, str | float] = field(default_factory=dict)


TierFactory = Callable[[TierContext], OffloadTier]


@dataclass(frozen=True, kw_only=True, slots=True)
class TierSpec:
    """A registration: the factory, the options it accepts, a one-line description."""

    name: str
    factory: TierFactory
    options: frozenset[str]
    description: str = ""


_lock = threading.Lock()
_tiers: dict[str, TierSpec] = {}
_CALLS = (
    "lookup",
    "prepare_load",
    "complete_load",
    "prepare_store",
    "complete_store",
    "on_request_finished",
    "take_events",
    "reset",
)


def build_tier(spec: TierSpec, context: TierContext) -> OffloadTier:
    """``spec``'s tier for ``context``, checked: a ``TierConfigError`` for options it does not take, a
    ``TierError`` naming the tier if the factory fails or builds something that is not a tier."""
    unknown = sorted(set(context.options) - spec.options)
    if unknown:
        raise TierConfigError(
            f"Tier {spec.name!r} takes no option {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(sorted(spec.options)) or 'none'}."
        )
    try:
        tier = spec.factory(context)
    except (TierError, TierConfigError, UnknownTierError):
        raise
    except Exception as exc:
        raise TierError(
            f"Tier {spec.name!r}: the factory raised {type(exc).__name__}: {exc} when called with a "
            "TierContext; it must take one and return a tier."
        ) from exc
    missing = [name for name in _CALLS if not callable(getattr(tier, name, None))]
    if missing:
        raise TierError(
            f"Tier {spec.name!r}: the factory returned a {type(tier).__name__} without "
            f"{', '.join(missing)}; see kvspec.tiers.OffloadTier."
        )
    medium = getattr(tier, "medium", None)
    if medium not in (MEDIUM_CPU, MEDIUM_STORAGE):
        raise TierError(
            f"Tier {spec.name!r}: medium must be {MEDIUM_CPU!r} or {MEDIUM_STORAGE!r} (the KV events' "
            f"names of offloaded media), got {medium!r}."
        )
    if not isinstance(tier, OffloadTier):
        raise TierError(f"Tier {spec.name!r}: {type(tier).__name__} lacks capacity_blocks or num_blocks.")
    return tier


def register_tier(
    name: str,
    factory: TierFactory,
    *,
    options: Collection[str] = (),
    description: str = "",
    replace: bool = False,
) -> TierSpec:
    """Register ``factory`` under ``name`` ("host", "acme.nvme"), taking the options named in
    ``options``. A name already taken is refused unless ``replace``. Nothing changes when refused."""
    given: object = name
    if not isinstance(given, str) or not _NAME.match(given):
        raise TierError(f"Tier name {name!r} must be dotted lower-case words like 'host' or 'acme.nvme'.")
    if isinstance(options, str):
        raise TierError(f"Tier {name!r}: options must be a collection of names, got the string {options!r}.")
    if not callable(factory):
        raise TierError(
            f"Tier {name!r}: the factory must be callable (TierContext -> OffloadTier), got "
            f"{type(factory).__name__}."
        )
    spec = TierSpec(name=name, factory=factory, options=frozenset(options), description=description)
    build_tier(spec, TierContext(capacity_blocks=4))
    with _lock:
        taken = _tiers.get(name)
        if taken is not None and not replace and taken.factory is not factory:
            raise TierError(f"Tier {name!r} is already registered; pass replace=True to replace it.")
        _tiers[name] = spec
    return spec


def tier_names() -> tuple[str, ...]:
    with _lock:
        return tuple(sorted(_tiers))


def resolve_tier(name: str) -> TierSpec:
    """The registration of ``name``; ``UnknownTierError`` listing the registered names otherwise."""
    with _lock:
        spec = _tiers.get(name)
    if spec is None:
        raise UnknownTierError(
            f"Unknown tier {name!r}; registered: {', '.join(tier_names())} (a plugin registers more with "
            "kvspec.tiers.register_tier)."
        )
    return spec


def snapshot() -> Mapping[str, TierSpec]:
    with _lock:
        return MappingProxyType(dict(_tiers))


def restore(saved: Mapping[str, TierSpec]) -> None:
    with _lock:
        _tiers.clear()
        _tiers.update(saved)


def _option_int(context: TierContext, name: str, default: int) -> int:
    value = context.options.get(name, default)
    if isinstance(value, str) or int(value) != value:
        raise TierConfigError(f"Option {name!r} must be a whole number, got {value!r}.")
    return int(value)


def _host(context: TierContext) -> OffloadTier:
    policy = context.options.get("policy", "lru")
    return HostTier(
        context.capacity_blocks,
        policy=str(policy),
        store_threshold=_option_int(context, "store_threshold", 1),
    )


def _mooncake(context: TierContext) -> OffloadTier:
    def number(name: str, default: float) -> float:
        value = context.options.get(name, default)
        if isinstance(value, str):
            raise TierConfigError(f"Option {name!r} must be a number, got {value!r}.")
        return float(value)

    return SharedPool(
        context.capacity_blocks,
        high_watermark=number("high_watermark", 0.9),
        eviction_ratio=number("eviction_ratio", 0.05),
    )


register_tier(
    "host",
    _host,
    options=("policy", "store_threshold"),
    description="host memory per instance: vLLM 0.34's CPU offloading (LRU or ARC, store threshold)",
)
register_tier(
    "mooncake",
    _mooncake,
    options=("high_watermark", "eviction_ratio"),
    description="a pool shared by a fleet: Mooncake Store (approximate LRU, high-water mark)",
)


__all__ = [
    "TierContext",
    "TierFactory",
    "TierSpec",
    "build_tier",
    "register_tier",
    "resolve_tier",
    "restore",
    "snapshot",
    "tier_names",
]
