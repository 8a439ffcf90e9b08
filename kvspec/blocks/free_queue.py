"""The free block queue: blocks no request holds, in eviction order (the head is evicted first).

:class:`FreeKVCacheBlockQueue` is vLLM's doubly linked LRU list over the blocks themselves (O(1) removal
from the middle when a cached block is hit); :class:`PolicyFreeQueue` hands the order to an eviction policy.
Invariant: a block is in the queue iff its ref_cnt is 0 and it is not the null block.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvspec.blocks.block import KVCacheBlock
from kvspec.blocks.eviction import BatchEvictionPolicy, EvictionPolicy
from kvspec.errors import BlockPoolError, InvariantError, NotEnoughFreeBlocksError


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks threaded through the blocks themselves (O(1), no allocation).

    Starts in block-id order; ``popleft`` takes the least recently used block.
    """

    __slots__ = ("_head", "_tail", "num_free_blocks")

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        prev = self._head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self._tail
        self._tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        first = self._head.next_free_block
        if first is None or first is self._tail:
            raise NotEnoughFreeBlocksError("No free blocks available")
        nxt = first.next_free_block
        if nxt is None:
            raise InvariantError(f"Free queue is corrupt at block {first.block_id}")
        self._head.next_free_block = nxt
        nxt.prev_free_block = self._head
        first.prev_free_block = first.next_free_block = None
        self.num_free_blocks -= 1
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take ``n`` blocks from the head, in order (vLLM's queue API; the pool uses :meth:`take_n`)."""
        self._check_can_take(n)  # all or none: a short queue is refused before any block leaves it
        return [self.popleft() for _ in range(n)]

    def take_n(self, n: int, hashed: list[KVCacheBlock]) -> list[KVCacheBlock]:
        """Take ``n`` blocks from the head into use, in one pass (every allocation runs it): each leaves the
        queue with one reference, and those that still have a hash (cached content about to be evicted)
        are appended to ``hashed``."""
        if n == 0:
            return []
        self._check_can_take(n)
        out: list[KVCacheBlock] = []
        append = out.append
        cur = self._head.next_free_block
        for _ in range(n):
            assert cur is not None
            append(cur)
            nxt = cur.next_free_block
            cur.prev_free_block = cur.next_free_block = None
            cur.ref_cnt = 1
            if cur.block_hash is not None:
                hashed.append(cur)
            cur = nxt
        self._relink_head(cur, n)
        return out

    def _check_can_take(self, n: int) -> None:
        if n > self.num_free_blocks:
            raise NotEnoughFreeBlocksError(
                f"Cannot take {n} blocks from a free queue of {self.num_free_blocks}"
            )

    def _relink_head(self, first_left: KVCacheBlock | None, n: int) -> None:
        assert first_left is not None
        self._head.next_free_block = first_left
        first_left.prev_free_block = self._head
        self.num_free_blocks -= n

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise BlockPoolError(f"remove() called on block {block.block_id}, which is not free")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free_block
        assert last is not None
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        if not blocks:
            return
        last = self._tail.prev_free_block
        assert last is not None
        for block in blocks:
            block.prev_free_block = last
            last.next_free_block = block
            last = block
        last.next_free_block = self._tail
        self._tail.prev_free_block = last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put ``blocks`` at the head, keeping their order (they will be reused first)."""
        if not blocks:
            return
        first = self._head.next_free_block
        assert first is not None
        prev = self._head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = first
        first.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    def release(self, ordered_blocks: Iterable[KVCacheBlock], prepend: bool = False) -> None:
        """Drop one reference on each block; blocks reaching 0 (never the null block) join the queue in the
        given order, at the tail (evicted last) or with ``prepend`` at the head (reused first). One pass:
        this runs for every finished request."""
        if prepend:
            self.release_by_hash(ordered_blocks, keep_hashed_last=False)  # every released block to the head
            return
        tail = self._tail
        last = tail.prev_free_block
        assert last is not None
        count = 0
        for block in ordered_blocks:
            ref_cnt = block.ref_cnt - 1
            block.ref_cnt = ref_cnt
            if ref_cnt == 0 and not block.is_null:
                last.next_free_block = block
                block.prev_free_block = last
                last = block
                count += 1
        last.next_free_block = tail
        tail.prev_free_block = last
        self.num_free_blocks += count

    def release_by_hash(self, ordered_blocks: Iterable[KVCacheBlock], keep_hashed_last: bool) -> None:
        """Drop one reference on each block; of those reaching 0 (never the null block), the ones without a
        hash (all of them unless ``keep_hashed_last``) join the head in the given order and the others the
        tail in the given order (vLLM 0.34's ``free_blocks``)."""
        first, last = self._drop_references(ordered_blocks, keep_hashed_last)
        self.prepend_n(first)
        self.append_n(last)

    @staticmethod
    def _drop_references(
        ordered_blocks: Iterable[KVCacheBlock], keep_hashed_last: bool
    ) -> tuple[list[KVCacheBlock], list[KVCacheBlock]]:
        """Drop one reference on each block; those reaching 0 (never the null block), in the given order:
        the ones to reuse first (no hash, or every one unless ``keep_hashed_last``) and the hashed rest."""
        first: list[KVCacheBlock] = []
        last: list[KVCacheBlock] = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                if keep_hashed_last and block.block_hash is not None:
                    last.append(block)
                else:
                    first.append(block)
        return first, last

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out: list[KVCacheBlock] = []
        cur = self._head.next_free_block
        while cur is not None and cur is not self._tail:
            out.append(cur)
            cur = cur.next_free_block
        return out


class PolicyFreeQueue(FreeKVCacheBlockQueue):
    """The free queue when an :class:`~kvspec.blocks.eviction.EvictionPolicy` orders eviction.

    Two parts: the linked list of the base class holds the blocks to reuse first (no hash, or released to
    the head), in vLLM 0.34's order (without a hash: the head, in the order given); the policy holds the
    free blocks with cached content and names the next victim once the list is empty. ``num_free_blocks``
    counts both. With a policy that evicts in release order (LRU), the blocks handed out equal the base
    queue's under vLLM 0.34's free order (``free_unhashed_first``) whatever the calls.
    """

    __slots__ = ("_batch", "policy")

    def __init__(self, blocks: Sequence[KVCacheBlock], policy: EvictionPolicy) -> None:
        super().__init__(blocks)
        self.policy = policy
        #: The policy again when it takes a request's blocks in one call (``BatchEvictionPolicy``): the pool
        #: then calls it once per release and allocation, not once per block.
        self._batch: BatchEvictionPolicy | None = policy if isinstance(policy, BatchEvictionPolicy) else None

    def popleft(self) -> KVCacheBlock:
        if self._head.next_free_block is not self._tail:
            return super().popleft()
        if len(self.policy) == 0:
            raise NotEnoughFreeBlocksError("No free blocks available")
        block = self.policy.pop_victim()
        self.num_free_blocks -= 1
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        self._check_can_take(n)
        return [self.popleft() for _ in range(n)]

    def take_n(self, n: int, hashed: list[KVCacheBlock]) -> list[KVCacheBlock]:
        """The list's blocks first, in one pass of the base class, then the policy's victims."""
        self._check_can_take(n)
        listed = self.num_free_blocks - len(self.policy)
        from_list = n if n <= listed else listed
        out = super().take_n(from_list, hashed) if from_list else []
        rest = n - from_list
        if rest:
            batch = self._batch
            victims = (
                batch.pop_victims(rest)
                if batch is not None
                else [self.policy.pop_victim() for _ in range(rest)]
            )
            self.num_free_blocks -= rest
            for block in victims:
                block.ref_cnt = 1
                if block.block_hash is not None:
                    hashed.append(block)
            out.extend(victims)
        return out

    def remove(self, block: KVCacheBlock) -> None:
        if block.prev_free_block is not None:
            super().remove(block)
            return
        if block.ref_cnt != 0 or block.is_null:
            raise BlockPoolError(f"remove() called on block {block.block_id}, which is not free")
        try:
            self.policy.remove(block)
        except KeyError:
            raise BlockPoolError(
                f"remove() called on block {block.block_id}, which is not free (its eviction policy does not "
                "hold it)"
            ) from None
        self.num_free_blocks -= 1

    def release(self, ordered_blocks: Iterable[KVCacheBlock], prepend: bool = False) -> None:
        self.release_by_hash(ordered_blocks, keep_hashed_last=not prepend)

    def release_by_hash(self, ordered_blocks: Iterable[KVCacheBlock], keep_hashed_last: bool) -> None:
        """Blocks reaching 0 references: without a hash (every one unless ``keep_hashed_last``) to the list's
        head in the given order; with one, to the policy in the given order."""
        first, cached = self._drop_references(ordered_blocks, keep_hashed_last)
        self.prepend_n(first)
        if cached:
            batch = self._batch
            if batch is not None:
                batch.add_blocks(cached)
            else:
                add = self.policy.add
                for block in cached:
                    add(block)
            self.num_free_blocks += len(cached)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        return super().get_all_free_blocks() + self.policy.evictable_blocks()


__all__ = ["FreeKVCacheBlockQueue", "PolicyFreeQueue"]
