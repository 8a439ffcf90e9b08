"""Sliding-window attention: only the last ``sliding_window`` tokens are read, so earlier blocks are
freed as the request advances and a prefix hit needs only the blocks covering the window."""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from kvspec.blocks.pool import KVCacheBlock
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import HitQuery, HitResult
from kvspec.errors import UnsupportedConfigurationError
from kvspec.intmath import cdiv
from kvspec.managers.base import (
    SingleTypeKVCacheManager,
    declared_span,
    shared_prefix_boundary,
    truncate_to_alignment,
)


@mypyc_attr(allow_interpreted_subclasses=True)  # plugins subclass it in plain Python (compiled build)
class SlidingWindowManager(SingleTypeKVCacheManager):
    """Frees blocks that fell out of the window; searches hits right to left."""

    def setup(self) -> None:
        self.sliding_window = declared_span(
            self.kv_cache_spec, self.traits, "sliding_window", "SlidingWindowManager"
        )
        # Kept below the window, unread, for an engine that re-prefills them (vLLM 0.34's multi-module MTP).
        self.extra_retained_tokens = self.traits.extra_retained_tokens

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        if query.dcp_world_size * query.pcp_world_size != 1:
            raise UnsupportedConfigurationError(
                "Sliding-window prefix caching does not support context parallelism."
            )
        window = declared_span(query.kv_cache_spec, query.traits, "sliding_window", "SlidingWindowManager")
        block_hashes = query.block_hashes
        block_pool = query.block_pool
        kv_cache_group_ids = query.kv_cache_group_ids
        use_eagle, alignment_tokens, block_size = query.use_eagle, query.alignment_tokens, query.block_tokens
        max_length = query.max_length
        need = cdiv(window - 1, block_size) + (1 if use_eagle else 0)
        max_num_blocks = min(max_length // block_size, len(block_hashes))
        null = block_pool.null_block
        computed: tuple[list[KVCacheBlock], ...] = tuple([null] * max_num_blocks for _ in kv_cache_group_ids)
        num_contiguous = 0
        match_found = False
        lookup = block_pool.get_cached_block
        for i in range(max_num_blocks - 1, -1, -1):
            hits = lookup(block_hashes[i], kv_cache_group_ids)
            if hits is None:
                num_contiguous = 0
                continue
            if (
                num_contiguous == 0
                and block_size != alignment_tokens
                and ((i if use_eagle else i + 1) * block_size) % alignment_tokens
            ):
                continue
            for blocks, block in zip(computed, hits):
                blocks[i] = block
            num_contiguous += 1
            if num_contiguous >= need:
                for blocks in computed:
                    del blocks[i + num_contiguous :]
                match_found = True
                break
        if not match_found:
            # Only a run starting at block 0 can still be used: a hit shorter than the window.
            for blocks in computed:
                del blocks[num_contiguous:]
            truncate_to_alignment(computed, block_size, alignment_tokens)
        if use_eagle and computed[0]:
            for blocks in computed:
                blocks.pop()
            truncate_to_alignment(computed, block_size, alignment_tokens)
        return HitResult(computed)

    def reachable_block_mask(self, num_blocks: int) -> list[bool] | None:
        """Which of the first ``num_blocks`` blocks a future hybrid hit can use (None: all of them).

        Hybrid hits end on multiples of the scheduler block (the LCM of the groups' block sizes), and a
        sliding-window hit needs only the window's blocks before that end. So only the last
        ``ceil((window-1)/B)`` blocks of each scheduler block are worth caching (one more with EAGLE);
        the rest are freed as scratch and reused first.
        """
        # Hits end on multiples of cache_hit_alignment_tokens: the scheduler block, or the hash block with
        # sub-block hits.
        per_segment = self.cache_hit_alignment_tokens // self.block_size
        need = cdiv(self.sliding_window - 1, self.block_size) + (1 if self.use_eagle else 0)
        if per_segment <= 1 or need >= per_segment:
            return None
        shift = 1 if self.use_eagle else 0
        return [i >= shift and (i - shift) % per_segment >= per_segment - need for i in range(num_blocks)]

    def cache_mask(self, request: RequestView, num_blocks: int) -> list[bool] | None:
        interval = self.context.prefix_cache_retention_interval
        if interval is None:
            return self.reachable_block_mask(num_blocks)
        return self.retained_block_mask(
            num_blocks, interval, request.num_prompt_tokens, shared_prefix_boundary(request)
        )

    def retained_block_mask(
        self, num_blocks: int, interval: int, num_prompt_tokens: int, shared_prefix_boundary: int = 0
    ) -> list[bool]:
        """The blocks sparse retention keeps: the window's tail (the blocks a hit ending there needs) at
        the end of every ``interval`` tokens (none when 0), at the prompt's replay boundaries (the latest
        scheduler-block boundary below its last token, where an exact replay hits; with EAGLE under 0.34
        one block lower, ``ReleaseProfile.replay_boundaries``), and at the shared-prefix
        junction ``shared_prefix_boundary`` (tokens; 0: none) where a sibling request diverges (with
        EAGLE also one block before it: a sibling's EAGLE peek past the junction is not shared)."""
        need = cdiv(self.sliding_window - 1, self.block_size) + (1 if self.use_eagle else 0)
        shift = 1 if self.use_eagle else 0
        mask = [False] * num_blocks
        if interval:
            per_segment = interval // self.block_size
            if need >= per_segment:
                return [True] * num_blocks
            for i in range(shift, num_blocks):
                if (i - shift) % per_segment >= per_segment - need:
                    mask[i] = True
        scheduler_block = self.cache_hit_alignment_tokens
        for boundary in self.retention_boundaries(num_prompt_tokens, shared_prefix_boundary):
            end = boundary // scheduler_block * scheduler_block // self.block_size + shift
            for i in range(max(0, end - need), min(num_blocks, end)):
                mask[i] = True
        return mask

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        skipped = num_computed_tokens - self.sliding_window + 1 - self.extra_retained_tokens
        return skipped if skipped > 0 else 0

    def free(self, request_id: str) -> None:
        """Cached blocks join the tail (kept as cache longest); uncached scratch blocks the head."""
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        if not blocks:
            return
        cached: list[KVCacheBlock] = []
        uncached: list[KVCacheBlock] = []
        for block in reversed(blocks):
            (uncached if block.block_hash is None else cached).append(block)
        self.block_pool.free_blocks(cached)
        self.block_pool.free_blocks(uncached, prepend=True)
