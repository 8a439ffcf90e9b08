"""Plugin managers with one mistake each: mypy must refuse them where they are registered."""

from collections.abc import Sequence

from kvspec import (
    BlockPool,
    FullAttentionManager,
    FullAttentionSpec,
    HitQuery,
    KVCacheBlock,
    KVCacheSpec,
    default_registry,
)


class FreeTakesInt(FullAttentionManager):
    def free(self, request_id: int) -> None:  # E: [override] Argument 1 of "free" is incompatible with supertype
        pass


class AllocReturnsInt(FullAttentionManager):
    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> int:  # E: [override] Return type "int" of "allocate_new_blocks" incompatible with return type "list[KVCacheBlock]"
        return 0


class OldHitSearch(FullAttentionManager):
    @classmethod
    def find_longest_cache_hit(  # E: [override] Signature of "find_longest_cache_hit" incompatible with supertype  # N: def find_longest_cache_hit(cls, query: HitQuery) -> HitResult
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        use_eagle: bool,
        alignment_tokens: int,
    ) -> tuple[list[KVCacheBlock], ...]:
        return ()


class HitReturnsTuple(FullAttentionManager):
    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> tuple[list[KVCacheBlock], ...]:  # E: [override] of "find_longest_cache_hit" incompatible with return type "HitResult"
        return ()


class CountReturnsFloat(FullAttentionManager):
    def get_num_common_prefix_blocks(self, running_request_id: str) -> float:  # E: [override] Return type "float" of "get_num_common_prefix_blocks"
        return 0.0


class FromScratchFreeTakesInt:
    """A manager written from scratch (no kvspec base class) whose free() takes an int."""

    def __init__(self, context: object) -> None:
        pass

    def free(self, request_id: int) -> None:
        pass


default_registry.register(FullAttentionSpec, FromScratchFreeTakesInt)  # E: [arg-type] "type[FromScratchFreeTakesInt]"; expected "type[KVCacheManager] | None"
