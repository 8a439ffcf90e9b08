"""Priority and retention: a request may keep its prefix cached for a while, and rank it against others.

Each use of a block (publishing it, or being admitted with it as a prefix hit) by a request that asks for
``retention_seconds`` keeps the block *retained* until ``now + retention_seconds`` (the latest of its uses'
ends); the block's priority is the most important (lowest, as in vLLM) of the priorities of the requests
that used it in its current cached life. Eviction order among free cached blocks:

1. blocks not retained now before retained ones (a retained block is evicted only when nothing else is
   free: the pool never refuses an allocation it could serve, so retention is a strong preference, not a
   reservation);
2. then the least important priority first (the highest number);
3. then the least recently freed first (LRU).

A retention that ends while the block is free moves it back among the unretained at once, in its release
order. The clock is the context's (a replay's simulated time).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from itertools import count
from typing import TYPE_CHECKING

from kvspec.blocks.eviction import BlockUse, EvictionContext
from kvspec.eviction._heap import BlockHeap

if TYPE_CHECKING:
    from kvspec.blocks.block import KVCacheBlock


class RetentionPolicy:
    """Evicts the smallest (retained now, -priority, release order)."""

    __slots__ = ("_clock", "_expiry", "_heap", "_priority", "_released", "_seq", "_until")

    def __init__(self, context: EvictionContext) -> None:
        self._clock = context.clock
        n = context.num_blocks
        self._priority: list[int | None] = [None] * n  # None: no use recorded yet in this life
        self._until = [-math.inf] * n
        self._released = [0] * n  # release sequence number of each free block
        self._heap = BlockHeap()
        #: (retention end, block id, release seq) for free blocks retained when added: re-keyed when it ends
        self._expiry: list[tuple[float, int, int]] = []
        self._seq = count()

    def _key(self, block_id: int, now: float) -> tuple[bool, int, int]:
        priority = self._priority[block_id]
        return (self._until[block_id] > now, -(priority or 0), self._released[block_id])

    def add(self, block: KVCacheBlock) -> None:
        block_id = block.block_id
        seq = self._released[block_id] = next(self._seq)
        now = self._clock()
        key = self._key(block_id, now)
        self._heap.push(block, key)
        if key[0]:
            heapq.heappush(self._expiry, (self._until[block_id], block_id, seq))

    def add_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
        for block in blocks:
            self.add(block)

    def pop_victims(self, n: int) -> list[KVCacheBlock]:
        self._expire(self._clock())  # one clock reading: the pops of one allocation happen at one time
        heap = self._heap
        return [heap.pop() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        self._heap.discard(block)

    def _expire(self, now: float) -> None:
        expiry, heap = self._expiry, self._heap
        while expiry and expiry[0][0] <= now:
            _, block_id, seq = heapq.heappop(expiry)
            if block_id in heap and self._released[block_id] == seq:
                block = heap.peek_block(block_id)
                heap.push(block, self._key(block_id, now))

    def pop_victim(self) -> KVCacheBlock:
        self._expire(self._clock())
        return self._heap.pop()

    def __len__(self) -> int:
        return len(self._heap)

    def evictable_blocks(self) -> list[KVCacheBlock]:
        self._expire(self._clock())
        return self._heap.ordered()

    def _use(self, blocks: Sequence[KVCacheBlock], use: BlockUse, fresh: bool) -> None:
        now = self._clock()
        until = now + use.retention_seconds if use.retention_seconds is not None else -math.inf
        for block in blocks:
            block_id = block.block_id
            current = None if fresh else self._priority[block_id]
            self._priority[block_id] = use.priority if current is None else min(current, use.priority)
            if fresh:
                self._until[block_id] = until
            elif until > self._until[block_id]:
                self._until[block_id] = until

    def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        self._use(blocks, use, fresh=True)

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        self._use(blocks, use, fresh=False)

    def retained_until(self, block_id: int) -> float:
        """When the retention of block ``block_id``'s content ends (-inf: none); tests, reports."""
        return self._until[block_id]
