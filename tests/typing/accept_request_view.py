"""An engine's own request type, read in place: it satisfies RequestView (no kvspec base class), so the
coordinator takes it, and so does a tier ported from vLLM keeping vLLM's parameter names."""

from collections.abc import Collection, Sequence
from typing import Any

import torch

from kvspec import BlockHash, BlockHasher, FullAttentionSpec, KVCacheCoordinator, RequestView, SchedulerLimits
from kvspec.planning import get_kv_cache_config
from kvspec.tiers import LookupResult, OffloadTier, StorePlan, TierEvent, TierRequest


class EngineRequest:
    """The engine's request: plain attributes, its own token list, kvspec's hasher."""

    def __init__(self, request_id: str, tokens: list[int], hasher: BlockHasher) -> None:
        self.request_id = request_id
        self.all_token_ids = list(tokens)
        self.num_prompt_tokens = len(tokens)
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.skip_reading_prefix_cache = False
        self.block_hasher: BlockHasher | None = hasher
        self.lora_name: str | None = None
        self.lora_id: int | None = None
        self.cache_salt: str | None = None
        self.needs_extra_keys = False
        self.block_hashes: list[BlockHash] = []
        self.block_extra_keys: list[tuple[Any, ...] | None] = []
        hasher.hash_new_blocks(self)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def extra_keys_for_block(self, start: int, end: int) -> tuple[Any, ...] | None:
        return None

    def extra_keys_for_range(self, start: int, end: int) -> tuple[Any, ...] | None:
        return None


class PortedTier:
    """A tier written against vLLM's OffloadingManager: its parameters keep vLLM's name, req_context."""

    medium = "CPU"
    capacity_blocks = 8
    num_blocks = 0

    def lookup(self, key: bytes, req_context: TierRequest) -> LookupResult:
        return LookupResult.MISS

    def prepare_load(self, keys: Collection[bytes], req_context: TierRequest) -> None:
        pass

    def complete_load(self, keys: Collection[bytes], req_context: TierRequest) -> None:
        pass

    def prepare_store(self, keys: Sequence[bytes], req_context: TierRequest) -> StorePlan | None:
        return None

    def complete_store(self, keys: Collection[bytes], req_context: TierRequest, success: bool = True) -> None:
        pass

    def on_request_finished(self, req_context: TierRequest) -> None:
        pass

    def take_events(self) -> list[TierEvent]:
        return []

    def reset(self) -> None:
        pass


tier: OffloadTier = PortedTier()
spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16)
limits = SchedulerLimits(max_model_len=64)
coordinator = KVCacheCoordinator(get_kv_cache_config({"l0": spec}, 1 << 20, limits), limits)
request: RequestView = EngineRequest("r0", list(range(40)), coordinator.make_block_hasher())
blocks, hit_tokens = coordinator.get_computed_blocks(request)
