"""Pluggable eviction policies: which free cached block the pool reuses first when blocks run out.

Built in, by name (``KVCacheCoordinator(..., eviction_policy=name)``, ``kvspec simulate --policy``):

- ``"lru"``: vLLM's free-queue order exactly (the pool's own linked list; the default);
- ``"lfu"``: least used first (:class:`LFUPolicy`);
- ``"slru"``: segmented LRU, scan-resistant (:class:`SLRUPolicy`);
- ``"retention"``: requests' priority and retention time (:class:`RetentionPolicy`);
- ``"hybrid"``: recency plus recompute cost per byte, coherent across groups (:class:`HybridAwarePolicy`).

A plugin implements :class:`kvspec.blocks.eviction.EvictionPolicy` (and, to be called once per request
rather than once per block, :class:`BatchEvictionPolicy`) and registers a factory with
:func:`register_eviction_policy`; ``kvspec.testing.check_eviction_policy`` is its conformance kit.
:class:`BlockList` threads a policy's order through the blocks' policy links (O(1), no allocation).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kvspec.blocks.eviction import (
    BatchEvictionPolicy,
    BlockUse,
    EvictionContext,
    EvictionPolicy,
    EvictionPolicyFactory,
    GroupInfo,
)
from kvspec.eviction._blocklist import BlockList
from kvspec.eviction.hybrid import HybridAwarePolicy
from kvspec.eviction.lfu import LFUPolicy
from kvspec.eviction.lru import ReleaseOrderLRU
from kvspec.eviction.registry import (
    LRU,
    POLICIES,
    eviction_policy_names,
    register_eviction_policy,
    resolve_eviction_policy,
    restore,
    snapshot,
)
from kvspec.eviction.retention import RetentionPolicy
from kvspec.eviction.slru import SLRUPolicy

# The built-ins, one line each (kv_offload's factory: one registry, one line a built-in).
POLICIES.register("lfu", LFUPolicy)
POLICIES.register("slru", SLRUPolicy)
POLICIES.register("retention", RetentionPolicy)
POLICIES.register("hybrid", HybridAwarePolicy)

#: The built-in policies' factories by name ("lru" needs none), as registered at import.
BUILTIN_POLICIES: Mapping[str, EvictionPolicyFactory] = MappingProxyType(
    {entry.name: entry.item for entry in POLICIES.entries()}
)

__all__ = [
    "BUILTIN_POLICIES",
    "BatchEvictionPolicy",
    "BlockList",
    "LRU",
    "POLICIES",
    "BlockUse",
    "EvictionContext",
    "EvictionPolicy",
    "EvictionPolicyFactory",
    "GroupInfo",
    "HybridAwarePolicy",
    "LFUPolicy",
    "RetentionPolicy",
    "ReleaseOrderLRU",
    "SLRUPolicy",
    "eviction_policy_names",
    "register_eviction_policy",
    "resolve_eviction_policy",
    "restore",
    "snapshot",
]
