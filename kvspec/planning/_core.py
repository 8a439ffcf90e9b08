"""The compiled part of memory planning (see :mod:`kvspec.planning`, the public module, for the rules).

Every public function here is also reachable from ``kvspec.planning``; the entry points that
type-check their arguments (``get_kv_cache_groups``, ``get_kv_cache_config_from_groups``,
``get_kv_cache_configs``, ``get_kv_cache_config``, ``auto_fit_max_model_len``,
``add_kv_sharing_layers``) are wrapped there, because beartype cannot wrap a function mypyc compiled. Calls between functions of this module skip those checks (their arguments
were checked once, at the public door).

Units: memory in bytes, lengths in tokens, ``num_blocks`` in blocks.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Collection, Mapping, Sequence

from kvspec.contracts.release import DEFAULT_PROFILE, ReleaseProfile
from kvspec.contracts.spec import KVCacheSpec, SchedulerLimits, replace_fields
from kvspec.contracts.traits import full_attention_form, padded_to_page, resized_to_page, traits_of
from kvspec.errors import (
    ConflictingLayerSpecError,
    HybridUnificationError,
    InsufficientKVCacheMemoryError,
    PageSizeUnificationError,
    PlanningError,
    SpecMergeError,
    SpecValidationError,
)
from kvspec.intmath import cdiv
from kvspec.planning.config import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    WorkerBudgets,
    _layer_specs,
    scheduler_spec,
)
from kvspec.planning.packing import packed_kv_cache_groups
from kvspec.planning.sizing import (
    CONSERVING_MEMORY_HINT,
    bytes_per_block,
    check_enough_kv_cache_memory,
    estimate_max_model_len,
    is_packed_layout,
    max_memory_usage_bytes_from_groups,
    uniform_page_size,
    usable_bytes,
)
from kvspec.registry.builtins import default_registry
from kvspec.registry.core import AnyRegistry
from kvspec.specs.uniform import UniformTypeKVCacheSpecs

logger = logging.getLogger("kvspec.planning")  # the public module's name, in both builds


# -- uniformity and unification ------------------------------------------------------------------


def is_kv_cache_spec_uniform(layer_specs: Mapping[str, KVCacheSpec]) -> bool:
    """True when every layer's spec merges into one (so one group can hold them all).

    Fixed on purpose: vLLM catches only the AssertionError of a failed merge, so layers that differ only in
    window size make it raise ValueError instead of answering False; here any SpecMergeError means False.
    """
    specs = list(layer_specs.values())
    if not specs:
        return True
    if len({type(s) for s in specs}) > 1:
        return False  # merge() requires one exact class (see FullAttentionSpec.merge)
    try:
        specs[0].merge(specs)
    except SpecMergeError:
        return False
    return True


def _is_uniform_type(specs: Sequence[KVCacheSpec], registry: AnyRegistry) -> bool:
    return bool(specs) and registry.is_uniform_type(specs)


def make_uniform_type_specs(
    layer_specs: Mapping[str, KVCacheSpec], registry: AnyRegistry | None = None
) -> UniformTypeKVCacheSpecs | None:
    """One UniformTypeKVCacheSpecs for ``layer_specs`` if they are of one uniform type, else None."""
    registry = default_registry if registry is None else registry
    specs = list(layer_specs.values())
    if not _is_uniform_type(specs, registry):
        return None
    return UniformTypeKVCacheSpecs(block_size=specs[0].block_size, kv_cache_specs=dict(layer_specs))


def unify_hybrid_kv_cache_specs(
    layer_specs: Mapping[str, KVCacheSpec], registry: AnyRegistry | None = None
) -> dict[str, KVCacheSpec]:
    """With hybrid management disabled, convert windowed layers to full attention so one type remains.

    A layer converts when its traits list a full-attention family (``hybrid_off_families``) that some layer
    of the model belongs to (``full_attention_family``): ``to_full_attention(template)`` then builds its
    full-attention form (built-ins: FullAttentionSpec with ``sliding_window`` / ``attention_chunk_size``
    set, which keeps every block). Unlike vLLM 0.23, a chunked layer keeps its ``kv_quant_mode``. Raises
    HybridUnificationError when no full-attention layer is present or the result is still mixed.
    """
    registry = default_registry if registry is None else registry
    out = dict(layer_specs)
    specs = list(out.values())
    if is_kv_cache_spec_uniform(out) or _is_uniform_type(specs, registry):
        return out
    logger.warning(
        "Hybrid KV cache manager is disabled for this hybrid model; windowed layers are sized as full attention."
    )
    traits = {name: traits_of(spec) for name, spec in out.items()}
    # The first full-attention layer of each family ("kv", "latent") is the conversion template.
    templates: dict[str, KVCacheSpec] = {}
    for name, spec in out.items():
        family = traits[name].full_attention_family
        if family is not None:
            templates.setdefault(family, spec)
    if templates:
        for name, spec in list(out.items()):
            template = next((templates[f] for f in traits[name].hybrid_off_families if f in templates), None)
            if template is not None:
                out[name] = full_attention_form(spec, template)
    if not (is_kv_cache_spec_uniform(out) or _is_uniform_type(list(out.values()), registry)):
        kinds = sorted({type(s).__name__ for s in out.values()})
        raise HybridUnificationError(
            "Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one unified "
            f"type (left: {', '.join(kinds)}). Enable hybrid KV cache management."
        )
    return out


def unify_kv_cache_spec_page_size(
    layer_specs: Mapping[str, KVCacheSpec], *, profile: ReleaseProfile | None = None
) -> dict[str, KVCacheSpec]:
    """Scale the block size of smaller-page layers so every layer's page equals the largest page.

    Under a profile that pads pages (``PlanningRules.pad_pages``: vLLM 0.32 and 0.34; None: the default
    profile), a ``page_paddable`` layer whose page scaling cannot reach the largest
    one (it does not divide it, or it does not grow with the block: Mamba) is padded to it instead
    (``page_size_padded``); otherwise that is a PageSizeUnificationError."""
    pages = {spec.page_size_bytes for spec in layer_specs.values()}
    if len(pages) <= 1:
        return dict(layer_specs)
    max_page = max(pages)
    pad_pages = (DEFAULT_PROFILE if profile is None else profile).planning.pad_pages
    out: dict[str, KVCacheSpec] = {}
    for name, spec in layer_specs.items():
        page = spec.page_size_bytes
        if page == max_page:
            out[name] = spec
            continue
        paddable = pad_pages and traits_of(spec).page_paddable
        if max_page % page:
            if paddable:
                out[name] = padded_to_page(spec, max_page)
                continue
            raise PageSizeUnificationError(
                f"The page size of layer {name} ({type(spec).__name__}, {page} bytes) does not divide the "
                f"largest page size ({max_page} bytes), so it cannot be unified by adjusting block_size. "
                "Pad the smaller spec (page_size_padded) or change block sizes."
            )
        scaled = spec.copy_with_new_block_size(spec.block_size * (max_page // page))
        if scaled.page_size_bytes != max_page:
            if paddable:
                out[name] = padded_to_page(spec, max_page)
                continue
            raise PageSizeUnificationError(
                f"Layer {name} ({type(spec).__name__}) has a padded page of {page} bytes; scaling its "
                f"block size gives {scaled.page_size_bytes} bytes, not {max_page}."
            )
        out[name] = scaled
    return out


# -- grouping -----------------------------------------------------------------------------------


def _merged_group(layer_names: Sequence[str], specs: Sequence[KVCacheSpec]) -> KVCacheGroupSpec:
    return KVCacheGroupSpec(layer_names=tuple(layer_names), kv_cache_spec=specs[0].merge(list(specs)))


def _bucket_layers(layer_specs: Mapping[str, KVCacheSpec]) -> dict[KVCacheSpec, list[str]]:
    """Layers by equal spec, buckets in order of first appearance, layers in order within a bucket."""
    buckets: dict[KVCacheSpec, list[str]] = {}
    # The latest bucket of each spec class is tried first: a model's layers of one class are nearly
    # always one spec, and one equality test is cheaper than the dict's hash-then-equality.
    latest: dict[type, tuple[KVCacheSpec, list[str]]] = {}
    for name, spec in layer_specs.items():
        seen = latest.get(type(spec))
        if seen is not None and (seen[0] is spec or seen[0] == spec):
            seen[1].append(name)
            continue
        names = buckets.setdefault(spec, [])
        names.append(name)
        latest[type(spec)] = (spec, names)
    return buckets


def _unify_buckets(
    buckets: dict[KVCacheSpec, list[str]], order: Mapping[str, int], profile: ReleaseProfile
) -> dict[KVCacheSpec, list[str]]:
    """Page-size unification done once per distinct spec (not per layer); buckets that become equal merge,
    their layers back in model order."""
    unified = unify_kv_cache_spec_page_size(
        {names[0]: spec for spec, names in buckets.items()}, profile=profile
    )
    if all(unified[names[0]] is spec for spec, names in buckets.items()):
        return buckets
    out: dict[KVCacheSpec, list[str]] = {}
    for names in buckets.values():
        out.setdefault(unified[names[0]], []).extend(names)
    return {spec: sorted(names, key=order.__getitem__) for spec, names in out.items()}


def _split_buckets(buckets: dict[KVCacheSpec, list[str]], num_layers: int) -> list[KVCacheGroupSpec]:
    sizes = [len(layers) for layers in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < 1.5 * min(sizes):
        # Close counts (e.g. 12 SW + 13 full with EAGLE): one group per bucket, a little padding.
        group_size = max(sizes)
    groups: list[KVCacheGroupSpec] = []
    padding = 0
    for spec, layers in buckets.items():
        num_groups = cdiv(len(layers), group_size)
        padding += num_groups * group_size - len(layers)
        for i in range(num_groups):
            groups.append(KVCacheGroupSpec(layer_names=tuple(layers[i::num_groups]), kv_cache_spec=spec))
    if padding:
        logger.warning(
            "Add %d padding layers, may waste at most %.2f%% KV cache memory",
            padding,
            100 * padding / (num_layers + padding),
        )
    return groups


def get_kv_cache_groups(
    layer_specs: Mapping[str, KVCacheSpec],
    *,
    hybrid: bool = True,
    registry: AnyRegistry | None = None,
    profile: ReleaseProfile | None = None,
    pack_pages: bool = False,
) -> list[KVCacheGroupSpec]:
    # Documented on kvspec.planning.get_kv_cache_groups, the checked door.
    registry = default_registry if registry is None else registry
    profile = DEFAULT_PROFILE if profile is None else profile
    rules = profile.planning
    specs_by_layer = dict(layer_specs)
    if not hybrid:
        specs_by_layer = unify_hybrid_kv_cache_specs(specs_by_layer, registry)
    if not specs_by_layer:
        return []
    names, specs = list(specs_by_layer), list(specs_by_layer.values())
    if is_kv_cache_spec_uniform(specs_by_layer):
        return [_merged_group(names, specs)]
    uniform = make_uniform_type_specs(specs_by_layer, registry)
    if uniform is not None:
        return [KVCacheGroupSpec(layer_names=tuple(names), kv_cache_spec=uniform)]
    if pack_pages:
        shared = {n: s for n, s in specs_by_layer.items() if not traits_of(s).own_group}
        packed = packed_kv_cache_groups(shared, registry)
        if packed is not None:
            # Blocks are strided by the widest group, so an own-group layer keeps its page as it is.
            own_groups = [
                KVCacheGroupSpec(layer_names=(n,), kv_cache_spec=s)
                for n, s in specs_by_layer.items()
                if n not in shared
            ]
            return packed + own_groups
    # Work per distinct spec, not per layer: a model has a handful of distinct specs over many layers.
    buckets = _bucket_layers(specs_by_layer)
    own = {spec: layers for spec, layers in buckets.items() if traits_of(spec).own_group}
    rest = {spec: layers for spec, layers in buckets.items() if spec not in own}
    order = {name: i for i, name in enumerate(specs_by_layer)}
    try:
        unified = _unify_buckets(rest, order, profile) if rest else {}
    except PageSizeUnificationError:
        fallback = (
            full_allocation_groups(specs_by_layer, registry) if rules.full_allocation_fallback else None
        )
        if fallback is None:
            raise
        return fallback
    groups = _split_buckets(unified, sum(map(len, rest.values()))) if rest else []
    if own:
        common_page = groups[0].kv_cache_spec.page_size_bytes if groups else None
        # vLLM 0.34: an own-group layer's block divides the other groups' blocks, so every hit (a whole
        # number of their blocks) is a whole number of its blocks too.
        common_block = (
            math.gcd(*(g.kv_cache_spec.block_size for g in groups)) if rules.pad_pages and groups else None
        )
        for name in sorted((n for layers in own.values() for n in layers), key=order.__getitem__):
            spec = specs_by_layer[name]
            page = spec.page_size_bytes if common_page is None else common_page
            resized = resized_to_page(spec, page)
            if common_block is not None:
                resized = _block_dividing(resized, common_block, name)
            groups.append(KVCacheGroupSpec(layer_names=(name,), kv_cache_spec=resized))
    return groups


def full_allocation_groups(
    layer_specs: Mapping[str, KVCacheSpec], registry: AnyRegistry | None = None
) -> list[KVCacheGroupSpec] | None:
    """vLLM 0.32+'s fallback when page sizes cannot be unified beside a latent (MLA) layer: the windowed
    layers are allocated as full attention (every block kept; their attention compute is the engine's and
    unchanged) so every layer shares one uniform-type group and block table (``vllm/v1/core/kv_cache_planning.py``: ``_try_get_full_allocation_fallback_groups`` (0.34.0)). A sliding
    window's own group would pay every layer's page for each block id anyway, so nothing is lost.

    None (the caller raises its unification error) unless the model has a latent full-attention layer and a
    sliding-window layer, no own-group layer and no chunked-local layer, and the promoted layers form one
    uniform type. A promoted layer takes the full-attention layers' block size when they share one and
    keeps its window (``sliding_window``, where its full-attention form has the field).
    """
    registry = default_registry if registry is None else registry
    traits = {name: traits_of(spec) for name, spec in layer_specs.items()}
    if any(t.own_group or t.attention_chunk_size is not None for t in traits.values()):
        return None
    has_latent = any(t.full_attention_family == "latent" for t in traits.values())
    if not (has_latent and any(t.sliding_window is not None for t in traits.values())):
        return None
    full = {n: s for n, s in layer_specs.items() if traits[n].full_attention_family is not None}
    templates: dict[str, KVCacheSpec] = {}
    for name, spec in full.items():
        templates.setdefault(str(traits[name].full_attention_family), spec)
    full_blocks = {s.block_size for s in full.values()}
    promoted: dict[str, KVCacheSpec] = {}
    for name, spec in layer_specs.items():
        t = traits[name]
        if t.sliding_window is None or not t.hybrid_off_families:
            promoted[name] = spec
            continue
        template = next(
            (templates[f] for f in t.hybrid_off_families if f in templates), next(iter(full.values()))
        )
        out = full_attention_form(spec, template)
        block = next(iter(full_blocks)) if len(full_blocks) == 1 else spec.block_size
        if out.block_size != block:
            out = out.copy_with_new_block_size(block)
        if getattr(out, "sliding_window", 0) is None:  # a full-attention form that can remember a window
            out = replace_fields(out, sliding_window=t.sliding_window)
        promoted[name] = out
    uniform = make_uniform_type_specs(promoted, registry)
    if uniform is None:
        return None
    logger.warning(
        "KV cache page sizes cannot be unified; the sliding-window layers are allocated as full attention "
        "(every block kept, one block table for all layers). Sliding-window attention compute is unchanged."
    )
    return [KVCacheGroupSpec(layer_names=tuple(promoted), kv_cache_spec=uniform)]


def _block_dividing(spec: KVCacheSpec, common_block: int, name: str) -> KVCacheSpec:
    """``spec`` (resized to the common page) with the largest block size that fits its page and divides
    ``common_block``; the page stays padded to the same size."""
    block = next(b for b in range(min(spec.block_size, common_block), 0, -1) if common_block % b == 0)
    if block == spec.block_size:
        return spec
    out = spec.copy_with_new_block_size(block)
    if out.page_size_bytes != spec.page_size_bytes:
        raise PageSizeUnificationError(
            f"Layer {name} ({type(spec).__name__}) holds {block} tokens per block to divide the other groups' "
            f"{common_block}-token blocks, but its page then changes from {spec.page_size_bytes} to "
            f"{out.page_size_bytes} bytes; its spec must keep a padded page when its block shrinks."
        )
    return out


# -- memory bounds ------------------------------------------------------------------------------


# -- configs ------------------------------------------------------------------------------------


def get_kv_cache_config_from_groups(
    groups: Sequence[KVCacheGroupSpec], available_memory: int, *, num_blocks_override: int | None = None
) -> KVCacheConfig:
    # Documented on kvspec.planning.get_kv_cache_config_from_groups, the checked door.
    if not groups:
        return KVCacheConfig(num_blocks=1, kv_cache_tensors=(), kv_cache_groups=())
    if len(groups) == 1 and isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs):
        uniform = groups[0].kv_cache_spec
        num_blocks = max(available_memory // uniform.page_size_bytes, 0)
        if num_blocks_override is not None:
            num_blocks = num_blocks_override
        tensors = tuple(
            KVCacheTensor(size=spec.page_size_bytes * num_blocks, shared_by=(name,))
            for name, spec in uniform.kv_cache_specs.items()
        )
        return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=tuple(groups))
    if is_packed_layout(groups):
        return _packed_config(groups, available_memory, num_blocks_override)
    group_size = max(len(g.layer_names) for g in groups)
    page = uniform_page_size(groups)
    num_blocks = max(available_memory // page // group_size, 0)
    if num_blocks_override is not None:
        num_blocks = num_blocks_override
    tensors = tuple(
        KVCacheTensor(
            size=page * num_blocks,
            shared_by=tuple(g.layer_names[i] for g in groups if i < len(g.layer_names)),
        )
        for i in range(group_size)
    )
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=tuple(groups))


def _packed_config(
    groups: Sequence[KVCacheGroupSpec], available_memory: int, num_blocks_override: int | None
) -> KVCacheConfig:
    """One buffer of ``num_blocks`` blocks of the widest group's bytes; every group's layers lie side by side
    in each block from byte 0 (groups alias: a block id belongs to one group at a time)."""
    stride = bytes_per_block(groups)
    num_blocks = max(available_memory // stride, 0) if num_blocks_override is None else num_blocks_override
    names: list[str] = []
    offsets: list[int] = []
    for group in groups:
        spec = group.kv_cache_spec
        offset = 0
        for name in group.layer_names:
            names.append(name)
            offsets.append(offset)
            layer = spec.kv_cache_specs[name] if isinstance(spec, UniformTypeKVCacheSpecs) else spec
            offset += layer.page_size_bytes
    tensor = KVCacheTensor(
        size=stride * num_blocks, shared_by=tuple(names), block_stride=stride, offsets=tuple(offsets)
    )
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=(tensor,), kv_cache_groups=tuple(groups))


def project_groups_to_worker(
    groups: Sequence[KVCacheGroupSpec], worker_layers: Mapping[str, object]
) -> list[KVCacheGroupSpec]:
    """A worker's share of the global groups: same count and order; empty groups keep their spec."""
    out: list[KVCacheGroupSpec] = []
    for group in groups:
        names = tuple(n for n in group.layer_names if n in worker_layers)
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs) and names:
            spec = spec.narrowed_to(names)
        out.append(
            KVCacheGroupSpec(
                layer_names=names, kv_cache_spec=spec, is_eagle_group=group.is_eagle_group and bool(names)
            )
        )
    return out


