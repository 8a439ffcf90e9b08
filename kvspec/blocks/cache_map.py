"""The prefix-cache map: block hash (with its group suffix) -> the cached blocks under it.

Invariant: a block has a hash iff the map holds it under that hash (or under one of its secondary keys, a
partial prompt-tail entry). :class:`CachedBlocksLookup` lets an eviction policy read the map before the pool
that owns it exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from kvspec.blocks.block import KVCacheBlock
from kvspec.blocks.hashing import GROUP_SUFFIXES, group_suffix
from kvspec.errors import BlockPoolError


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


__all__ = ["BlockHashToBlockMap", "CachedBlocksLookup"]
