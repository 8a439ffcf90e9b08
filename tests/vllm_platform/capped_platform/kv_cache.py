"""The platform's spec and manager, as a platform writes them for vLLM (vLLM's classes, vLLM's signatures)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.kv_cache_interface import FullAttentionSpec

from capped_platform import HIT_CAP_BLOCKS


@dataclass(frozen=True, kw_only=True)
class CappedFullAttentionSpec(FullAttentionSpec):  # type: ignore[misc]
    """Full attention on this platform: the page of vLLM's full attention, run by ``CappedHitManager``."""


class CappedHitManager(FullAttentionManager):  # type: ignore[misc]
    """vLLM's full-attention manager whose prefix hits stop at ``HIT_CAP_BLOCKS`` blocks (say, a platform
    whose cached blocks past that are not reusable)."""

    @classmethod
    def find_longest_cache_hit(cls, *args: Any, **kwargs: Any) -> Any:
        hit = super().find_longest_cache_hit(*args, **kwargs)
        if len(hit) == 2 and isinstance(hit[1], int):  # vLLM 0.32 and later: (blocks per group, tokens)
            blocks, tokens = hit
            capped = tuple(group[:HIT_CAP_BLOCKS] for group in blocks)
            per_block = tokens // len(blocks[0]) if blocks and blocks[0] else 0
            return capped, min(tokens, HIT_CAP_BLOCKS * per_block)
        return tuple(group[:HIT_CAP_BLOCKS] for group in hit)  # vLLM 0.23: the blocks per group


class UnpinningHitManager(CappedHitManager):
    """``CappedHitManager`` that also hands a request's blocks to vLLM's pool's ``unpin_blocks`` when it
    frees them: vLLM's pool has that call (0.32), kvspec's does not."""

    def free(self, request_id: str) -> None:
        self.block_pool.unpin_blocks(self.req_to_blocks.get(request_id, []), on_reuse=lambda block: None)
        super().free(request_id)


def register_capped_specs() -> None:
    """What the platform's hook registers in vLLM's registry."""
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    unpinning = os.environ.get("CAPPED_PLATFORM") == "unpinning"
    KVCacheSpecRegistry.register(
        kvcache_spec_cls=CappedFullAttentionSpec,
        manager_class=UnpinningHitManager if unpinning else CappedHitManager,
        uniform_type_base_spec=FullAttentionSpec,
    )
