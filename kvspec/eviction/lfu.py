"""LFU: the free cached block used least often is evicted first; among equals, the least recently freed.

A block's count starts at 1 when its content is published and grows by one with every request admitted
with it as a prefix hit; it restarts when the block is reused for other content. Counts never decay (as
SGLang's LFU), so a once-popular prefix outlives newer ones until it is the least used left.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvspec.blocks.eviction import BlockUse, EvictionContext

if TYPE_CHECKING:
    from kvspec.blocks.block import KVCacheBlock


class LFUPolicy:
    """Evicts the smallest (use count, release order): one insertion-ordered bucket per count."""

    __slots__ = ("_buckets", "_counts", "_uses", "_where")

    def __init__(self, context: EvictionContext) -> None:
        self._uses = [0] * context.num_blocks
        #: use count -> the free blocks with it, in release order
        self._buckets: dict[int, OrderedDict[int, KVCacheBlock]] = {}
        self._counts: list[int] = []  # min-heap of the counts that have a bucket
        self._where: dict[int, int] = {}  # free block id -> its bucket's count

    def add(self, block: KVCacheBlock) -> None:
        uses = self._uses[block.block_id]
        bucket = self._buckets.get(uses)
        if bucket is None:
            bucket = self._buckets[uses] = OrderedDict()
            heapq.heappush(self._counts, uses)
        bucket[block.block_id] = block
        self._where[block.block_id] = uses

    def remove(self, block: KVCacheBlock) -> None:
        uses = self._where.pop(block.block_id)
        bucket = self._buckets[uses]
        del bucket[block.block_id]
        if not bucket:
            del self._buckets[uses]  # its count leaves the heap lazily

    def pop_victim(self) -> KVCacheBlock:
        counts, buckets = self._counts, self._buckets
        while counts[0] not in buckets:
            heapq.heappop(counts)
        uses = counts[0]
        bucket = buckets[uses]
        block_id, block = bucket.popitem(last=False)
        if not bucket:
            del buckets[uses]
            heapq.heappop(counts)
        del self._where[block_id]
        return block

    def __len__(self) -> int:
        return len(self._where)

    def evictable_blocks(self) -> list[KVCacheBlock]:
        return [block for uses in sorted(self._buckets) for block in self._buckets[uses].values()]

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
