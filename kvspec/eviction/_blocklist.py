"""An intrusive doubly linked list of blocks through their policy links: an eviction policy's O(1) order."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.blocks.block import KVCacheBlock


class BlockList:
    """Blocks in insertion order, linked through ``prev_in_policy`` / ``next_in_policy`` (no allocation per
    block, as the pool's own free queue). A block is in at most one list at a time (its links say which);
    ``remove`` and ``popleft`` leave its links None. ``len`` counts the blocks."""

    __slots__ = ("_head", "_tail", "size")

    def __init__(self) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_in_policy = self._tail
        self._tail.prev_in_policy = self._head
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def append(self, block: KVCacheBlock) -> None:
        """``block`` (in no list) becomes the newest."""
        tail = self._tail
        last = tail.prev_in_policy
        assert last is not None
        last.next_in_policy = block
        block.prev_in_policy = last
        block.next_in_policy = tail
        tail.prev_in_policy = block
        self.size += 1

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block``, which this list holds."""
        prev, nxt = block.prev_in_policy, block.next_in_policy
        assert prev is not None and nxt is not None
        prev.next_in_policy = nxt
        nxt.prev_in_policy = prev
        block.prev_in_policy = block.next_in_policy = None
        self.size -= 1

    def first(self) -> KVCacheBlock | None:
        """The oldest block, or None when the list is empty."""
        first = self._head.next_in_policy
        return None if first is self._tail else first

    def popleft(self) -> KVCacheBlock:
        """Unlink and return the oldest block (the list must hold one)."""
        first = self._head.next_in_policy
        assert first is not None and first is not self._tail
        nxt = first.next_in_policy
        assert nxt is not None
        self._head.next_in_policy = nxt
        nxt.prev_in_policy = self._head
        first.prev_in_policy = first.next_in_policy = None
        self.size -= 1
        return first

    def popleft_into(self, n: int, out: list[KVCacheBlock]) -> None:
        """Unlink the ``n`` oldest blocks (``n <= len``), appending them to ``out`` oldest first."""
        if n <= 0:
            return
        cur = self._head.next_in_policy
        for _ in range(n):
            assert cur is not None
            out.append(cur)
            nxt = cur.next_in_policy
            cur.prev_in_policy = cur.next_in_policy = None
            cur = nxt
        assert cur is not None
        self._head.next_in_policy = cur
        cur.prev_in_policy = self._head
        self.size -= n

    def extend(self, blocks: Sequence[KVCacheBlock]) -> None:
        """``append`` of each of ``blocks`` in order."""
        tail = self._tail
        last = tail.prev_in_policy
        assert last is not None
        for block in blocks:
            last.next_in_policy = block
            block.prev_in_policy = last
            last = block
        last.next_in_policy = tail
        tail.prev_in_policy = last
        self.size += len(blocks)

    def extend_numbered(self, blocks: Sequence[KVCacheBlock], first_seq: int) -> None:
        """``extend``, numbering the blocks' ``policy_seq`` from ``first_seq`` up in the same pass."""
        tail = self._tail
        last = tail.prev_in_policy
        assert last is not None
        seq = first_seq
        for block in blocks:
            last.next_in_policy = block
            block.prev_in_policy = last
            block.policy_seq = seq
            seq += 1
            last = block
        last.next_in_policy = tail
        tail.prev_in_policy = last
        self.size += len(blocks)

    def blocks(self) -> list[KVCacheBlock]:
        """The blocks, oldest first."""
        out: list[KVCacheBlock] = []
        cur = self._head.next_in_policy
        while cur is not None and cur is not self._tail:
            out.append(cur)
            cur = cur.next_in_policy
        return out
