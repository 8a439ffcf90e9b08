"""Full attention (and its MLA, TurboQuant, hidden-state and sink variants)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from mypy_extensions import mypyc_attr

from kvspec.blocks.pool import KVCacheBlock
from kvspec.contracts.manager import SUB_BLOCK_HITS, HitQuery, HitResult
from kvspec.errors import SpecValidationError
from kvspec.managers.base import BASE_CAPABILITIES, SingleTypeKVCacheManager, truncate_to_alignment


@mypyc_attr(allow_interpreted_subclasses=True)  # plugins subclass it in plain Python (compiled build)
class FullAttentionManager(SingleTypeKVCacheManager):
    """Every block is needed until the request ends; hits are a left-to-right prefix of the chain."""

    manager_capabilities = BASE_CAPABILITIES | {SUB_BLOCK_HITS}

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        block_hashes = query.block_hashes
        block_pool = query.block_pool
        kv_cache_group_ids = query.kv_cache_group_ids
        block_size = query.block_tokens * query.dcp_world_size * query.pcp_world_size
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in kv_cache_group_ids)
        max_num_blocks = min(query.max_length // block_size, len(block_hashes))
        lookup = block_pool.get_cached_block
        if len(kv_cache_group_ids) == 1:
            computed = (block_pool.get_cached_prefix(block_hashes, kv_cache_group_ids[0], max_num_blocks),)
        else:
            for i in range(max_num_blocks):
                hits = lookup(block_hashes[i], kv_cache_group_ids)
                if hits is None:
                    break
                for blocks, block in zip(computed, hits):
                    blocks.append(block)
        fine = query.fine_block_hashes
        alignment = query.alignment_tokens
        if fine is not None and alignment < block_size and block_size % alignment == 0:
            return _extend_into_block(computed, query, fine, block_size, alignment)
        if query.use_eagle and computed[0]:
            for blocks in computed:
                blocks.pop()
        truncate_to_alignment(computed, block_size, query.alignment_tokens)
        return HitResult(computed)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        num_requests = len(self.req_to_blocks)
        count = 0
        for block in self.req_to_blocks.get(running_request_id, ()):
            if block.ref_cnt != num_requests:
                break
            count += 1
        return count


@mypyc_attr(allow_interpreted_subclasses=True)  # plugins subclass it in plain Python (compiled build)
class SinkFullAttentionManager(FullAttentionManager):
    """Full attention whose sink tokens live in blocks reserved for the manager's lifetime.

    The reserved blocks are held (ref_cnt 1) by the manager, so they never enter the free queue.
    Fixed on purpose: vLLM 0.23's constructor did not accept ``scheduler_block_size``.
    """

    def setup(self) -> None:
        sink_len = getattr(self.kv_cache_spec, "sink_len", None)
        if sink_len is None or sink_len <= 0 or sink_len % self.block_size:
            raise SpecValidationError(
                f"SinkFullAttentionSpec.sink_len must be a positive multiple of block_size="
                f"{self.block_size}, got {sink_len!r}."
            )
        # vLLM 0.23 holds the sink's blocks for the manager's life; 0.34 no longer takes them from the pool.
        reserve = self.context.profile.managers.sink_reserves_blocks
        self.sink_blocks = self.block_pool.get_new_blocks(sink_len // self.block_size) if reserve else []

    def iter_held_blocks(self) -> Iterator[KVCacheBlock]:
        yield from self.sink_blocks
        yield from super().iter_held_blocks()


def _extend_into_block(
    computed: tuple[list[KVCacheBlock], ...],
    query: HitQuery,
    fine: Sequence[bytes],
    block_size: int,
    alignment: int,
) -> HitResult:
    """Sub-block hits: past the run of whole blocks in ``computed``, the longest partial entry inside the
    next block (its hash-block boundaries probed from the highest down) extends the hit into that block.
    EAGLE then gives back one hash block (the block's KV is append-only, so it still covers the shorter
    hit). The hit may end inside its last block (tokens in ``num_tokens``)."""
    lookup = query.block_pool.get_cached_block
    ids = query.kv_cache_group_ids
    scale = block_size // alignment
    first = len(computed[0]) * scale
    hit = len(computed[0]) * block_size
    last = min(first + scale - 1, query.max_length // alignment, len(fine))
    for fine_index in range(last - 1, first - 1, -1):
        tail = lookup(fine[fine_index], ids)
        if tail is not None:
            for blocks, block in zip(computed, tail):
                blocks.append(block)
            hit = (fine_index + 1) * alignment
            break
    if query.use_eagle and hit > 0:
        hit -= alignment
    num_blocks = -(hit // -block_size)
    for blocks in computed:
        del blocks[num_blocks:]
    return HitResult(computed, hit)
