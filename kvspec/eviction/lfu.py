"""LFU: the free cached block used least often is evicted first; among equals, the least recently freed.

A block's count starts at 1 when its content is published and grows by one with every request admitted
with it as a prefix hit; it restarts when the block is reused for other content. Counts never decay (as
SGLang's LFU), so a once-popular prefix outlives newer ones until it is the least used left.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvspec.blocks.eviction import BlockUse, EvictionContext
from kvspec.eviction._blocklist import BlockList

if TYPE_CHECKING:
    from kvspec.blocks.block import KVCacheBlock


class LFUPolicy:
    """Evicts the smallest (use count, release order): one release-ordered :class:`BlockList` per count,
    and a min-heap of the counts whose list may hold blocks."""

    __slots__ = ("_counts", "_lists", "_queued", "_size", "_uses", "_where")

    def __init__(self, context: EvictionContext) -> None:
        self._uses = [0] * context.num_blocks
        #: use count -> the free blocks with it, in release order (kept once made: counts recur)
        self._lists: dict[int, BlockList] = {}
        self._counts: list[int] = []  # min-heap of counts whose list may be non-empty (stale ones skipped)
        self._queued: set[int] = set()  # the counts in ``_counts``
        self._where = [-1] * context.num_blocks  # free block id -> its list's count; -1: not held
        self._size = 0

    def _list_for(self, uses: int) -> BlockList:
        blocks = self._lists.get(uses)
        if blocks is None:
            blocks = self._lists[uses] = BlockList()
        if uses not in self._queued:
            self._queued.add(uses)
            heapq.heappush(self._counts, uses)
        return blocks

    def add(self, block: KVCacheBlock) -> None:
        self.add_blocks((block,))

    def add_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
        """``add`` of each block; consecutive blocks of one count share a list lookup."""
        uses_of, where = self._uses, self._where
        last_uses = -1
        target: BlockList | None = None
        for block in blocks:
            block_id = block.block_id
            uses = uses_of[block_id]
            if uses != last_uses or target is None:
                target = self._list_for(uses)
                last_uses = uses
            target.append(block)
            where[block_id] = uses
        self._size += len(blocks)

    def remove(self, block: KVCacheBlock) -> None:
        uses = self._where[block.block_id]
        if uses < 0:
            raise KeyError(block.block_id)
        self._lists[uses].remove(block)
        self._where[block.block_id] = -1
        self._size -= 1

    def _smallest(self) -> BlockList:
        """The non-empty list of the smallest count (the policy must hold a block)."""
        counts, lists = self._counts, self._lists
        while True:
            uses = counts[0]
            blocks = lists[uses]
            if blocks.size:
                return blocks
            heapq.heappop(counts)
            self._queued.discard(uses)

    def pop_victim(self) -> KVCacheBlock:
        block = self._smallest().popleft()
        self._where[block.block_id] = -1
        self._size -= 1
        return block

    def pop_victims(self, n: int) -> list[KVCacheBlock]:
        """``n`` victims, smallest count first; each list drained in one pass."""
        out: list[KVCacheBlock] = []
        while len(out) < n:
            blocks = self._smallest()
            blocks.popleft_into(min(n - len(out), blocks.size), out)
        where = self._where
        for block in out:
            where[block.block_id] = -1
        self._size -= n
        return out

    def __len__(self) -> int:
        return self._size

    def evictable_blocks(self) -> list[KVCacheBlock]:
        return [block for uses in sorted(self._lists) for block in self._lists[uses].blocks()]

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
