"""KV cache events: what the block pool tells KV-aware routers (blocks stored, removed, all cleared).

Values only; the pool queues them and the coordinator annotates them with each group's declared kind
(``kvspec.coordinator.stats``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ExternalBlockHash = bytes


# The events write their own __init__ (init=False): the compiled build turns its direct
# object.__setattr__ calls into slot stores, ten times faster than the dataclass-made __init__ (a fleet
# replay makes millions of events). Direct calls only: an alias is a slow generic call.
# tests/unit/test_value_inits.py checks each __init__ against its fields and defaults.


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
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

    def __init__(
        self,
        *,
        block_hashes: list[ExternalBlockHash],
        parent_block_hash: ExternalBlockHash | None,
        token_ids: list[int],
        block_size: int,
        lora_id: int | None,
        medium: str,
        lora_name: str | None,
        cache_salt: str | None = None,
        extra_keys: list[tuple[Any, ...] | None] | None = None,
        group_idx: int | None = None,
        kv_cache_spec_kind: str | None = None,
        kv_cache_spec_sliding_window: int | None = None,
        lookahead_token_ids: list[list[int]] | None = None,
        session_id: str | None = None,
    ) -> None:
        object.__setattr__(self, "block_hashes", block_hashes)
        object.__setattr__(self, "parent_block_hash", parent_block_hash)
        object.__setattr__(self, "token_ids", token_ids)
        object.__setattr__(self, "block_size", block_size)
        object.__setattr__(self, "lora_id", lora_id)
        object.__setattr__(self, "medium", medium)
        object.__setattr__(self, "lora_name", lora_name)
        object.__setattr__(self, "cache_salt", cache_salt)
        object.__setattr__(self, "extra_keys", extra_keys)
        object.__setattr__(self, "group_idx", group_idx)
        object.__setattr__(self, "kv_cache_spec_kind", kv_cache_spec_kind)
        object.__setattr__(self, "kv_cache_spec_sliding_window", kv_cache_spec_sliding_window)
        object.__setattr__(self, "lookahead_token_ids", lookahead_token_ids)
        object.__setattr__(self, "session_id", session_id)


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
class BlockRemoved:
    """Cached blocks were evicted (their content is gone)."""

    block_hashes: list[ExternalBlockHash]
    medium: str
    group_idx: int | None = None

    def __init__(
        self, *, block_hashes: list[ExternalBlockHash], medium: str, group_idx: int | None = None
    ) -> None:
        object.__setattr__(self, "block_hashes", block_hashes)
        object.__setattr__(self, "medium", medium)
        object.__setattr__(self, "group_idx", group_idx)


@dataclass(frozen=True, kw_only=True, slots=True)
class AllBlocksCleared:
    """The prefix cache was reset."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
