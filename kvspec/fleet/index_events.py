"""What :class:`~kvspec.fleet.index.KVEventIndex` reads of vLLM's KV event wire: msgspec Structs for the few
fields it uses (msgspec skips the rest unread, token ids included). Kept apart from the index because the
compiled build compiles the index and mypyc does not compile msgspec Structs. ``gc=False``: they hold lists of
hashes, never a cycle, and a fleet decodes millions."""

from __future__ import annotations

from typing import Any

import msgspec

#: Where vLLM 0.23's BlockStored array holds the group's kind and the medium: [tag, hashes, parent, tokens,
#: block_size, lora_id, medium, lora_name, extra_keys, group_idx, kind, window]; BlockRemoved: [tag, hashes,
#: medium, group_idx].
STORED_GROUP_AT = 9
STORED_KIND_AT = 10
STORED_MEDIUM_AT = 6
REMOVED_MEDIUM_AT = 2


class StoredRead(msgspec.Struct, tag="BlockStored", tag_field="type", gc=False):
    """What the index reads of a 0.32/0.34 BlockStored map (msgspec skips the other fields unread)."""

    block_hashes: list[Any]
    kv_cache_spec_kind: str | None = None
    medium: str | None = "GPU"
    group_idx: int | None = None
    kv_cache_spec_sliding_window: int | None = None


class RemovedRead(msgspec.Struct, tag="BlockRemoved", tag_field="type", gc=False):
    block_hashes: list[Any]
    group_idx: int | None = None
    medium: str | None = "GPU"


class ClearedRead(msgspec.Struct, tag="AllBlocksCleared", tag_field="type"):
    pass


#: A 0.32/0.34 publisher payload: [ts, events, data_parallel_rank].
MapBatch = tuple[float, list[StoredRead | RemovedRead | ClearedRead], int | None]


__all__ = [
    "REMOVED_MEDIUM_AT",
    "STORED_GROUP_AT",
    "STORED_KIND_AT",
    "STORED_MEDIUM_AT",
    "ClearedRead",
    "MapBatch",
    "RemovedRead",
    "StoredRead",
]
