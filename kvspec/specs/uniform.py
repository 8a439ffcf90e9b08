"""Several layers of one spec family that differ in shape (e.g. head size) but share block size."""

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from typing_extensions import Self

from kvspec.contracts.checking import check_construction
from kvspec.contracts.spec import KVCacheSpec, SchedulerLimits, SpecCollection
from kvspec.contracts.traits import SpecTraits, common_value, traits_of
from kvspec.errors import SpecValidationError
from kvspec.intmath import cdiv
from kvspec.specs._validate import require_positive
from kvspec.specs.attention import merge_equal_specs


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class UniformTypeKVCacheSpecs:
    """One KV cache group whose layers share a block size and a uniform type but not a page size.

    ``page_size_bytes`` is the sum over layers (one block id addresses one page in every layer);
    ``max_memory_usage_bytes`` is the largest per-layer need in blocks, times that summed page.
    Unlike vLLM's, it is hashable (hashed over its (layer, spec) items).
    """

    block_size: int
    kv_cache_specs: Mapping[str, KVCacheSpec]

    def __post_init__(self) -> None:
        require_positive(self, "block_size", self.block_size)
        if not self.kv_cache_specs:
            raise SpecValidationError("UniformTypeKVCacheSpecs needs at least one layer spec.")
        for layer, spec in self.kv_cache_specs.items():
            if spec.block_size != self.block_size:
                raise SpecValidationError(
                    f"UniformTypeKVCacheSpecs: layer {layer!r} has block_size={spec.block_size}, "
                    f"but the group's is {self.block_size}."
                )
        object.__setattr__(self, "kv_cache_specs", dict(self.kv_cache_specs))

    def __hash__(self) -> int:
        return hash((self.block_size, tuple(self.kv_cache_specs.items())))

    @property
    def page_size_bytes(self) -> int:
        return sum(spec.page_size_bytes for spec in self.kv_cache_specs.values())

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        return self.max_memory_usage_pages(limits) * self.page_size_bytes

    def max_memory_usage_pages(self, limits: SchedulerLimits) -> int:
        """Blocks one request of ``limits.max_model_len`` tokens takes: the hungriest layer's (the layers
        share the block ids)."""
        return max(
            cdiv(spec.max_memory_usage_bytes(limits), spec.page_size_bytes)
            for spec in self.kv_cache_specs.values()
        )

    def get_page_sizes(self) -> list[int]:
        """The distinct page sizes of the layers, in first-seen order."""
        return list(dict.fromkeys(s.page_size_bytes for s in self.kv_cache_specs.values()))

    def first_spec(self) -> KVCacheSpec:
        """The spec that stands for the group in the scheduler: see :meth:`representative_spec`."""
        return self.representative_spec()

    def representative_spec(self) -> KVCacheSpec:
        """The spec that stands for the group in the scheduler (so its class picks the group's manager).

        Rule, independent of layer order (vLLM takes the first layer's, so a group mixing a plugin subclass
        with its built-in parent was run by whichever came first): the first layer whose class is a
        subclass of every other layer's class (the most derived); if no class is, the first layer of the
        class whose qualified name sorts first.
        """
        specs = list(self.kv_cache_specs.values())
        classes = list(dict.fromkeys(type(s) for s in specs))
        derived = [c for c in classes if all(issubclass(c, other) for other in classes)]
        if derived:
            chosen = derived[0]
        else:
            chosen = min(classes, key=lambda c: (c.__module__, c.__qualname__))
        return next(s for s in specs if type(s) is chosen)

    def kv_cache_traits(self) -> SpecTraits:
        """The representative layer's traits; the event window only where all layers agree. The kind is the
        layers' kind where they share one, ``full_attention`` where every layer is full attention of some
        family (full, sink, MLA, hidden state: one uniform base, as vLLM 0.34 reports such a group; the 0.23
        profile's events say ``unknown``: ``SpecTraits.kind_merged``), else ``unknown``."""
        inner = [traits_of(s) for s in self.kv_cache_specs.values()]
        base = traits_of(self.representative_spec())
        kinds = {t.kind for t in inner}
        merged = len(kinds) > 1 and all(t.full_attention_family is not None for t in inner)
        if len(kinds) == 1:
            kind = kinds.pop()
        else:
            kind = "full_attention" if merged else "unknown"
        return dataclasses.replace(
            base,
            kind=kind,
            kind_merged=merged,
            event_sliding_window=common_value([t.event_sliding_window for t in inner]),
            needs_zeroed_buffers=any(t.needs_zeroed_buffers for t in inner),
            device_views=(),
        )

    def narrowed_to(self, layer_names: Sequence[str]) -> Self:
        """The same group restricted to ``layer_names`` (a worker's share)."""
        keep = {n: s for n, s in self.kv_cache_specs.items() if n in set(layer_names)}
        return dataclasses.replace(self, kv_cache_specs=keep)

    def copy_with_new_block_size(self, block_size: int, /) -> Self:
        inner = {n: s.copy_with_new_block_size(block_size) for n, s in self.kv_cache_specs.items()}
        return dataclasses.replace(self, block_size=block_size, kv_cache_specs=inner)

    @classmethod
    def merge(cls, specs: list[Any], /) -> Self:
        merged: Self = merge_equal_specs(cls, specs)
        return merged

    def is_uniform_with_collection(self, specs: SpecCollection, /) -> bool:
        """Accepts a sequence or vLLM's layer -> spec dict (same answer)."""
        inner = list(self.kv_cache_specs.values())
        return inner[0].is_uniform_with_collection(inner)
