from dataclasses import dataclass

from kvspec import FullAttentionManager, FullAttentionSpec, default_registry


@dataclass(frozen=True, kw_only=True, slots=True)
class StringPageSpec(FullAttentionSpec):
    @property
    def page_size_bytes(self) -> str:  # E: [override] Signature of "page_size_bytes" incompatible with supertype
        return "64KiB"


default_registry.register(StringPageSpec, FullAttentionManager)  # E: [arg-type] "type[StringPageSpec]"; expected "type[KVCacheSpec]"