def mark_eagle_groups(
    groups: Sequence[KVCacheGroupSpec], draft_layers: Collection[str]
) -> tuple[KVCacheGroupSpec, ...]:
    """The groups with ``is_eagle_group`` set on exactly those that hold a layer of ``draft_layers``, the
    draft model's (EAGLE / MTP) layers: the groups whose hits EAGLE's one-block drop applies to (vLLM 0.34,
    ``vllm/v1/core/kv_cache_planning.py``: ``get_global_kv_cache_groups`` (0.34.0); 0.23 flags every group). Layer names and specs are unchanged."""
    drafts = frozenset(draft_layers)
    return tuple(dataclasses.replace(g, is_eagle_group=not drafts.isdisjoint(g.layer_names)) for g in groups)


def draft_groups_unidentified(groups: Sequence[KVCacheGroupSpec]) -> bool:
    """No group is flagged as the draft model's although some group holds state (Mamba) layers: EAGLE's
    block drop then misses the draft's groups, and a state group's hit is not extended (vLLM 0.34 warns,
    ``vllm/v1/core/kv_cache_planning.py``: ``_warn_if_unannotated_eagle_mamba`` (0.34.0)). Tag the draft model's layers so ``mark_eagle_groups`` can find them."""
    if any(g.is_eagle_group for g in groups):
        return False
    return any(traits_of(spec).kind == "mamba" for g in groups for spec in _layer_specs(g))


