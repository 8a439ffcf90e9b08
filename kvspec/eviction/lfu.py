"""LFU: the free cached block used least often is evicted first; among equals, the least recently freed.

A block's count starts at 1 when its content is published and grows by one with every request admitted
with it as a prefix hit; it restarts when the block is reused for other content. Counts never decay (as
SGLang's LFU), so a once-popular prefix outlives newer ones until it is the least used left.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count
from typing import TYPE_CHECKING

from kvspec.blocks.eviction import BlockUse, EvictionContext
from kvspec.eviction._heap import BlockHeap

if TYPE_CHECKING:
    from kvspec.blocks.block import KVCacheBlock


class LFUPolicy:
    """Evicts the smallest (use count, release order)."""

    __slots__ = ("_heap", "_seq", "_uses")

    def __init__(self, context: EvictionContext) -> None:
        self._uses = [0] * context.num_blocks
        self._heap = BlockHeap()
        self._seq = count()

    def add(self, block: KVCacheBlock) -> None:
        self._heap.push(block, (self._uses[block.block_id], next(self._seq)))

    def remove(self, block: KVCacheBlock) -> None:
        self._heap.discard(block)

    def pop_victim(self) -> KVCacheBlock:
        return self._heap.pop()

    def __len__(self) -> int:
        return len(self._heap)

    def evictable_blocks(self) -> list[KVCacheBlock]:
        return self._heap.ordered()

    def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        uses = self._uses
        for block in blocks:
            uses[block.block_id] = 1

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        uses = self._uses
        for block in blocks:
            uses[block.block_id] += 1

    def uses(self, block_id: int) -> int:
        """The use count of the content block ``block_id`` holds (tests, reports)."""
        return self._uses[block_id]
