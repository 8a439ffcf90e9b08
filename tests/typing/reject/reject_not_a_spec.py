from kvspec import FullAttentionManager, default_registry, register_kv_cache_spec


class NotASpec:
    block_size: int = 16


default_registry.register(NotASpec, FullAttentionManager)  # E: [arg-type] "type[NotASpec]"; expected "type[KVCacheSpec]"


@register_kv_cache_spec(FullAttentionManager)
class AlsoNotASpec:  # E: [type-var] Value of type variable "SpecT" of function cannot be "AlsoNotASpec"  # pyrefly: missed: pyrefly 1.5.1 does not check class decorators; registration raises SpecProtocolError naming the missing members
    block_size: int = 16
