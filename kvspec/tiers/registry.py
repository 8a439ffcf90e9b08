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

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvspec.errors import TierConfigError, TierError, UnknownTierError
from kvspec.named_registry import (
    NamedRegistry,
    Option,
    declared_options,
    option_settings,
    read_options,
)
from kvspec.tiers.base import MEDIUM_CPU, MEDIUM_STORAGE, OffloadTier
from kvspec.tiers.host import HostTier
from kvspec.tiers.pool import SharedPool

D = TypeVar("D")


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
    """A registration: the factory, the options it declares, a one-line description."""

    name: str
    factory: TierFactory
    options: tuple[Option, ...] = ()
    description: str = ""

    @property
    def option_names(self) -> frozenset[str]:
        return frozenset(o.name for o in self.options)


def tier_options(settings: type[D], tier: str, context: TierContext) -> D:
    """``tier``'s options: ``settings`` (a dataclass whose fields are the options it declares, with their
    defaults) built from ``context.options``; an undeclared option or a value of the wrong kind is a
    ``TierConfigError`` in the wording every registry uses."""
    return read_options(settings, f"Tier {tier!r}", context.options, TierConfigError)


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
    """``spec``'s tier for ``context``, checked: a ``TierConfigError`` for options it does not declare or of
    the wrong kind, a ``TierError`` naming the tier if the factory fails or builds something that is not a
    tier."""
    option_settings(f"Tier {spec.name!r}", spec.options, context.options, TierConfigError)
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


def _check(name: str, spec: TierSpec) -> TierSpec:
    if not callable(spec.factory):
        raise TierError(
            f"Tier {name!r}: the factory must be callable (TierContext -> OffloadTier), got "
            f"{type(spec.factory).__name__}."
        )
    build_tier(spec, TierContext(capacity_blocks=4))
    return spec


#: Every offload tier by name; the built-ins register below, one line each.
TIERS: NamedRegistry[TierSpec] = NamedRegistry(
    what="Tier",
    error=TierError,
    unknown_error=UnknownTierError,
    option_error=TierConfigError,
    register_with="kvspec.tiers.register_tier",
    example="nvme",
    check=_check,
)


def register_tier(
    name: str,
    factory: TierFactory,
    *,
    options: Iterable[Option] | type[Any] = (),
    description: str = "",
    replace: bool = False,
) -> TierSpec:
    """Register ``factory`` under ``name`` ("host", "acme.nvme"), taking ``options``: ``Option`` values, or
    the dataclass of options it reads them into (:func:`tier_options`). A name already taken is refused
    unless ``replace``. Nothing changes when refused."""
    declared = declared_options(options) if isinstance(options, type) else tuple(options)
    spec = TierSpec(name=name, factory=factory, options=declared, description=description)
    return TIERS.register(name, spec, options=declared, description=description, replace=replace).item


# The module-level doors are the registry's own methods (one behaviour, one docstring).
tier_names = TIERS.names
#: The registration of a name; ``UnknownTierError`` listing the registered names otherwise.
resolve_tier = TIERS.item
snapshot = TIERS.snapshot
restore = TIERS.restore


@dataclass(frozen=True, kw_only=True, slots=True)
class HostTierOptions:
    """``host``: the eviction policy ("lru" or "arc") and the hits a block needs before it is stored."""

    policy: str = "lru"
    store_threshold: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class SharedPoolOptions:
    """``mooncake``: the fill ratio that starts eviction and the share of the pool one eviction frees."""

    high_watermark: float = 0.9
    eviction_ratio: float = 0.05


def _host(context: TierContext) -> OffloadTier:
    options = tier_options(HostTierOptions, "host", context)
    return HostTier(context.capacity_blocks, policy=options.policy, store_threshold=options.store_threshold)


def _mooncake(context: TierContext) -> OffloadTier:
    options = tier_options(SharedPoolOptions, "mooncake", context)
    return SharedPool(
        context.capacity_blocks,
        high_watermark=options.high_watermark,
        eviction_ratio=options.eviction_ratio,
    )


register_tier(
    "host",
    _host,
    options=HostTierOptions,
    description="host memory per instance: vLLM 0.34's CPU offloading (LRU or ARC, store threshold)",
)
register_tier(
    "mooncake",
    _mooncake,
    options=SharedPoolOptions,
    description="a pool shared by a fleet: Mooncake Store (approximate LRU, high-water mark)",
)


__all__ = [
    "TIERS",
    "HostTierOptions",
    "SharedPoolOptions",
    "TierContext",
    "TierFactory",
    "TierSpec",
    "build_tier",
    "register_tier",
    "resolve_tier",
    "restore",
    "snapshot",
    "tier_names",
    "tier_options",
]
