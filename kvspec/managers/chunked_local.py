"""Chunked local attention: tokens read only their own chunk, so finished chunks are freed."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.errors import UnsupportedConfigurationError
from kvspec.managers.base import SingleTypeKVCacheManager
from kvspec.pool import BlockPool, KVCacheBlock
from kvspec.protocols import KVCacheSpec
from kvspec.specs.attention import ChunkedLocalAttentionSpec


def _chunk(spec: KVCacheSpec) -> int:
    if not isinstance(spec, ChunkedLocalAttentionSpec):
        raise UnsupportedConfigurationError(
            f"ChunkedLocalAttentionManager runs ChunkedLocalAttentionSpec layers, got {type(spec).__name__}."
        )
    return spec.attention_chunk_size


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Blocks before the current chunk are null; a hit scans the current chunk left to right."""

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        use_eagle: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[KVCacheBlock], ...]:
        if use_eagle:
            raise UnsupportedConfigurationError(
                "Hybrid KV cache is not supported for eagle + chunked local attention."
            )
        if dcp_world_size * pcp_world_size != 1:
            raise UnsupportedConfigurationError(
                "Chunked local attention prefix caching does not support context parallelism."
            )
        block_size = kv_cache_spec.block_size
        if block_size != alignment_tokens:
            raise UnsupportedConfigurationError(
                f"Chunked local attention needs hits aligned to its own block size {block_size}, "
                f"got an alignment of {alignment_tokens} tokens."
            )
        chunk = _chunk(kv_cache_spec)
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
        return computed

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        chunk = _chunk(self.kv_cache_spec)
        return (num_computed_tokens // chunk) * chunk
