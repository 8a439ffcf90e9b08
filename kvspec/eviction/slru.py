"""Segmented LRU: scan-resistant. Content hit at least once since it was published is protected.

Free cached blocks sit in two LRU segments. A block whose content no request has hit yet joins the
probationary segment; one that has been a prefix hit joins the protected segment. Eviction takes the
probationary segment's oldest first, so a burst of one-off prompts (a scan) evicts only other one-off
content. The protected segment holds at most ``protected_fraction`` of the pool's blocks: beyond it its
oldest move to the probationary segment's newest end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvspec.blocks.eviction import BlockUse, EvictionContext
from kvspec.eviction._blocklist import BlockList

if TYPE_CHECKING:
    from kvspec.blocks.block import KVCacheBlock


_PROBATION = 1
_PROTECTED = 2


class SLRUPolicy:
    """Two LRU segments (probationary, protected); ``protected_fraction`` in (0, 1]."""

    __slots__ = ("_hit", "_limit", "_probation", "_protected", "_where", "protected_fraction")

    def __init__(self, context: EvictionContext, protected_fraction: float = 0.8) -> None:
        if not 0.0 < protected_fraction <= 1.0:
            raise ValueError(f"protected_fraction must be in (0, 1], got {protected_fraction!r}")
        self.protected_fraction = protected_fraction
        self._limit = int(protected_fraction * (context.num_blocks - 1))  # the null block is no one's
        self._hit = [False] * context.num_blocks  # the block's content has been a prefix hit
        # Oldest first, linked through the blocks (no allocation per block).
        self._probation = BlockList()
        self._protected = BlockList()
        #: free block id -> 0 not held, 1 probationary, 2 protected
        self._where = [0] * context.num_blocks

    def add(self, block: KVCacheBlock) -> None:
        self.add_blocks((block,))

    def add_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
        hit, probation, protected, where, limit = (
            self._hit,
            self._probation,
            self._protected,
            self._where,
            self._limit,
        )
        for block in blocks:
            block_id = block.block_id
            if hit[block_id]:
                protected.append(block)
                where[block_id] = _PROTECTED
                while protected.size > limit:
                    demoted = protected.popleft()
                    probation.append(demoted)
                    where[demoted.block_id] = _PROBATION
            else:
                probation.append(block)
                where[block_id] = _PROBATION

    def remove(self, block: KVCacheBlock) -> None:
        segment = self._where[block.block_id]
        if segment == _PROBATION:
            self._probation.remove(block)
        elif segment == _PROTECTED:
            self._protected.remove(block)
        else:
            raise KeyError(block.block_id)
        self._where[block.block_id] = 0

    def pop_victim(self) -> KVCacheBlock:
        segment = self._probation if self._probation.size else self._protected
        block = segment.popleft()
        self._where[block.block_id] = 0
        return block

    def pop_victims(self, n: int) -> list[KVCacheBlock]:
        out: list[KVCacheBlock] = []
        take = min(n, self._probation.size)
        self._probation.popleft_into(take, out)
        self._protected.popleft_into(n - take, out)
        where = self._where
        for block in out:
            where[block.block_id] = 0
        return out

    def __len__(self) -> int:
        return self._probation.size + self._protected.size

    def evictable_blocks(self) -> list[KVCacheBlock]:
        return [*self._probation.blocks(), *self._protected.blocks()]

    def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        hit = self._hit
        for block in blocks:
            hit[block.block_id] = False

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        hit = self._hit
        for block in blocks:
            hit[block.block_id] = True

    def is_protected(self, block_id: int) -> bool:
        """Whether the free block ``block_id`` sits in the protected segment (tests, reports)."""
        return self._where[block_id] == _PROTECTED
