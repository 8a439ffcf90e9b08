"""Registration forms mypy must accept, and the types it must infer."""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from typing_extensions import Self, assert_type

from kvspec import (
    FullAttentionManager,
    FullAttentionSpec,
    KVCacheManager,
    KVCacheSpec,
    Registry,
    SchedulerLimits,
    SlidingWindowManager,
    SlidingWindowSpec,
    SpecCollection,
    default_registry,
    register_kv_cache_spec,
)
from kvspec.registry.core import Registration


@dataclass(frozen=True, kw_only=True, slots=True)
class WideWindowSpec(SlidingWindowSpec):
    sink_tokens: int = 4


default_registry.register(WideWindowSpec, SlidingWindowManager, SlidingWindowSpec)


@dataclass(frozen=True, kw_only=True, slots=True)
class StateSpec:
    """A spec written from scratch, satisfying KVCacheSpec structurally (no kvspec base class)."""

    block_size: int
    state_bytes: int

    @property
    def page_size_bytes(self) -> int:
        return self.state_bytes

    def max_memory_usage_bytes(self, limits: SchedulerLimits) -> int:
        return self.state_bytes

    def copy_with_new_block_size(self, block_size: int) -> Self:
        return self

    @classmethod
    def merge(cls, specs: Sequence[Self]) -> Self:
        return specs[0]

    def is_uniform_with_collection(self, specs: SpecCollection) -> bool:
        return True


_conforms: type[KVCacheSpec] = StateSpec  # the static conformance line for specs registered later

Decorated = register_kv_cache_spec(FullAttentionManager)(StateSpec)
assert_type(Decorated, type[StateSpec])

typed: Registry[FullAttentionSpec, FullAttentionManager] = Registry(name="full-only")
typed.register(FullAttentionSpec, FullAttentionManager)
entry = typed.lookup(FullAttentionSpec)
assert_type(entry, Registration[FullAttentionSpec, FullAttentionManager] | None)
manager_cls = default_registry.get_manager_class(
    FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float16)
)
assert_type(manager_cls, type[KVCacheManager] | None)
