from dataclasses import dataclass

from kvspec import FullAttentionManager, FullAttentionSpec, default_registry, register_kv_cache_spec


@dataclass(frozen=True, kw_only=True, slots=True)
class MySpec(FullAttentionSpec):
    pass


class PlainBase:
    pass


default_registry.register(MySpec, FullAttentionManager, PlainBase)  # E: [arg-type] "type[PlainBase]"; expected "type[KVCacheSpec] | None"


@register_kv_cache_spec(FullAttentionManager, uniform_type_base_spec=PlainBase)  # E: [arg-type] "type[PlainBase]"; expected "type[KVCacheSpec] | None"
@dataclass(frozen=True, kw_only=True, slots=True)
class OtherSpec(FullAttentionSpec):
    pass
