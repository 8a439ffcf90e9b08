"""Segmented LRU: scan-resistant. Content hit at least once since it was published is protected.

Free cached blocks sit in two LRU segments. A block whose content no request has hit yet joins the
probationary segment; one that has been a prefix hit joins the protected segment. Eviction takes the
probationary segment's oldest first, so a burst of one-off prompts (a scan) evicts only other one-off
content. The protected segment holds at most ``protected_fraction`` of the pool's blocks: beyond it its
oldest move to the probationary segment's newest end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvspec.blocks.eviction import BlockUse, EvictionContext

if TYPE_CHECKING:
    from kvspec.blocks.block import KVCacheBlock


class SLRUPolicy:
    """Two LRU segments (probationary, protected); ``protected_fraction`` in (0, 1]."""

    __slots__ = ("_hit", "_limit", "_probation", "_protected", "protected_fraction")

    def __init__(self, context: EvictionContext, protected_fraction: float = 0.8) -> None:
        if not 0.0 < protected_fraction <= 1.0:
            raise ValueError(f"protected_fraction must be in (0, 1], got {protected_fraction!r}")
        self.protected_fraction = protected_fraction
        self._limit = int(protected_fraction * (context.num_blocks - 1))  # the null block is no one's
        self._hit = bytearray(context.num_blocks)  # 1: the block's content has been a prefix hit
        # Oldest first. OrderedDicts: popping a plain dict's first key is O(deleted keys) there.
        self._probation: OrderedDict[int, KVCacheBlock] = OrderedDict()
        self._protected: OrderedDict[int, KVCacheBlock] = OrderedDict()

    def add(self, block: KVCacheBlock) -> None:
        if self._hit[block.block_id]:
            self._protected[block.block_id] = block
            while len(self._protected) > self._limit:
                oldest, demoted = self._protected.popitem(last=False)
                self._probation[oldest] = demoted
        else:
            self._probation[block.block_id] = block

    def remove(self, block: KVCacheBlock) -> None:
        if self._probation.pop(block.block_id, None) is None:
            del self._protected[block.block_id]

    def pop_victim(self) -> KVCacheBlock:
        segment = self._probation if self._probation else self._protected
        return segment.popitem(last=False)[1]

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def evictable_blocks(self) -> list[KVCacheBlock]:
        return [*self._probation.values(), *self._protected.values()]

    def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        hit = self._hit
        for block in blocks:
            hit[block.block_id] = 0

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        hit = self._hit
        for block in blocks:
            hit[block.block_id] = 1

    def is_protected(self, block_id: int) -> bool:
        """Whether the free block ``block_id`` sits in the protected segment (tests, reports)."""
        return block_id in self._protected
