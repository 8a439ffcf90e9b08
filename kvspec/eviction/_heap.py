"""A min-heap of free blocks by a sortable key, with removal by block (lazy: stale entries are skipped)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvspec.eviction._blocklist import BlockList

if TYPE_CHECKING:
    from kvspec.blocks.block import KVCacheBlock


class BlockHeap:
    """Blocks ordered by the key each was pushed with (smallest first). ``push`` of a held block re-keys
    it; ``discard`` and ``pop`` are O(log n) amortised. Ties are impossible: keys end with a sequence number."""

    __slots__ = ("_entries", "_members", "_version")

    def __init__(self) -> None:
        self._entries: list[tuple[Any, int, int]] = []
        #: block id -> (the block, the version of its live entry)
        self._members: dict[int, tuple[KVCacheBlock, int]] = {}
        self._version = 0

    def push(self, block: KVCacheBlock, key: Any) -> None:
        self._version += 1
        self._members[block.block_id] = (block, self._version)
        heapq.heappush(self._entries, (key, self._version, block.block_id))
        if len(self._entries) > 4 * len(self._members) + 64:
            self._compact()

    def discard(self, block: KVCacheBlock) -> bool:
        """Forget ``block``; whether it was held."""
        return self._members.pop(block.block_id, None) is not None

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._members

    def __len__(self) -> int:
        return len(self._members)

    def peek_block(self, block_id: int) -> KVCacheBlock:
        """The held block ``block_id``."""
        return self._members[block_id][0]

    def peek(self) -> tuple[Any, KVCacheBlock]:
        """The smallest key and its block (the heap must hold one)."""
        entries, members = self._entries, self._members
        while True:
            key, version, block_id = entries[0]
            member = members.get(block_id)
            if member is not None and member[1] == version:
                return key, member[0]
            heapq.heappop(entries)

    def pop(self) -> KVCacheBlock:
        _, block = self.peek()
        heapq.heappop(self._entries)
        del self._members[block.block_id]
        return block

    def copy(self) -> BlockHeap:
        twin = BlockHeap()
        twin._entries = list(self._entries)
        twin._members = dict(self._members)
        twin._version = self._version
        return twin

    def ordered(self) -> list[KVCacheBlock]:
        """The blocks held, smallest key first."""
        live = [
            (key, block_id)
            for key, version, block_id in self._entries
            if self._members.get(block_id, (None, -1))[1] == version
        ]
        live.sort()
        return [self._members[block_id][0] for _, block_id in live]

    def _compact(self) -> None:
        members = self._members
        self._entries = [e for e in self._entries if members.get(e[2], (None, -1))[1] == e[1]]
        heapq.heapify(self._entries)


class ScoredBlocks:
    """Blocks ordered by ``(score, seq)``, smallest first, where ``seq`` grows with every push and is kept
    in the block's ``policy_seq``. Blocks pushed with ``score == seq`` (no bonus: plain release order) sit
    in a :class:`BlockList` linked through the blocks, O(1) each way; the others in a :class:`BlockHeap`.
    ``pop`` takes the smaller of the two heads.

    A :meth:`copy` is detached and only pops: it holds every block in its heap and never reads or writes
    the blocks' links or numbers, so popping it leaves the original as it is."""

    __slots__ = ("_detached", "_heap", "_plain")

    def __init__(self) -> None:
        self._plain = BlockList()
        self._heap = BlockHeap()
        #: True in a copy: the links and numbers are the original's, so the plain list is not used
        self._detached = False

    def push(self, block: KVCacheBlock, score: float, seq: int) -> None:
        assert not self._detached, "a copy only pops"
        block.policy_seq = seq
        if score != seq:
            self._heap.push(block, (score, seq))
        else:
            self._plain.append(block)

    def extend_plain(self, blocks: Sequence[KVCacheBlock], first_seq: int) -> None:
        """``push(block, seq, seq)`` of each of ``blocks`` in order, with seqs from ``first_seq`` up (no
        bonus: release order), in one pass."""
        assert not self._detached, "a copy only pops"
        self._plain.extend_numbered(blocks, first_seq)

    def _in_plain(self, block: KVCacheBlock) -> bool:
        return not self._detached and block.prev_in_policy is not None

    def discard(self, block: KVCacheBlock) -> bool:
        if self._in_plain(block):
            self._plain.remove(block)
            return True
        return self._heap.discard(block)

    def holds(self, block: KVCacheBlock) -> bool:
        """Whether ``block`` is one of this one's blocks."""
        return self._in_plain(block) or block.block_id in self._heap

    def __len__(self) -> int:
        return self._plain.size + len(self._heap)

    def pop(self) -> KVCacheBlock:
        first = self._plain.first()
        if first is None:
            return self._heap.pop()
        if len(self._heap):
            seq = first.policy_seq
            key, _ = self._heap.peek()
            if key < (seq, seq):
                return self._heap.pop()
        return self._plain.popleft()

    def copy(self) -> ScoredBlocks:
        twin = ScoredBlocks()
        twin._detached = True
        twin._heap = self._heap.copy()
        for block in self._plain.blocks():
            seq = block.policy_seq
            twin._heap.push(block, (seq, seq))  # a plain block's key: score == seq
        return twin