def check_layer_values(layer_specs: Mapping[str, KVCacheSpec]) -> None:
    """Every layer's ``block_size`` and ``page_size_bytes`` are positive ints (a plugin returning a float
    would otherwise plan a fractional number of blocks); SpecValidationError names the layer."""
    for name, spec in layer_specs.items():
        # getattr, not the attributes: the protocol says int, and compiled code would unbox a plugin's
        # float with a bare TypeError before this test could name the layer.
        block_size, page = getattr(spec, "block_size"), getattr(spec, "page_size_bytes")  # noqa: B009
        if type(block_size) is int and type(page) is int and block_size > 0 and page > 0:
            continue
        for member in ("block_size", "page_size_bytes"):
            value = getattr(spec, member)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecValidationError(
                    f"Layer {name}: {type(spec).__name__}.{member} is {value!r} ({type(value).__name__}); it must "
                    "be a positive int. Fix the spec (kvspec.testing.check_plugin checks every such value)."
                )


def merge_worker_specs(per_worker_specs: Sequence[Mapping[str, KVCacheSpec]]) -> dict[str, KVCacheSpec]:
    """All workers' layers in one dict; a layer reported by several workers must have one spec."""
    merged: dict[str, KVCacheSpec] = {}
    for rank, specs in enumerate(per_worker_specs):
        for name, spec in specs.items():
            seen = merged.setdefault(name, spec)
            if seen is not spec and seen != spec:  # identity first: a dataclass __eq__ compares every field
                raise ConflictingLayerSpecError(
                    f"The KV cache specs for layer {name} differ across workers (worker {rank} has "
                    f"{type(spec).__name__}, another has {type(seen).__name__}: {spec!r} vs {seen!r}). "
                    "Every worker must report the same spec for a layer."
                )
    return merged


