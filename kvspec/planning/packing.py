"""The packed layout: groups of different page sizes sharing one tensor per layer slot, with the fewest
padding repeats (``kvspec.planning.packed_kv_cache_groups``; compiled with the planner).

Units: bytes, tokens, blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from kvspec.contracts.spec import KVCacheSpec
from kvspec.contracts.traits import traits_of
from kvspec.intmath import cdiv
from kvspec.planning.config import (
    KVCacheGroupSpec,
)
from kvspec.registry.builtins import default_registry
from kvspec.registry.core import AnyRegistry
from kvspec.specs.uniform import UniformTypeKVCacheSpecs


def _least_padding_repeats(counts: Sequence[int], lower_bound: int) -> int:
    """The repeat count d (from ``lower_bound`` up to the largest count) that pads ``counts`` least when
    each is rounded up to a multiple of d; a tie goes to the larger d (fewer groups)."""
    top = max(counts)
    if lower_bound > top:
        return lower_bound
    return min(range(lower_bound, top + 1), key=lambda d: (sum(-c % d for c in counts), -d))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _PackBucket:
    """Layers of one uniform type, and their names by page size (first-seen order)."""

    spec: UniformTypeKVCacheSpecs
    by_page: dict[int, list[str]]

    @property
    def repeats(self) -> int:
        """Layers of the most common page size: for a balanced bucket, the repeats of its layer pattern."""
        return max(len(names) for names in self.by_page.values())

    @property
    def balanced(self) -> bool:
        """As many layers of each page size (one layer of each per repeat of the pattern)."""
        return len({len(names) for names in self.by_page.values()}) == 1

    @property
    def state_page(self) -> int:
        """The first layer's page: what one more state costs a block (a state bucket's layers share a spec
        in practice)."""
        return next(iter(self.spec.kv_cache_specs.values())).page_size_bytes

    def widest_group_bytes(self, num_groups: int) -> int:
        """The page bytes of the largest of ``num_groups`` groups this bucket splits into."""
        return sum(cdiv(len(names), num_groups) * page for page, names in self.by_page.items())


def packed_kv_cache_groups(
    layer_specs: Mapping[str, KVCacheSpec], registry: AnyRegistry | None = None
) -> list[KVCacheGroupSpec] | None:
    """Groups for a block-outermost layout, where one block id addresses one contiguous block holding a
    page of every layer of a group side by side, so pages of several sizes share a block (vLLM 0.32+'s
    packed groups, ``vllm/v1/core/kv_cache_planning.py``: ``_get_packed_kv_cache_groups`` (0.34.0)). None when every layer has one page size (nothing to pack).

    Layers are bucketed greedily by uniform type (``Registry.is_uniform_type``), in model order. A bucket
    with as many layers of each page size is a repeating layer pattern; the patterns of such buckets are
    cut into groups of the same number of repeats, chosen to pad least and at least the largest mixed
    bucket's (which stays whole). Buckets of ``fixed_state_per_request`` layers (and sliding windows when no
    pattern fixes their split) are cut into as many groups as it takes to fit the block the others need.
    Every group is a ``UniformTypeKVCacheSpecs``; the block costs the widest group's page bytes.
    """
    registry = default_registry if registry is None else registry
    if len({spec.page_size_bytes for spec in layer_specs.values()}) <= 1:
        return None
    members: list[dict[str, KVCacheSpec]] = []
    for name, spec in layer_specs.items():
        for layers in members:
            if registry.is_uniform_type([*layers.values(), spec]):
                layers[name] = spec
                break
        else:
            members.append({name: spec})
    buckets: list[_PackBucket] = []
    for layers in members:
        by_page: dict[int, list[str]] = {}
        for name, spec in layers.items():
            by_page.setdefault(spec.page_size_bytes, []).append(name)
        first = next(iter(layers.values()))
        uniform = UniformTypeKVCacheSpecs(block_size=first.block_size, kv_cache_specs=layers)
        buckets.append(_PackBucket(spec=uniform, by_page=by_page))
    min_repeats = max((b.repeats for b in buckets if b.balanced and len(b.by_page) > 1), default=0)
    repeats: int | None = (
        _least_padding_repeats([b.repeats for b in buckets if b.balanced], min_repeats)
        if min_repeats
        else None
    )

    def num_groups(bucket: _PackBucket) -> int:
        return cdiv(bucket.repeats, repeats) if bucket.balanced and repeats is not None else 1

    def holds_states(bucket: _PackBucket) -> bool:
        traits = traits_of(bucket.spec.representative_spec())
        return traits.fixed_state_per_request or (repeats is None and traits.sliding_window is not None)

    # The block must hold the widest group however the state buckets split (down to one state a group).
    anchor = max(
        b.widest_group_bytes(len(b.spec.kv_cache_specs) if holds_states(b) else num_groups(b))
        for b in buckets
    )
    groups: list[KVCacheGroupSpec] = []
    for bucket in buckets:
        count = num_groups(bucket)
        if holds_states(bucket):
            # As many states a group as the block already fits, rather than widen the block.
            per_block = max(anchor // bucket.state_page, 1)
            count = max(count, cdiv(len(bucket.spec.kv_cache_specs), per_block))
        if count == 1:
            groups.append(
                KVCacheGroupSpec(layer_names=tuple(bucket.spec.kv_cache_specs), kv_cache_spec=bucket.spec)
            )
            continue
        pattern = list(zip(*bucket.by_page.values()))
        for i in range(count):
            names = [name for repeat in pattern[i::count] for name in repeat]
            spec = UniformTypeKVCacheSpecs(
                block_size=bucket.spec.block_size,
                kv_cache_specs={n: bucket.spec.kv_cache_specs[n] for n in names},
            )
            groups.append(KVCacheGroupSpec(layer_names=tuple(names), kv_cache_spec=spec))
    return groups
