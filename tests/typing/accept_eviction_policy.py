"""A plugin's eviction policy (docs/PLUGINS.md "An eviction policy"): mypy accepts it as a factory."""

from collections import OrderedDict
from collections.abc import Sequence

from kvspec import KVCacheBlock
from kvspec.eviction import BlockUse, EvictionContext, register_eviction_policy


class MostRecentFirst:
    """MRU: the most recently freed cached block is evicted first (a scan's own blocks go first)."""

    def __init__(self, context: EvictionContext) -> None:
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict()

    def add(self, block: KVCacheBlock) -> None:
        self._free[block.block_id] = block

    def remove(self, block: KVCacheBlock) -> None:
        del self._free[block.block_id]

    def pop_victim(self) -> KVCacheBlock:
        return self._free.popitem(last=True)[1]

    def __len__(self) -> int:
        return len(self._free)

    def evictable_blocks(self) -> list[KVCacheBlock]:
        return list(reversed(self._free.values()))

    def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        pass

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        pass


register_eviction_policy("acme.mru", MostRecentFirst)
