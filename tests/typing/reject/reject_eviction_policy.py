from kvspec import KVCacheBlock
from kvspec.eviction import EvictionContext, register_eviction_policy


class NoVictim:
    """Takes blocks in but never names one to evict."""

    def __init__(self, context: EvictionContext) -> None:
        self._free: list[KVCacheBlock] = []

    def add(self, block: KVCacheBlock) -> None:
        self._free.append(block)


class WrongVictimType:
    def __init__(self, context: EvictionContext) -> None:
        pass

    def add(self, block: KVCacheBlock) -> None:
        pass

    def remove(self, block: KVCacheBlock) -> None:
        pass

    def pop_victim(self) -> int:
        return 0


register_eviction_policy("acme.none", NoVictim)  # E: [arg-type] "type[NoVictim]"; expected "Callable[[EvictionContext], EvictionPolicy]"
register_eviction_policy("acme.int", WrongVictimType)  # E: [arg-type] "type[WrongVictimType]"; expected "Callable[[EvictionContext], EvictionPolicy]"
