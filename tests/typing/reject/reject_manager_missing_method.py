from dataclasses import dataclass

from kvspec import FullAttentionSpec, default_registry, register_kv_cache_spec


class HalfManager:
    """Frees blocks, but cannot allocate them."""

    def free(self, request_id: str) -> None:
        pass


default_registry.register(FullAttentionSpec, HalfManager)  # E: [arg-type] "type[HalfManager]"; expected "type[KVCacheManager] | None"


@register_kv_cache_spec(HalfManager)  # E: [arg-type] "type[HalfManager]"; expected "type[KVCacheManager] | None"
@dataclass(frozen=True, kw_only=True, slots=True)
class MySpec(FullAttentionSpec):
    pass
