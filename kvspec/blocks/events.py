"""KV cache events: what the block pool tells KV-aware routers (blocks stored, removed, all cleared).

Values only; the pool queues them and the coordinator annotates them with each group's declared kind
(``kvspec.coordinator.stats``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ExternalBlockHash = bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockStored:
    """Full blocks were published in the prefix cache (for KV-aware routers)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str
    lora_name: str | None
    cache_salt: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    #: Per stored block, the tokens after it that its hash covers (EAGLE lookahead block hashes); None
    #: without lookahead hashing.
    lookahead_token_ids: list[list[int]] | None = None
    #: The session of the request that stored the blocks (``Request(session_id=)``): who triggered the
    #: store, not who owns the blocks (another session may share them).
    session_id: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockRemoved:
    """Cached blocks were evicted (their content is gone)."""

    block_hashes: list[ExternalBlockHash]
    medium: str
    group_idx: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class AllBlocksCleared:
    """The prefix cache was reset."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
