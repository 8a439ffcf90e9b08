"""A manager written from scratch (no kvspec base class), and the registry forms a typed plugin uses."""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from typing_extensions import assert_type

from kvspec import (
    FullAttentionSpec,
    HitQuery,
    HitResult,
    KVCacheBlock,
    KVCacheCoordinator,
    KVCacheManager,
    ManagerContext,
    Registry,
    RequestView,
    SchedulerLimits,
    load_plugins,
    register_kv_cache_spec,
)
from kvspec.planning import get_kv_cache_config


class CountingManager:
    """Keeps every request's blocks; never caches (a minimal manager a platform might start from)."""

    def __init__(self, context: ManagerContext) -> None:
        self.pool = context.block_pool
        self.block_size = context.block_size
        self.blocks: dict[str, list[KVCacheBlock]] = {}
        self.new_ids: list[int] = []

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        need = -(num_tokens // -self.block_size) - len(self.blocks.get(request_id, ()))
        return max(need, 0)

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        self.blocks.setdefault(request_id, [])

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        n = self.get_num_blocks_to_allocate(request_id, num_tokens, (), 0, num_tokens_main_model)
        new = self.pool.get_new_blocks(n) if n else []
        self.blocks.setdefault(request_id, []).extend(new)
        self.new_ids.extend(b.block_id for b in new)
        return new

    def cache_blocks(self, request: RequestView, num_tokens: int) -> None:
        pass

    def free(self, request_id: str) -> None:
        self.pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)))

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        return self.blocks.pop(request_id, [])

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        pass

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0

    def get_blocks(self, request_id: str) -> Sequence[KVCacheBlock]:
        return self.blocks.get(request_id, [])

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        return HitResult(tuple([] for _ in query.kv_cache_group_ids))

    def new_step_starts(self) -> None:
        pass

    def iter_held_blocks(self) -> Iterator[KVCacheBlock]:
        for blocks in self.blocks.values():
            yield from blocks

    def take_new_block_ids(self) -> list[int]:
        ids, self.new_ids = self.new_ids, []
        return ids


_conforms: type[KVCacheManager] = CountingManager


@dataclass(frozen=True, kw_only=True, slots=True)
class CountedSpec(FullAttentionSpec):
    pass


@dataclass(frozen=True, kw_only=True, slots=True)
class OtherCountedSpec(CountedSpec):
    pass


# A typed registry takes a parent class (here a built-in) as the uniform base, and every API that takes a
# registry accepts it, whatever its parameters.
typed: Registry[CountedSpec, CountingManager] = Registry(name="typed")
typed.register(CountedSpec, CountingManager, uniform_type_base_spec=FullAttentionSpec)
typed.register(OtherCountedSpec, CountingManager, CountedSpec)
register_kv_cache_spec(CountingManager, uniform_type_base_spec=FullAttentionSpec, registry=typed)(CountedSpec)
spec = CountedSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16)
assert_type(typed.get_manager_class(spec), type[CountingManager] | None)
limits = SchedulerLimits(max_model_len=64)
config = get_kv_cache_config({"l0": spec}, 1 << 20, limits, registry=typed)
coordinator = KVCacheCoordinator(config, limits, enable_caching=False, registry=typed)
load_plugins(typed, allow=[])


class Platform:
    def register_custom_kv_cache_specs(self, registry: Registry[CountedSpec, CountingManager]) -> None:
        registry.register(CountedSpec, CountingManager, FullAttentionSpec)
