"""Eviction policies by name: a thread-safe registry checked at the door, with snapshot and restore.

"lru" is reserved: it names the pool's own linked list (vLLM's free-queue order, no policy object) and
resolves to None. Every other name maps to an :data:`~kvspec.blocks.eviction.EvictionPolicyFactory`.
Registration builds the policy once on a small context and refuses, with an ``EvictionPolicyError``,
a factory whose product is not an ``EvictionPolicy``, so a broken plugin fails when it registers, not in
the middle of a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from kvspec.blocks.eviction import EvictionContext, EvictionPolicy, EvictionPolicyFactory, GroupInfo
from kvspec.errors import EvictionPolicyError, UnknownEvictionPolicyError
from kvspec.named_registry import Entry, NamedRegistry

#: The name of vLLM's own LRU order (the pool's linked list; no policy object).
LRU = "lru"


def probe_context(num_blocks: int = 4) -> EvictionContext:
    """The small context a factory is tried on: ``num_blocks`` blocks, one 16-token group, no pool."""
    return EvictionContext(num_blocks=num_blocks, groups=(GroupInfo(block_tokens=16, page_bytes=4096),))


def check_eviction_policy_factory(name: str, factory: object) -> EvictionPolicyFactory:
    """``factory`` as a factory, after building one policy from it on a 4-block, one-group context;
    an ``EvictionPolicyError`` naming ``name`` and what is wrong otherwise."""
    if not callable(factory):
        raise EvictionPolicyError(
            f"Eviction policy {name!r}: the factory must be callable (EvictionContext -> EvictionPolicy), "
            f"got {type(factory).__name__}."
        )
    try:
        policy = factory(probe_context())
    except Exception as exc:
        raise EvictionPolicyError(
            f"Eviction policy {name!r}: the factory raised {type(exc).__name__}: {exc} when called with an "
            "EvictionContext; it must take one and return a policy."
        ) from exc
    if not isinstance(policy, EvictionPolicy):
        missing = [
            member
            for member in (
                "add",
                "remove",
                "pop_victim",
                "__len__",
                "evictable_blocks",
                "on_cached",
                "on_hit",
            )
            if not callable(getattr(policy, member, None))
        ]
        raise EvictionPolicyError(
            f"Eviction policy {name!r}: the factory returned a {type(policy).__name__}, which is not an "
            f"EvictionPolicy (missing or not callable: {', '.join(missing)}); see kvspec.blocks.eviction."
        )
    if len(policy) != 0:
        raise EvictionPolicyError(
            f"Eviction policy {name!r}: a new policy must hold no block, this one holds {len(policy)}."
        )
    checked: EvictionPolicyFactory = cast("EvictionPolicyFactory", factory)  # it built a policy just now
    return checked


#: Every eviction policy's factory by name ("lru", the pool's own order, is reserved and needs none);
#: the built-ins register in kvspec.eviction, one line each.
POLICIES: NamedRegistry[EvictionPolicyFactory] = NamedRegistry(
    what="Eviction policy",
    error=EvictionPolicyError,
    unknown_error=UnknownEvictionPolicyError,
    register_with="kvspec.eviction.register_eviction_policy",
    example="lfu",
    check=check_eviction_policy_factory,
    reserved={
        LRU: "vLLM's own free-queue order (the pool's linked list); register yours under another name.",
    },
)


def register_eviction_policy(name: str, factory: EvictionPolicyFactory, *, replace: bool = False) -> None:
    """Register ``factory`` under ``name`` (dotted lower-case words: "lfu", "acme.cost_aware").
    A name already taken is refused unless ``replace``; "lru" is vLLM's own order and cannot be taken.
    Nothing changes when the registration is refused."""
    POLICIES.register(name, factory, replace=replace)


def eviction_policy_names() -> tuple[str, ...]:
    """Every name ``resolve_eviction_policy`` takes: "lru" first, then the registered ones, sorted."""
    return (LRU, *POLICIES.names())


def resolve_eviction_policy(
    policy: str | EvictionPolicyFactory | None,
) -> EvictionPolicyFactory | None:
    """The factory for ``policy``: None for None or "lru" (the pool's own LRU); a registered name's
    factory; a factory as given once checked. An unknown name raises ``UnknownEvictionPolicyError``."""
    if policy is None or policy == LRU:
        return None
    if isinstance(policy, str):
        return POLICIES.entry(policy).item
    return check_eviction_policy_factory(getattr(policy, "__name__", repr(policy)), policy)


def snapshot() -> Mapping[str, Entry[EvictionPolicyFactory]]:
    """The registrations now (read-only), for :func:`restore` (tests)."""
    return POLICIES.snapshot()


def restore(saved: Mapping[str, Entry[EvictionPolicyFactory]]) -> None:
    """Put back the registrations a :func:`snapshot` saw."""
    POLICIES.restore(saved)


__all__ = [
    "LRU",
    "POLICIES",
    "check_eviction_policy_factory",
    "probe_context",
    "eviction_policy_names",
    "register_eviction_policy",
    "resolve_eviction_policy",
    "restore",
    "snapshot",
]
