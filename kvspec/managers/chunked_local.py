"""Chunked local attention: tokens read only their own chunk, so finished chunks are freed."""

from __future__ import annotations

from kvspec.blocks.pool import KVCacheBlock
from kvspec.contracts.manager import HitQuery, HitResult
from kvspec.errors import UnsupportedConfigurationError
from kvspec.managers.base import SingleTypeKVCacheManager, declared_span


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Blocks before the current chunk are null; a hit scans the current chunk left to right."""

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        if query.use_eagle:
            raise UnsupportedConfigurationError(
                "Hybrid KV cache is not supported for eagle + chunked local attention."
            )
        if query.dcp_world_size * query.pcp_world_size != 1:
            raise UnsupportedConfigurationError(
                "Chunked local attention prefix caching does not support context parallelism."
            )
        block_size = query.block_tokens
        if block_size != query.alignment_tokens:
            raise UnsupportedConfigurationError(
                f"Chunked local attention needs hits aligned to its own block size {block_size}, "
                f"got an alignment of {query.alignment_tokens} tokens."
            )
        block_hashes = query.block_hashes
        block_pool = query.block_pool
        kv_cache_group_ids = query.kv_cache_group_ids
        max_length = query.max_length
        chunk = declared_span(
            query.kv_cache_spec, query.traits, "attention_chunk_size", "ChunkedLocalAttentionManager"
        )
        max_num_blocks = min(max_length // block_size, len(block_hashes))
        start_token = (max_length // chunk) * chunk if max_length > 0 else 0
        start_block = start_token // block_size
        null = block_pool.null_block
        computed: tuple[list[KVCacheBlock], ...] = tuple([null] * start_block for _ in kv_cache_group_ids)
        for i in range(start_block, max_num_blocks):
            hits = block_pool.get_cached_block(block_hashes[i], kv_cache_group_ids)
            if hits is None:
                break
            for blocks, block in zip(computed, hits):
                blocks.append(block)
        return HitResult(computed)

    def setup(self) -> None:
        self.attention_chunk_size = declared_span(
            self.kv_cache_spec, self.traits, "attention_chunk_size", "ChunkedLocalAttentionManager"
        )

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        chunk = self.attention_chunk_size
        return (num_computed_tokens // chunk) * chunk