def get_kv_cache_configs(
    per_worker_specs: Sequence[Mapping[str, KVCacheSpec]],
    per_worker_available_bytes: Sequence[int],
    limits: SchedulerLimits,
    *,
    num_blocks_override: int | None = None,
    hybrid: bool = True,
    registry: AnyRegistry | None = None,
    profile: ReleaseProfile | None = None,
    pack_pages: bool = False,
) -> list[KVCacheConfig]:
    # Documented on kvspec.planning.get_kv_cache_configs, the checked door.
    profile = DEFAULT_PROFILE if profile is None else profile
    if len(per_worker_specs) != len(per_worker_available_bytes):
        raise PlanningError(
            f"Got specs for {len(per_worker_specs)} workers but memory for {len(per_worker_available_bytes)}."
        )
    registry = default_registry if registry is None else registry
    merged = merge_worker_specs(per_worker_specs)
    registry.check(merged)
    check_layer_values(merged)
    global_groups = get_kv_cache_groups(
        merged, hybrid=hybrid, registry=registry, profile=profile, pack_pages=pack_pages
    )
    worker_groups = [project_groups_to_worker(global_groups, specs) for specs in per_worker_specs]
    for rank, groups in enumerate(worker_groups):
        missing = set(per_worker_specs[rank]) - {n for g in groups for n in g.layer_names}
        if missing:
            raise PlanningError(f"Some layers are not assigned to any group: {sorted(missing)}.")
    if not worker_groups:
        return []
    budgets = WorkerBudgets(
        worker_groups=worker_groups,
        available_bytes=per_worker_available_bytes,
        num_blocks_override=num_blocks_override,
        reserve_null_block=profile.planning.reserve_null_block,
    )
    num_blocks = plan_num_blocks(budgets, limits)
    # The planned retention travels with the config, as vLLM 0.34's planner writes it (the coordinator reads it).
    retention = profile.planning.prefix_cache_retention_interval
    return [
        dataclasses.replace(
            get_kv_cache_config_from_groups(groups, 0, num_blocks_override=num_blocks),
            prefix_cache_retention_interval=retention,
            release=profile.name,
        )
        for groups in worker_groups
    ]


