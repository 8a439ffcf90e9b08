"""LRU through the policy protocol: the reference a plugin author starts from.

It evicts free cached blocks in the order they were freed, so under vLLM 0.34's free order it hands out
exactly the blocks of the pool's own linked list (the built-in "lru", which needs no policy object);
``kvspec.testing.check_eviction_policy`` holds it to that.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvspec.blocks.eviction import BlockUse, EvictionContext

if TYPE_CHECKING:
    from kvspec.blocks.block import KVCacheBlock


class ReleaseOrderLRU:
    """Free cached blocks in release order; the oldest is evicted first."""

    __slots__ = ("_free",)

    def __init__(self, context: EvictionContext) -> None:
        # The release order. An OrderedDict: popping a plain dict's first key is O(deleted keys) there.
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict()

    def add(self, block: KVCacheBlock) -> None:
        self._free[block.block_id] = block

    def remove(self, block: KVCacheBlock) -> None:
        del self._free[block.block_id]

    def pop_victim(self) -> KVCacheBlock:
        return self._free.popitem(last=False)[1]

    def add_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
        free = self._free
        for block in blocks:
            free[block.block_id] = block

    def pop_victims(self, n: int) -> list[KVCacheBlock]:
        popitem = self._free.popitem
        return [popitem(last=False)[1] for _ in range(n)]

    def __len__(self) -> int:
        return len(self._free)

    def evictable_blocks(self) -> list[KVCacheBlock]:
        return list(self._free.values())

    def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        pass

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        pass
