"""What an eviction policy implements: the order in which free blocks holding cached content are reused.

The block pool keeps its free blocks in two parts. Blocks that hold nothing worth keeping (no hash, or
freed to be reused first) are reused first, in the order the release profile gives them. The others hold
cached prefix content; the pool hands them to an :class:`EvictionPolicy`, which names the next one to
reuse (evict) when the first part is empty. A policy sees only free blocks: a block a request holds is
never its to evict, and a free block that a request hits leaves the policy before it is used.

LRU in exactly vLLM's free-queue order is the pool's own linked list (no policy object: the default, and
the compiled build's fast path). Any other policy, kvspec's or a plugin's, implements this Protocol and is
built by an :data:`EvictionPolicyFactory` from an :class:`EvictionContext`; ``kvspec.eviction`` registers
them by name and ``kvspec.testing.check_eviction_policy`` checks one.

Units: times in seconds on the context's clock; sizes in tokens and bytes as named.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvspec.blocks.block import KVCacheBlock


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockUse:
    """Who published or hit blocks, and what they asked for them.

    ``priority``: the request's scheduling priority (lower is more important, as in vLLM); ``retention_seconds``:
    how long the request asks its prefix to stay cached after this use (None: no request; a policy reads
    the time of the use from its context's clock)."""

    request_id: str
    priority: int = 0
    retention_seconds: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupInfo:
    """One KV cache group as a policy may weigh it: ``block_tokens`` tokens a block holds, ``page_bytes``
    bytes it takes, ``holds_prefix_state`` when a cached block is a state snapshot standing for the whole
    prefix before it (Mamba) rather than its own tokens' KV (attention), and ``needed_by_longer_hits`` when
    every hit reaching past a block needs it (full attention: a hit is left-closed), so that once it is
    evicted the other groups' blocks at the same prefix position serve no hit."""

    block_tokens: int
    page_bytes: int
    holds_prefix_state: bool = False
    needed_by_longer_hits: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class EvictionContext:
    """What a policy is built from: ``num_blocks`` blocks in the pool (block ids are ``0 <= id <
    num_blocks``), the KV cache ``groups`` (index = group id, the group a cached block's hash names),
    ``clock``, a monotonic clock in seconds (a replay gives its simulated time), and ``cached_blocks``, a
    read-only lookup in the pool's prefix-cache map."""

    num_blocks: int
    groups: tuple[GroupInfo, ...] = ()
    clock: Callable[[], float] = lambda: 0.0
    #: The blocks the pool's prefix-cache map holds under a key (hash + group suffix), free or held; read
    #: only. None where a policy is built without a pool (a policy must then work without it).
    cached_blocks: Callable[[bytes], Sequence[KVCacheBlock]] | None = None


@runtime_checkable
class EvictionPolicy(Protocol):
    """Orders the free blocks that hold cached content. The pool keeps the invariants: a block is added
    only while free (``ref_cnt == 0``) and not already held by the policy; ``remove`` and ``pop_victim`` only
    take blocks the policy holds. A policy must be deterministic (same calls, same victims) and must not
    change blocks (their hash, ref count and free-list links are the pool's).

    A policy whose ``on_cached`` and ``on_hit`` do nothing may say so with a class attribute
    ``watches_block_use = False``: the pool then never calls them (it is spared building a list and a
    :class:`BlockUse` per publish and hit). ``kvspec.testing.check_eviction_policy`` runs such a policy with
    the calls too and requires the same block ids.
    """

    def add(self, block: KVCacheBlock) -> None:
        """``block`` became free and holds cached content: it may be evicted from now on."""
        ...

    def remove(self, block: KVCacheBlock) -> None:
        """``block`` (held by the policy) is taken by a request that hits it: it is no longer evictable."""
        ...

    def pop_victim(self) -> KVCacheBlock:
        """The block to reuse next, removed from the policy (its cached content is then dropped). Called only
        while ``len(self) > 0``."""
        ...

    def __len__(self) -> int:
        """Blocks the policy holds."""
        ...

    def evictable_blocks(self) -> list[KVCacheBlock]:
        """Every block the policy holds, in the order it would evict them now (tests, ``get_all_free_blocks``)."""
        ...

    def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        """``blocks`` (held by a request) were just published to the prefix cache by ``use``: their
        cached life starts (the content is new, whatever the block held before)."""
        ...

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        """A request (``use``) was admitted with ``blocks`` as its prefix hit (each already left the policy
        through ``remove`` if it was free)."""
        ...


@runtime_checkable
class BatchEvictionPolicy(EvictionPolicy, Protocol):
    """An :class:`EvictionPolicy` that also takes a request's blocks in one call. When a policy has these
    methods the pool calls them once per release and per allocation instead of ``add`` and ``pop_victim``
    once per block (the built-in policies do; a plugin may). They must act exactly as the per-block calls
    in order would: ``kvspec.testing.check_eviction_policy`` runs both ways and compares the block ids."""

    def add_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
        """``add`` of each of ``blocks`` in order."""
        ...

    def pop_victims(self, n: int) -> list[KVCacheBlock]:
        """``n`` calls of ``pop_victim``, their blocks in order. Called only while ``len(self) >= n``."""
        ...


def watches_block_use(policy: object) -> bool:
    """Whether the pool calls ``policy``'s ``on_cached`` and ``on_hit``: unless its class says
    ``watches_block_use = False`` (see :class:`EvictionPolicy`)."""
    return getattr(policy, "watches_block_use", True) is not False


#: Builds one policy for one pool.
EvictionPolicyFactory = Callable[[EvictionContext], EvictionPolicy]


__all__ = [
    "BatchEvictionPolicy",
    "BlockUse",
    "EvictionContext",
    "EvictionPolicy",
    "EvictionPolicyFactory",
    "GroupInfo",
    "watches_block_use",
]
