"""Blocks, the LRU free queue, the prefix-cache map and the BlockPool all KV cache groups share.

Invariants kept after every public call:
- every block is either in the free queue (ref_cnt == 0) or held (ref_cnt > 0); the null block is neither;
- a block has a hash iff the prefix-cache map holds it under that hash;
- free + used == num_gpu_blocks - 1 (the null block is not counted).
Eviction: the free queue's head is the least recently used block. A request frees its blocks tail
first, so among blocks freed together the ones covering the most tokens are evicted first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, cast

from mypy_extensions import mypyc_attr

from kvspec.blocks.block import BlockId, KVCacheBlock
from kvspec.blocks.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvspec.blocks.eviction import BatchEvictionPolicy, BlockUse, EvictionPolicy, watches_block_use
from kvspec.blocks.hashing import (
    GROUP_SUFFIXES,
    BlockHashListWithBlockSize,
    get_block_hash,
    get_group_id,
    group_suffix,
)
from kvspec.blocks.metrics import BlockMetricsObserver
from kvspec.blocks.request_view import RequestView
from kvspec.errors import BlockPoolError, InvariantError, NotEnoughFreeBlocksError

logger = logging.getLogger(__name__)


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
            cur = nxt
        self._relink_head(cur, n)
        return out

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


class BlockHashToBlockMap:
    """Prefix-cache map: key -> one block, or a dict of blocks when several hold the same content.

    Duplicates are kept, not merged: block tables are append-only, so a block id never changes.

    A block is cached under its ``block_hash`` and, rarely, under secondary keys too (vLLM 0.34's partial
    prompt-tail entry re-registered on a block that has since become full): evicting the block drops them all.
    """

    __slots__ = ("_cache", "_secondary")

    def __init__(self) -> None:
        self._cache: dict[bytes, KVCacheBlock | dict[int, KVCacheBlock]] = {}
        #: block id -> the keys other than its block_hash it is cached under (most pools: empty).
        self._secondary: dict[int, list[bytes]] = {}

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        entry = self._cache.get(key)
        if entry is None or isinstance(entry, KVCacheBlock):
            return entry
        return next(iter(entry.values()))

    def first_blocks(self, block_hash: bytes, kv_cache_group_ids: Sequence[int]) -> list[KVCacheBlock] | None:
        """The block cached under ``block_hash`` for every group (the first of any duplicates), or None at
        the first group that misses (most positions of a sliding-window search miss in the first group)."""
        cache = self._cache
        suffixes = GROUP_SUFFIXES
        out: list[KVCacheBlock] = []
        for gid in kv_cache_group_ids:
            # group_suffix inlined: this runs per window block and group, and a call per group shows
            entry = cache.get(block_hash + (suffixes[gid] if 0 <= gid < 256 else group_suffix(gid)))
            if entry is None:
                return None
            if type(entry) is KVCacheBlock:
                out.append(entry)
            else:
                out.append(next(iter(cast("dict[int, KVCacheBlock]", entry).values())))
        return out

    def longest_chain(self, hashes: Sequence[bytes], suffix: bytes, limit: int) -> list[KVCacheBlock]:
        """Blocks cached under ``hashes[i] + suffix`` for i = 0, 1, ... up to the first miss (at most
        ``limit``). One block per hit: the first of any duplicates."""
        cache = self._cache
        out: list[KVCacheBlock] = []
        append = out.append
        for i in range(min(limit, len(hashes))):
            entry = cache.get(hashes[i] + suffix)
            if entry is None:
                break
            if type(entry) is KVCacheBlock:
                append(entry)
            else:
                append(next(iter(cast("dict[int, KVCacheBlock]", entry).values())))
        return out

    def publish(
        self,
        blocks: Sequence[KVCacheBlock],
        hashes: Sequence[bytes],
        start: int,
        end: int,
        suffix: bytes,
        block_mask: Sequence[bool] | None,
        stored: list[bytes] | None,
        block_tokens: int = 0,
    ) -> list[bytes] | None:
        """Cache ``blocks[i]`` under ``hashes[i] + suffix`` for ``start <= i < end`` (the block gets that
        key as its ``block_hash``, covering ``(i + 1) * block_tokens`` tokens), skipping null and masked-out
        blocks; each hash stored is appended to ``stored`` when given (for events). A block cached so far
        only under a shorter partial prompt-tail entry is promoted: those keys are dropped and returned (for
        BlockRemoved events; None when none was). One pass: every full block a request completes runs it."""
        cache = self._cache
        promoted: list[bytes] | None = None
        # Lists indexed directly (the common case: a request's block list and its hash list); one dict
        # operation per block: this runs for every full block a request completes.
        block_list: list[KVCacheBlock] = blocks if isinstance(blocks, list) else list(blocks)
        hash_list: list[bytes] = hashes if isinstance(hashes, list) else list(hashes[start:end])
        offset = 0 if isinstance(hashes, list) else start
        # As far as both lists reach (a zip of the two slices before).
        stop = min(end, len(block_list), offset + len(hash_list))
        for i in range(start, stop):
            block = block_list[i]
            if block.is_null or (block_mask is not None and not block_mask[i]):
                continue
            block_hash = hash_list[i - offset]
            if block.block_hash is not None:
                covered = block.block_hash_num_tokens
                if covered is None or covered >= (i + 1) * block_tokens:
                    raise BlockPoolError(
                        f"Block {block.block_id} already has a hash; it cannot be cached again."
                    )
                if promoted is None:
                    promoted = []
                promoted.extend(self.evict([block]))
            key = block_hash + suffix
            block.block_hash = key
            block.block_hash_num_tokens = (i + 1) * block_tokens
            if cache.setdefault(key, block) is not block:
                self.insert(key, block)  # a duplicate of cached content: kept beside it
            if stored is not None:
                stored.append(block_hash)
        return promoted

    def contains(self, key: bytes, block_id: int) -> bool:
        """Whether block ``block_id`` is cached under ``key`` (as its hash or a secondary key)."""
        entry = self._cache.get(key)
        if entry is None:
            return False
        if isinstance(entry, KVCacheBlock):
            return entry.block_id == block_id
        return block_id in entry

    def add_secondary(self, key: bytes, block: KVCacheBlock) -> None:
        """Cache ``block`` (which has a hash) under ``key`` too; evicting it drops ``key`` as well."""
        self.insert(key, block)
        self._secondary.setdefault(block.block_id, []).append(key)

    def secondary_keys(self, block_id: int) -> list[bytes]:
        return list(self._secondary.get(block_id, ()))

    def secondary_keys_by_block(self) -> dict[int, list[bytes]]:
        """Every block cached under keys besides its own hash: block id -> those keys (a copy)."""
        return {block_id: list(keys) for block_id, keys in self._secondary.items() if keys}

    def evict(self, blocks: Sequence[KVCacheBlock]) -> list[bytes]:
        """Drop the cached content of ``blocks`` (each has a hash; a block not under its hash is left as
        it is); their hash is cleared. The keys dropped, in order."""
        cache = self._cache
        dropped: list[bytes] = []
        for block in blocks:
            key = block.block_hash
            if key is None:
                continue
            if cache.get(key) is block:
                del cache[key]  # the common eviction: the only block under its hash
            elif self.pop(key, block.block_id) is None:
                continue
            block.block_hash = None
            block.block_hash_num_tokens = None
            dropped.append(key)
            if self._secondary:
                for extra in self._secondary.pop(block.block_id, ()):
                    if self.pop(extra, block.block_id) is not None:
                        dropped.append(extra)
        return dropped

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        entry = self._cache.get(key)
        if entry is None:
            self._cache[key] = block
        elif isinstance(entry, KVCacheBlock):
            self._cache[key] = {entry.block_id: entry, block.block_id: block}
        else:
            entry[block.block_id] = block

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        entry = self._cache.pop(key, None)
        if entry is None:
            return None
        if isinstance(entry, KVCacheBlock):
            if entry.block_id == block_id:
                return entry
            self._cache[key] = entry
            return None
        block = entry.pop(block_id, None)
        if len(entry) > 1:
            self._cache[key] = entry
        elif entry:
            self._cache[key] = next(iter(entry.values()))
        return block

    def blocks_for(self, key: bytes) -> list[KVCacheBlock]:
        entry = self._cache.get(key)
        if entry is None:
            return []
        if isinstance(entry, KVCacheBlock):
            return [entry]
        return list(entry.values())

    def items(self) -> Iterable[tuple[bytes, KVCacheBlock]]:
        for key, entry in self._cache.items():
            if isinstance(entry, KVCacheBlock):
                yield key, entry
            else:
                for block in entry.values():
                    yield key, block

    def __len__(self) -> int:
        return len(self._cache)


class CachedBlocksLookup:
    """An eviction policy's read-only view of a pool's prefix-cache map (``EvictionContext.cached_blocks``):
    the blocks cached under a key, free or held. Made before the pool (the policy is built first) and bound
    to its map once the pool exists; before that it holds nothing."""

    __slots__ = ("_map",)

    def __init__(self) -> None:
        self._map: BlockHashToBlockMap | None = None

    def bind(self, cache_map: BlockHashToBlockMap) -> None:
        self._map = cache_map

    def __call__(self, key: bytes) -> list[KVCacheBlock]:
        return [] if self._map is None else self._map.blocks_for(key)


@mypyc_attr(allow_interpreted_subclasses=True)  # integrations and tests subclass it in plain Python
class BlockPool:
    """All physical blocks of the KV cache, shared by every group; block 0 is the null block.

    The null block stands for positions a request no longer needs (outside a sliding window, skipped
    Mamba states); it never enters the free queue and never gets a hash.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool = True,
        hash_block_size: int = 16,
        enable_kv_cache_events: bool = False,
        medium: str = "GPU",
        metrics_collector: BlockMetricsObserver | None = None,
        free_unhashed_first: bool = False,
        coarse_hash_is_last_fine: bool = False,
        hash_lookahead_tokens: int = 0,
        eviction_policy: EvictionPolicy | None = None,
    ) -> None:
        if num_gpu_blocks <= 0:
            raise BlockPoolError(f"BlockPool needs at least 1 block (the null block), got {num_gpu_blocks}.")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        self.medium = medium
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        #: Orders the eviction of free cached blocks (``kvspec.blocks.eviction``); None: LRU in vLLM's own
        #: free-queue order (the linked list alone, the fast path).
        self.eviction_policy = eviction_policy
        #: The policy again when it reads who uses blocks (``watches_block_use``): on_cached and on_hit go to
        #: it; a policy that ignores them is spared building the calls (a list and a BlockUse per publish).
        self._use_watcher: EvictionPolicy | None = (
            eviction_policy if eviction_policy is not None and watches_block_use(eviction_policy) else None
        )
        self.free_block_queue: FreeKVCacheBlockQueue = (
            FreeKVCacheBlockQueue(self.blocks)
            if eviction_policy is None
            else PolicyFreeQueue(self.blocks, eviction_policy)
        )
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.kv_event_queue: list[KVCacheEvent] = []
        #: Told when blocks are allocated, hit and evicted (kvspec.blocks.metrics); None: nothing is told.
        self.metrics_collector = metrics_collector
        #: vLLM 0.34's free order (``PoolRules.free_unhashed_first``): a freed block without a hash (any
        #: block when caching is off) is reused first, a hashed one last.
        self.free_unhashed_first = free_unhashed_first
        #: How a block of a multiple of the hash block size is keyed (``ReleaseProfile``): the last fine hash
        #: (vLLM 0.34) or the concatenation of its fine hashes (0.23).
        self.coarse_hash_is_last_fine = coarse_hash_is_last_fine
        #: Tokens after each block that its hash also covers (vLLM 0.34's EAGLE lookahead block hashes: the
        #: drafter's KV at a block's last position depends on them). A block is published only once its hash
        #: exists, and its BlockStored event carries those tokens and extra keys over the block and them.
        self.hash_lookahead_tokens = hash_lookahead_tokens
        #: Per group: the declared kind and sliding window its BlockStored events carry (the coordinator
        #: sets them, so events are born annotated); empty: events leave the pool without them.
        self.stored_event_kinds: Sequence[tuple[str, int | None]] = ()

    # -- the lookup API a hit search uses (kvspec.contracts.manager.HitQuery.block_pool); it never
    # changes the pool. The map itself (cached_block_hash_to_block) is the pool's to write.

    def get_cached_prefix(
        self, block_hashes: Sequence[bytes], kv_cache_group_id: int, max_num_blocks: int
    ) -> list[KVCacheBlock]:
        """The cached blocks of group ``kv_cache_group_id`` under ``block_hashes[0]``, ``[1]``, ... up to
        the first miss, at most ``max_num_blocks`` (one block per hash: the first of any duplicates).
        A left-to-right prefix search (full attention) is one call."""
        return self.cached_block_hash_to_block.longest_chain(
            block_hashes, group_suffix(kv_cache_group_id), max_num_blocks
        )

    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[KVCacheBlock] | None:
        """One cached block per group for ``block_hash``, or None if any group misses (a search that
        tests positions one by one, sliding windows and states)."""
        if len(kv_cache_group_ids) == 1:
            gid = kv_cache_group_ids[0]
            block = self.cached_block_hash_to_block.get_one_block(block_hash + group_suffix(gid))
            return None if block is None else [block]
        # A sliding-window hit asks this for every block of the window and every group of the spec: the
        # group suffixes come from a table, and the map is called once per position, not once per group.
        return self.cached_block_hash_to_block.first_blocks(block_hash, kv_cache_group_ids)

    def cache_full_blocks(
        self,
        request: RequestView,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        """Publish ``blocks[num_cached_blocks:num_full_blocks]`` under the request's block hashes.

        Null and masked-out blocks are skipped. ``block_size`` may be a multiple of the pool's hash
        block size; hashes of the coarser size are concatenations of the fine ones.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        hashes: Sequence[bytes] = request.block_hashes
        if block_size != self.hash_block_size:
            hashes = BlockHashListWithBlockSize(
                hashes, self.hash_block_size, block_size, self.coarse_hash_is_last_fine
            )
        if len(hashes) < num_full_blocks:
            raise BlockPoolError(
                f"Request {request.request_id!r} has {len(hashes)} block hashes of size {block_size}, "
                f"fewer than the {num_full_blocks} full blocks to cache; was it built with a BlockHasher "
                f"of block size {self.hash_block_size}?"
            )
        stored: list[bytes] | None = [] if self.enable_kv_cache_events else None
        promoted = self.cached_block_hash_to_block.publish(
            blocks,
            hashes,
            num_cached_blocks,
            num_full_blocks,
            group_suffix(kv_cache_group_id),
            block_mask,
            stored,
            block_size,
        )
        if promoted:
            self._removed_events(promoted)
        if self._use_watcher is not None:
            self._use_watcher.on_cached(
                [
                    b
                    for i, b in enumerate(blocks[num_cached_blocks:num_full_blocks], num_cached_blocks)
                    if not b.is_null and (block_mask is None or block_mask[i])
                ],
                block_use(request),
            )
        if stored is not None:  # an event even when every new block was null or masked (as vLLM 0.23)
            parent = hashes[num_cached_blocks - 1] if num_cached_blocks > 0 else None
            # One entry per stored block, None for a block without extra keys (vLLM 0.23's form).
            needs_keys = request.needs_extra_keys
            extra: list[tuple[Any, ...] | None] = []
            lookahead = self.hash_lookahead_tokens
            lookahead_ids: list[list[int]] | None = [] if lookahead else None
            for i in range(num_cached_blocks, num_full_blocks):
                if blocks[i].is_null or (block_mask is not None and not block_mask[i]):
                    continue
                end = (i + 1) * block_size
                extra.append(
                    request.extra_keys_for_range(i * block_size, end + lookahead) if needs_keys else None
                )
                if lookahead_ids is not None:
                    lookahead_ids.append(list(request.all_token_ids[end : end + lookahead]))
            self._queue_stored(
                request,
                stored,
                parent,
                num_cached_blocks * block_size,
                num_full_blocks * block_size,
                block_size,
                extra or None,
                kv_cache_group_id,
                lookahead_ids,
            )

    def _queue_stored(
        self,
        request: RequestView,
        block_hashes: list[bytes],
        parent: bytes | None,
        start: int,
        end: int,
        block_size: int,
        extra_keys: list[tuple[Any, ...] | None] | None,
        kv_cache_group_id: int,
        lookahead_ids: list[list[int]] | None,
    ) -> None:
        """Queue a BlockStored event for ``block_hashes`` over the request's tokens [start, end)."""
        kinds = self.stored_event_kinds
        kind: str | None = None
        window: int | None = None
        if 0 <= kv_cache_group_id < len(kinds):
            kind, window = kinds[kv_cache_group_id]
        self.kv_event_queue.append(
            BlockStored(
                block_hashes=block_hashes,
                parent_block_hash=parent,
                token_ids=list(request.all_token_ids[start:end]),
                block_size=block_size,
                lora_id=request.lora_id,
                medium=self.medium,
                lora_name=request.lora_name,
                cache_salt=request.cache_salt,
                extra_keys=extra_keys,
                group_idx=kv_cache_group_id,
                kv_cache_spec_kind=kind,
                kv_cache_spec_sliding_window=window,
                lookahead_token_ids=lookahead_ids,
                # An optional member of a request view (vLLM 0.23's requests have no session).
                session_id=getattr(request, "session_id", None),
            )
        )

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` from the free queue's head (evicting their cached content), ref_cnt 1."""
        queue = self.free_block_queue
        if num_blocks > queue.num_free_blocks:
            raise NotEnoughFreeBlocksError(f"Cannot get {num_blocks} free blocks from the pool")
        hashed: list[KVCacheBlock] = []
        blocks = queue.take_n(num_blocks, hashed)
        if hashed:
            self._drop_cached(hashed)
        observer = self.metrics_collector
        if observer is not None:
            # Reallocation ends the block's previous residency and starts a new one.
            for taken in blocks:
                if self.enable_caching:
                    observer.on_block_evicted(taken)
                observer.on_block_allocated(taken)
        return blocks

    def _drop_cached(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Evict the cached content of ``blocks`` (those with a hash), with a BlockRemoved event each."""
        self._removed_events(self.cached_block_hash_to_block.evict(blocks))

    def _removed_events(self, keys: Sequence[bytes]) -> None:
        """A BlockRemoved event per dropped key (with events on)."""
        if self.enable_kv_cache_events:
            medium = self.medium
            for key in keys:
                self.kv_event_queue.append(
                    BlockRemoved(
                        block_hashes=[get_block_hash(key)], medium=medium, group_idx=get_group_id(key)
                    )
                )

    def cache_partial_block(
        self,
        request: RequestView,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        *,
        replace_existing: bool = False,
    ) -> bytes | None:
        """Make ``block`` reachable at the prefix of ``num_tokens`` tokens (a multiple of the hash block,
        ending inside the block): vLLM 0.34's partial prompt-tail entry, keyed by the request's fine hash
        at that boundary. A block without a hash takes the entry as its hash (so it is freed as a hashed
        block and evicted with a BlockRemoved event); an entry covering fewer tokens is replaced; a block
        already cached further (it has become full) keeps its hash and gets the entry as a secondary key.
        With ``replace_existing`` (the block's content was replaced: a Mamba prefill checkpoint written
        into it) every key it has is dropped first. A new entry emits a BlockStored event for its last hash
        block. Returns the key (None: null block)."""
        if block.is_null:
            return None
        hash_block = self.hash_block_size
        num_hashes = num_tokens // hash_block
        if num_tokens % hash_block or not 0 < num_hashes <= len(request.block_hashes):
            raise BlockPoolError(
                f"A partial entry at {num_tokens} tokens needs a multiple of the hash block ({hash_block}) "
                f"within the request's {len(request.block_hashes)} block hashes."
            )
        fine = request.block_hashes[num_hashes - 1]
        key = fine + group_suffix(kv_cache_group_id)
        cache = self.cached_block_hash_to_block
        if replace_existing:
            self._drop_cached([block])
        already = block.block_hash == key or cache.contains(key, block.block_id)
        covered = block.block_hash_num_tokens
        if not already and covered is not None and covered < num_tokens:
            self._drop_cached([block])
        if block.block_hash is None:
            block.block_hash = key
            block.block_hash_num_tokens = num_tokens
            cache.insert(key, block)
        elif not already:
            cache.add_secondary(key, block)
        if self._use_watcher is not None and not already:
            self._use_watcher.on_cached([block], block_use(request))
        if self.enable_kv_cache_events and not already:
            start = num_tokens - hash_block
            lookahead = self.hash_lookahead_tokens
            self._queue_stored(
                request,
                [fine],
                request.block_hashes[num_hashes - 2] if num_hashes > 1 else None,
                start,
                num_tokens,
                hash_block,
                [request.extra_keys_for_range(start, num_tokens) if request.needs_extra_keys else None],
                kv_cache_group_id,
                [list(request.all_token_ids[num_tokens : num_tokens + lookahead])] if lookahead else None,
            )
        return key

    def move_block_hashes(
        self, src_block: KVCacheBlock, dst_block: KVCacheBlock, use: BlockUse | None = None
    ) -> None:
        """Re-key every prefix-cache entry of ``src_block`` (its hash and any secondary keys, with the tokens
        it covers) to ``dst_block``, which holds a copy of its content: the request owning ``src_block`` keeps
        writing into it, so the cache keeps the copy instead (vLLM 0.34's ``move_block_hashes``). The entries
        stay live: no event. ``dst_block`` must be a real block without a hash. An eviction policy learns of
        the copy as cached by ``use`` (the request that cached the entry)."""
        if dst_block.is_null or src_block.is_null or dst_block.block_hash is not None:
            raise BlockPoolError(
                f"move_block_hashes needs two real blocks and a target without a hash; got block "
                f"{src_block.block_id} -> block {dst_block.block_id} (hash {dst_block.block_hash!r})."
            )
        key = src_block.block_hash
        if key is None:
            return
        num_tokens = src_block.block_hash_num_tokens
        cache = self.cached_block_hash_to_block
        secondary = cache.secondary_keys(src_block.block_id)
        cache.evict([src_block])
        dst_block.block_hash = key
        dst_block.block_hash_num_tokens = num_tokens
        cache.insert(key, dst_block)
        for extra in secondary:
            cache.add_secondary(extra, dst_block)
        if self._use_watcher is not None and use is not None:
            self._use_watcher.on_cached([dst_block], use)

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks; free ones leave the free queue."""
        remove = self.free_block_queue.remove
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                remove(block)
            block.ref_cnt += 1
        observer = self.metrics_collector
        if observer is not None:
            for block in blocks:
                observer.on_block_accessed(block)

    def note_hit(self, request: RequestView, blocks: Sequence[KVCacheBlock]) -> None:
        """Tell the eviction policy (if any) that ``request`` was admitted with ``blocks`` as its prefix hit
        (after ``touch``); null blocks are left out."""
        if self._use_watcher is not None:
            hit = [b for b in blocks if not b.is_null]
            if hit:
                self._use_watcher.on_hit(hit, block_use(request))

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock], prepend: bool = False) -> None:
        """Drop one reference on each block; blocks reaching 0 join the free queue in the given order
        (at the tail, or at the head with ``prepend`` so they are reused first). With
        ``free_unhashed_first`` (vLLM 0.34), blocks without a hash go to the head and hashed ones to the tail
        unless ``prepend`` puts them all at the head."""
        if self.free_unhashed_first and not prepend:
            self.free_block_queue.release_by_hash(ordered_blocks, self.enable_caching)
            return
        self.free_block_queue.release(ordered_blocks, prepend)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop cached content of blocks (a KV connector found it stale); the blocks stay where they are."""
        ids = list(block_ids)
        for block_id in ids:
            if not 0 <= block_id < self.num_gpu_blocks:
                raise BlockPoolError(
                    f"evict_blocks got block id {block_id}, outside [0, {self.num_gpu_blocks}); "
                    "this indicates a bug in the KV connector."
                )
        observer = self.metrics_collector
        for block_id in ids:
            if observer is not None:
                observer.on_block_evicted(self.blocks[block_id])
        self._drop_cached([self.blocks[block_id] for block_id in ids])

    def reset_prefix_cache(self, num_reserved: int = 0) -> bool:
        """Forget every cached hash; refused (False) while any block other than the null block and
        ``num_reserved`` blocks a manager holds for its lifetime is in use."""
        num_used = self.num_gpu_blocks - self.get_num_free_blocks() - num_reserved
        if num_used != 1:
            logger.warning(
                "Failed to reset prefix cache because some blocks (%d) are not freed yet", num_used - 1
            )
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.block_hash = None
            block.block_hash_num_tokens = None
        if self.metrics_collector is not None:
            self.metrics_collector.reset()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of usable blocks (null block excluded) that are held by requests."""
        total = self.num_gpu_blocks - 1
        if total <= 0:
            return 0.0
        return 1.0 - self.get_num_free_blocks() / total

    def take_events(self) -> list[KVCacheEvent]:
        if not self.enable_kv_cache_events:
            return []
        events, self.kv_event_queue = self.kv_event_queue, []
        return events

    def check_invariants(self) -> None:
        """Raise BlockPoolError if the free queue, ref counts or cache map disagree (for tests/debug)."""
        free = self.free_block_queue.get_all_free_blocks()
        if len(free) != self.free_block_queue.num_free_blocks:
            raise InvariantError("free queue length and counter disagree")
        free_ids = {b.block_id for b in free}
        if len(free_ids) != len(free):
            raise InvariantError("a block is in the free queue twice")
        for block in self.blocks:
            if block.is_null:
                if block.block_id in free_ids or block.block_hash is not None:
                    raise InvariantError("the null block is free or hashed")
                continue
            if (block.ref_cnt == 0) != (block.block_id in free_ids):
                raise InvariantError(
                    f"block {block.block_id}: ref_cnt={block.ref_cnt} but free={block.block_id in free_ids}"
                )
            if block.ref_cnt < 0:
                raise InvariantError(f"block {block.block_id} has ref_cnt {block.ref_cnt}")
            if (block.block_hash is None) != (block.block_hash_num_tokens is None):
                raise InvariantError(
                    f"block {block.block_id}: hash {block.block_hash!r} but covers "
                    f"{block.block_hash_num_tokens!r} tokens (both are set, or neither)"
                )
            if block.block_hash is not None and block not in self.cached_block_hash_to_block.blocks_for(
                block.block_hash
            ):
                raise InvariantError(f"block {block.block_id} has a hash the cache map does not hold")
        cache = self.cached_block_hash_to_block
        for key, block in cache.items():
            if block.block_hash != key and key not in cache.secondary_keys(block.block_id):
                raise InvariantError(f"cache map holds block {block.block_id} under a foreign hash")


def block_use(request: RequestView) -> BlockUse:
    """What an eviction policy learns of a request: its id, priority and retention (optional members of a
    request view: kvspec's ``Request`` has them, an engine's view may not)."""
    return BlockUse(
        request_id=request.request_id,
        priority=getattr(request, "priority", 0),
        retention_seconds=getattr(request, "retention_seconds", None),
    )


__all__ = [
    "BlockHashToBlockMap",
    "BlockId",
    "BlockPool",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "PolicyFreeQueue",
    "block_use",
]
