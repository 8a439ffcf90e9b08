"""A block of the pool: its id, reference count, cached hash, free-queue links and an eviction policy's links."""

from __future__ import annotations

from typing import NewType

#: A block's index in the pool (and in every KV cache tensor): 0 <= id < num_gpu_blocks; 0 is the null block.
BlockId = NewType("BlockId", int)


class KVCacheBlock:
    """One block id of the pool, with its reference count and (once full and cached) its hash."""

    __slots__ = (
        "block_hash",
        "block_hash_num_tokens",
        "block_id",
        "is_null",
        "next_free_block",
        "next_in_policy",
        "policy_seq",
        "prev_free_block",
        "prev_in_policy",
        "ref_cnt",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = BlockId(block_id)
        self.ref_cnt = 0
        #: The block's BlockHashWithGroupId once it is full and cached, else None.
        self.block_hash: bytes | None = None
        #: The prefix tokens its hash covers (the end of the block in its request), while cached.
        self.block_hash_num_tokens: int | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        #: An eviction policy's own links (``kvspec.eviction.BlockList``): a policy may thread its order
        #: through the free blocks it holds; the pool never reads or writes them.
        self.prev_in_policy: KVCacheBlock | None = None
        self.next_in_policy: KVCacheBlock | None = None
        #: An eviction policy's own number for the block (its release order, say); the pool never reads it.
        self.policy_seq = 0
        self.is_null = False

    def __repr__(self) -> str:
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"hashed={self.block_hash is not None}, prev={prev_id}, next={next_id})"
        )


__all__ = ["BlockId", "KVCacheBlock"]
