"""The BlockPool all KV cache groups share: its blocks, its free queue (:mod:`kvspec.blocks.free_queue`) and
its prefix-cache map (:mod:`kvspec.blocks.cache_map`).

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
from typing import Any

from mypy_extensions import mypyc_attr

from kvspec.blocks.block import BlockId, KVCacheBlock
from kvspec.blocks.cache_map import BlockHashToBlockMap, CachedBlocksLookup
from kvspec.blocks.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvspec.blocks.eviction import BlockUse, EvictionPolicy, watches_block_use
from kvspec.blocks.free_queue import FreeKVCacheBlockQueue, PolicyFreeQueue
from kvspec.blocks.hashing import (
    BlockHashListWithBlockSize,
    get_block_hash,
    get_group_id,
    group_suffix,
)
from kvspec.blocks.metrics import BlockMetricsObserver
from kvspec.blocks.request_view import RequestView
from kvspec.errors import BlockPoolError, InvariantError, NotEnoughFreeBlocksError

logger = logging.getLogger(__name__)


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
    "CachedBlocksLookup",
    "BlockId",
    "BlockPool",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "PolicyFreeQueue",
    "block_use",
]
