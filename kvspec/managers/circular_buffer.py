"""vLLM 0.34's circular buffer: each request holds one ring block from its first allocation to its free.

Built only from the base manager's hooks: the ring is "a request of one token" for every allocation
question, so the base class's own arithmetic claims the block once and never again.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.blocks.pool import KVCacheBlock
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import HitQuery, HitResult
from kvspec.managers.base import SingleTypeKVCacheManager

#: Every allocation question is asked for this many tokens: one block, whatever the request's length.
_RING_TOKENS = 1


class CircularBufferManager(SingleTypeKVCacheManager):
    """One block per request (0 once it holds it); never cached, never hit, never freed early."""

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        return super().get_num_blocks_to_allocate(request_id, _RING_TOKENS, (), 0, _RING_TOKENS)

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        # The base class's allocate_new_computed_blocks runs these two halves (so does the coordinator's
        # two-phase attachment, every group's hits before any group's external blocks): a hit in the other
        # groups brings nothing here.
        super().add_local_computed_blocks(request_id, (), 0, 0)

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None:
        # Its second half: tokens a connector loads need the ring, and only the ring.
        if num_external_computed_tokens > 0:
            super().allocate_external_computed_blocks(request_id, 0, _RING_TOKENS, record_for_zeroing)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        return super().allocate_new_blocks(request_id, _RING_TOKENS, _RING_TOKENS)

    def cache_blocks(self, request: RequestView, num_tokens: int) -> None:
        return  # a ring's content is overwritten in place: nothing to publish

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        return HitResult(tuple([] for _ in query.kv_cache_group_ids), num_tokens=0)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0  # the ring is read at every step

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0