def _live_workers(budgets: WorkerBudgets) -> list[tuple[int, list[KVCacheGroupSpec], int, int]]:
    """(rank, groups with layers, bytes to plan with, bytes per block) of each worker of ``budgets`` that
    has layers (with an override, the memory its blocks take)."""
    out: list[tuple[int, list[KVCacheGroupSpec], int, int]] = []
    for rank, (groups, avail) in enumerate(zip(budgets.worker_groups, budgets.available_bytes)):
        live = [g for g in groups if g.layer_names]
        if not live:
            continue
        per_block = bytes_per_block(live) if budgets.block_bytes is None else budgets.block_bytes[rank]
        if per_block <= 0:
            raise PlanningError(
                f"Worker {rank}'s blocks cost {per_block} bytes; a block costs at least a byte."
            )
        override = budgets.num_blocks_override
        out.append((rank, live, avail if override is None else override * per_block, per_block))
    return out


def plan_num_blocks(budgets: WorkerBudgets, limits: SchedulerLimits) -> int:
    """The number of blocks every worker gets (all must hold the same block ids): the smallest
    ``available // block bytes`` over the workers with layers, or the override. Each worker must hold one
    request of ``limits.max_model_len`` tokens (see ``WorkerBudgets``): InsufficientKVCacheMemoryError
    names the worker that cannot. A model without KV cache gets 1 block (the null block)."""
    counts: list[int] = []
    for rank, live, avail, per_block in _live_workers(budgets):
        check_enough_kv_cache_memory(
            live,
            usable_bytes(live, avail, budgets.reserve_null_block, per_block),
            limits,
            worker=f"worker {rank}" if len(budgets.worker_groups) > 1 else "",
            block_bytes=per_block,
        )
        override = budgets.num_blocks_override
        counts.append(override if override is not None else max(avail // per_block, 0))
    return min(counts) if counts else 1


def get_kv_cache_config(
    layer_specs: Mapping[str, KVCacheSpec],
    available_memory: int,
    limits: SchedulerLimits,
    *,
    num_blocks_override: int | None = None,
    hybrid: bool = True,
    registry: AnyRegistry | None = None,
    profile: ReleaseProfile | None = None,
    pack_pages: bool = False,
) -> KVCacheConfig:
    # Documented on kvspec.planning.get_kv_cache_config, the checked door.
    return get_kv_cache_configs(
        [layer_specs],
        [available_memory],
        limits,
        num_blocks_override=num_blocks_override,
        hybrid=hybrid,
        registry=registry,
        profile=profile,
        pack_pages=pack_pages,
    )[0]


def generate_scheduler_kv_cache_config(configs: Sequence[KVCacheConfig]) -> KVCacheConfig:
    """The scheduler's view: workers agree on num_blocks; uniform-type groups run by their first spec."""
    if not configs:
        raise PlanningError("generate_scheduler_kv_cache_config needs at least one worker config.")
    if len({c.num_blocks for c in configs}) != 1:
        raise PlanningError(f"Workers disagree on num_blocks: {[c.num_blocks for c in configs]}.")
    first = configs[0]
    groups = tuple(
        dataclasses.replace(g, kv_cache_spec=scheduler_spec(g.kv_cache_spec)) for g in first.kv_cache_groups
    )
    return dataclasses.replace(first, kv_cache_groups=groups)


def auto_fit_max_model_len(
    per_worker_specs: Sequence[Mapping[str, KVCacheSpec]],
    per_worker_available_bytes: Sequence[int],
    limits: SchedulerLimits,
    *,
    hybrid: bool = True,
    registry: AnyRegistry | None = None,
    profile: ReleaseProfile | None = None,
    pack_pages: bool = False,
) -> int:
    # Documented on kvspec.planning.auto_fit_max_model_len, the checked door.
    registry = default_registry if registry is None else registry
    profile = DEFAULT_PROFILE if profile is None else profile
    merged = merge_worker_specs(per_worker_specs)
    groups = get_kv_cache_groups(
        merged, hybrid=hybrid, registry=registry, profile=profile, pack_pages=pack_pages
    )
    budgets = WorkerBudgets(
        worker_groups=[project_groups_to_worker(groups, specs) for specs in per_worker_specs],
        available_bytes=per_worker_available_bytes,
        reserve_null_block=profile.planning.reserve_null_block,
    )
    return auto_fit_from_groups(budgets, limits)


def auto_fit_from_groups(budgets: WorkerBudgets, limits: SchedulerLimits) -> int:
    """The largest max_model_len (<= ``limits.max_model_len``) every worker with layers can serve one request
    of (see ``WorkerBudgets``); InsufficientKVCacheMemoryError when not one token fits. A model without KV
    cache keeps ``limits.max_model_len``."""
    fits = [
        (
            estimate_max_model_len(
                live, usable_bytes(live, avail, budgets.reserve_null_block, per_block), limits, per_block
            ),
            live,
            avail,
        )
        for _, live, avail, per_block in _live_workers(budgets)
    ]
    if not fits:
        return limits.max_model_len
    fitted, groups, limiting = min(fits, key=lambda fit: fit[0])
    if fitted <= 0:
        raise InsufficientKVCacheMemoryError(
            "Cannot auto-fit max_model_len: not enough memory to serve even a single token. "
            + CONSERVING_MEMORY_HINT,
            needed_bytes=max_memory_usage_bytes_from_groups(
                groups, dataclasses.replace(limits, max_model_len=1)
            ),
            available_bytes=limiting,
            max_model_len=limits.max_model_len,
            estimated_max_model_len=0,
        )
    return fitted


def add_kv_sharing_layers(
    kv_cache_groups: Sequence[KVCacheGroupSpec], shared_kv_cache_layers: Mapping[str, str]
) -> tuple[KVCacheGroupSpec, ...]:
    # Documented on kvspec.planning.add_kv_sharing_layers, the checked door.
    owner = {layer: gid for gid, group in enumerate(kv_cache_groups) for layer in group.layer_names}
    added: list[list[str]] = [[] for _ in kv_cache_groups]
    for layer, target in shared_kv_cache_layers.items():
        if layer in owner:
            raise PlanningError(
                f"Layer {layer!r} shares {target!r}'s KV cache but already belongs to KV cache group "
                f"{owner[layer]}; a sharing layer allocates no cache of its own."
            )
        if target in shared_kv_cache_layers:
            raise PlanningError(
                f"Layer {layer!r} shares {target!r}'s KV cache, which itself shares "
                f"{shared_kv_cache_layers[target]!r}'s; point {layer!r} at the layer that owns the cache."
            )
        gid = owner.get(target)
        if gid is None:
            raise PlanningError(
                f"Layer {layer!r} shares {target!r}'s KV cache, but {target!r} is in no KV cache group."
            )
        added[gid].append(layer)
    return tuple(
        dataclasses.replace(group, layer_names=(*group.layer_names, *extra)) if extra else group
        for group, extra in zip(kv_cache_groups, added, strict=True)
    )
