"""Cross attention: blocks for the encoder's tokens, allocated once; never prefix-cached."""

from __future__ import annotations

from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import HitQuery, HitResult
from kvspec.errors import SchedulingError, UnsupportedConfigurationError
from kvspec.managers.base import SingleTypeKVCacheManager


class CrossAttentionManager(SingleTypeKVCacheManager):
    """Encoder-decoder models run without prefix caching; the coordinator passes encoder token counts."""

    computed_blocks_refusal = "Cross attention never has prefix-hit blocks."

    def cache_blocks(self, request: RequestView, num_tokens: int) -> None:
        raise SchedulingError("Should not be called as prefix caching is disabled.")

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        raise UnsupportedConfigurationError(
            "CrossAttentionManager does not support caching; run encoder-decoder models with "
            "enable_caching=False."
        )
