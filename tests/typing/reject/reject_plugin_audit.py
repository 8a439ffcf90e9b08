"""The plugin author's mistakes of the checker audit (issue 48), each where a checker must refuse it. At run
time each is a KVSpecError as well (tests/unit/registry/test_plugin_mistakes.py, the same cases)."""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from typing_extensions import Self

from kvspec import (
    BlockPool,
    FullAttentionManager,
    FullAttentionSpec,
    KVCacheBlock,
    KVCacheSpec,
    ManagerContext,
    Registry,
    SchedulerLimits,
    SlidingWindowManager,
    SlidingWindowSpec,
    SpecCollection,
    default_registry,
    register_kv_cache_spec,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class AcmeSpec(FullAttentionSpec):
    pass


class AcmeManager(FullAttentionManager):
    pass


# 1a: a manager ported from vLLM 0.23 as it was, its hit search still vLLM's (kvspec passes one HitQuery).
class PortedManager:
    def __init__(self, context: ManagerContext) -> None:
        self.context = context

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
    ) -> tuple[list[KVCacheBlock], ...]:
        return ()


@register_kv_cache_spec(PortedManager, uniform_type_base_spec=FullAttentionSpec)  # E: [arg-type] "type[PortedManager]"; expected "type[KVCacheManager] | None"
@dataclass(frozen=True, kw_only=True, slots=True)
class PortedSpec(FullAttentionSpec):
    pass


# 1b: the spec class passed where the manager goes.
@register_kv_cache_spec(FullAttentionSpec, uniform_type_base_spec=FullAttentionSpec)  # E: [arg-type] "type[FullAttentionSpec]"; expected "type[KVCacheManager] | None"
@dataclass(frozen=True, kw_only=True, slots=True)
class SpecAsManager(FullAttentionSpec):
    pass


# 1c: a typed registry given another family's manager, or another family's spec, in both typed forms.
typed = Registry[AcmeSpec, AcmeManager](name="acme")
typed.register(AcmeSpec, SlidingWindowManager, FullAttentionSpec)  # E: [arg-type] "type[SlidingWindowManager]"; expected "type[AcmeManager] | None"
typed.register(SlidingWindowSpec, AcmeManager)  # E: [arg-type] "type[SlidingWindowSpec]"; expected "type[AcmeSpec]"
bounded = Registry(name="acme", spec_bound=AcmeSpec, manager_bound=AcmeManager)
bounded.register(AcmeSpec, FullAttentionManager, FullAttentionSpec)  # E: [arg-type] "type[FullAttentionManager]"; expected "type[AcmeManager] | None"


# 2: a spec written from scratch that lacks page_size_bytes, in the decorator form and the call form.
@register_kv_cache_spec(FullAttentionManager)
@dataclass(frozen=True, kw_only=True, slots=True)
class NoPageSize:  # E: [type-var] Value of type variable "SpecT" of function cannot be "NoPageSize"  # pyrefly: missed: pyrefly 1.5.1 does not check class decorators; registration raises SpecProtocolError naming the missing members
    block_size: int = 16

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        return 0

    def copy_with_new_block_size(self, block_size: int, /) -> Self:
        return self

    @classmethod
    def merge(cls, specs: Sequence[Self], /) -> Self:
        return specs[0]

    def is_uniform_with_collection(self, specs: SpecCollection, /) -> bool:
        return True


default_registry.register(NoPageSize, FullAttentionManager)  # E: [arg-type] "type[NoPageSize]"; expected "type[KVCacheSpec]"


# 3: a member with the wrong return type.
@dataclass(frozen=True, kw_only=True, slots=True)
class FloatMemory(FullAttentionSpec):
    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> float:  # E: [override] Return type "float" of "max_memory_usage_bytes" incompatible with return type "int"
        return 1.5


spec = AcmeSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float16)
