"""Cross attention: blocks for the encoder's tokens, allocated once; never prefix-cached."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.blocks.pool import KVCacheBlock
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import HitQuery, HitResult
from kvspec.errors import SchedulingError, UnsupportedConfigurationError
from kvspec.managers.base import SingleTypeKVCacheManager


class CrossAttentionManager(SingleTypeKVCacheManager):
    """Encoder-decoder models run without prefix caching; the coordinator passes encoder token counts."""

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        if new_computed_blocks:
            raise SchedulingError("Cross attention never has prefix-hit blocks.")

    def cache_blocks(self, request: RequestView, num_tokens: int) -> None:
        raise SchedulingError("Should not be called as prefix caching is disabled.")

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        raise UnsupportedConfigurationError(
            "CrossAttentionManager does not support caching; run encoder-decoder models with "
            "enable_caching=False."
        )
