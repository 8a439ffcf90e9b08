"""Plugin specs with one mistake each: mypy must refuse them where they are registered."""

from collections.abc import Sequence
from dataclasses import dataclass

from kvspec import FullAttentionManager, FullAttentionSpec, KVCacheSpec, SchedulerLimits, default_registry


@dataclass(frozen=True, kw_only=True)
class PageAsMethod:
    block_size: int = 16

    def page_size_bytes(self) -> int:
        return 64

    def max_memory_usage_bytes(self, limits: SchedulerLimits) -> int:
        return 64

    def copy_with_new_block_size(self, block_size: int) -> "PageAsMethod":
        return self

    @classmethod
    def merge(cls, specs: Sequence["PageAsMethod"]) -> "PageAsMethod":
        return specs[0]

    def is_uniform_with_collection(self, specs: Sequence[KVCacheSpec]) -> bool:
        return True


@dataclass(frozen=True, kw_only=True, slots=True)
class FloatMemory(FullAttentionSpec):
    def max_memory_usage_bytes(self, limits: SchedulerLimits) -> float:  # E: [override] Return type "float" of "max_memory_usage_bytes" incompatible with return type "int"
        return 1.5


@dataclass(frozen=True, kw_only=True, slots=True)
class SequenceOnlyUniform(FullAttentionSpec):
    def is_uniform_with_collection(self, specs: Sequence[KVCacheSpec]) -> bool:  # E: [override] supertype defines the argument type as "Sequence[KVCacheSpec] | Mapping[str, KVCacheSpec]"
        return True


@dataclass(frozen=True, kw_only=True, slots=True)
class StringBlockSize(FullAttentionSpec):
    @property  # E: [misc] Dataclass attribute may only be overridden by another attribute
    def block_size(self) -> str:  # E: [override] Signature of "block_size" incompatible with supertype  # N: str
        return "16"


def page_as_method(spec: PageAsMethod) -> KVCacheSpec:
    return spec  # E: [return-value] (got "PageAsMethod", expected "KVCacheSpec")  # N: page_size_bytes


default_registry.register(PageAsMethod, FullAttentionManager)  # E: [arg-type] "type[PageAsMethod]"; expected "type[KVCacheSpec]"
