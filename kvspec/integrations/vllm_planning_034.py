"""kvspec's planner behind vLLM 0.34.0's ``kv_cache_planning`` functions (``vllm_config`` forms).

vLLM 0.34 split planning in two: the core flow (grouping, ``num_gpu_blocks_override``, the null block held
back, max_model_len auto-fit, the memory checks, one block count for every rank) and a replaceable
``KVCacheConfigBuilder`` that places a group's layers in tensors (the layout, strides, offsets: a
platform's to replace). Here kvspec decides the first part (``kvspec.planning``: groups, EAGLE groups,
block counts, checks, auto-fit) and vLLM's builder, or the platform's, still places the tensors for the
block count kvspec chose; what one block costs under that placement (alignment, padding) is asked of the
builder, so a padded layout is planned with its real cost.

Group specs go back as the caller's own vLLM objects where kvspec left the spec as it was, and otherwise
carry the fields kvspec does not model (``is_draft``, ``max_tp_shards``, ``block_stride_alignment``, ...)
from the layer's vLLM spec. Nothing here imports vLLM until a function is called.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kvspec import planning
from kvspec.contracts.release import VLLM_0_34
from kvspec.contracts.spec import KVCacheSpec
from kvspec.errors import (
    ConflictingLayerSpecError,
    PageSizeUnificationError,
    PlanningError,
    VllmConflictingLayerSpecError,
    VllmPageSizeUnificationError,
)
from kvspec.integrations.vllm import as_kvspec, to_kvspec_layers, to_vllm
from kvspec.integrations.vllm_planning import (
    estimate_max_model_len,
    group_from_vllm,
    is_kv_cache_spec_uniform,
    limits_from_vllm_config,
    uses_hybrid_manager,
)
from kvspec.planning.config import KVCacheGroupSpec
from kvspec.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "check_enough_kv_cache_memory",
    "estimate_max_model_len",
    "get_global_kv_cache_groups",
    "get_kv_cache_configs",
    "get_kv_cache_groups",
    "is_kv_cache_spec_uniform",
]

_PLANNING = "vllm.v1.core.kv_cache_planning"


def _groups_of(vllm_config: Any, kv_cache_spec: Mapping[str, Any]) -> Sequence[KVCacheGroupSpec]:
    return _grouped(vllm_config, to_kvspec_layers(kv_cache_spec))


def _grouped(vllm_config: Any, layer_specs: Mapping[str, KVCacheSpec]) -> Sequence[KVCacheGroupSpec]:
    """kvspec's groups under 0.34's rules (pages padded, packed in a block-outermost layout, the MLA
    full-allocation fallback), with vLLM's exception types; the planner's warnings go to vLLM's log too."""
    try:
        with _warnings_to(importlib.import_module(_PLANNING).logger):
            return planning.get_kv_cache_groups(
                layer_specs,
                hybrid=uses_hybrid_manager(vllm_config),
                profile=VLLM_0_34,
                pack_pages=_packs_pages(vllm_config, layer_specs),
            )
    except PageSizeUnificationError as exc:
        raise VllmPageSizeUnificationError(str(exc)) from exc


def _packs_pages(vllm_config: Any, layer_specs: Mapping[str, KVCacheSpec]) -> bool:
    """Whether the resolved KV cache layout is block-outermost (a block holds a page of every layer of its
    group side by side, so pages of several sizes pack into one block; vLLM 0.34 ``vllm/v1/core/kv_cache_planning.py``: ``_get_packed_kv_cache_groups`` (0.34.0)). Asked
    only where vLLM asks it: of a hybrid-managed model of several page sizes that one group cannot hold
    (the layout may not be resolved before then, and vLLM raises when it is read too early)."""
    if not uses_hybrid_manager(vllm_config) or len({s.page_size_bytes for s in layer_specs.values()}) <= 1:
        return False
    if planning.is_kv_cache_spec_uniform(layer_specs) or planning.make_uniform_type_specs(layer_specs):
        return False
    cache_config = getattr(vllm_config, "cache_config", None)
    resolve = getattr(cache_config, "get_resolved_kv_cache_layout", None)
    return bool(resolve is not None and resolve().is_block_outermost)


@contextlib.contextmanager
def _warnings_to(target: logging.Logger) -> Iterator[None]:
    """kvspec's planning warnings also logged on ``target`` (vLLM's planning logger) while in the block."""

    class _Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            target.warning(record.getMessage())

    source = logging.getLogger("kvspec.planning")
    handler = _Forward(level=logging.WARNING)
    source.addHandler(handler)
    try:
        yield
    finally:
        source.removeHandler(handler)


def get_kv_cache_groups(vllm_config: Any, kv_cache_spec: Mapping[str, Any]) -> list[Any]:
    """vLLM 0.34's ``get_kv_cache_groups``: the layers' groups, decided by ``kvspec.planning``."""
    return [group_to_vllm(g, kv_cache_spec) for g in _groups_of(vllm_config, kv_cache_spec)]


def get_global_kv_cache_groups(vllm_config: Any, kv_cache_specs: Sequence[Mapping[str, Any]]) -> list[Any]:
    """vLLM 0.34's ``get_global_kv_cache_groups``: every worker's layers grouped as one model (a layer on
    several workers must have one spec; sliding windows keep the tokens several speculative modules
    re-prefill, ``_with_retained_tokens``); with EAGLE's block drop, the groups holding the draft model's
    layers (``is_draft``) are its EAGLE groups (``kvspec.planning.mark_eagle_groups``), and a model with
    Mamba layers whose draft layers are not tagged gets vLLM's warning."""
    kv_cache_specs = [_with_retained_tokens(vllm_config, w) for w in kv_cache_specs]
    per_worker = [to_kvspec_layers(w) for w in kv_cache_specs]
    try:
        merged_ours = planning.merge_worker_specs(per_worker)
    except ConflictingLayerSpecError as exc:
        raise VllmConflictingLayerSpecError(str(exc)) from exc
    theirs: dict[str, Any] = {}
    for worker in kv_cache_specs:
        theirs.update(worker)
    groups = _grouped(vllm_config, merged_ours)
    speculative = vllm_config.speculative_config
    if speculative is not None and speculative.use_eagle_block_drop():
        groups = planning.mark_eagle_groups(
            groups, [name for name, spec in theirs.items() if getattr(spec, "is_draft", False)]
        )
        if planning.draft_groups_unidentified(groups):
            importlib.import_module(_PLANNING).logger.warning(
                "Speculative decoding (method=%s) is enabled but no KV cache group could be identified as "
                "the draft model's.",
                speculative.method,
            )
    return [group_to_vllm(g, theirs) for g in groups]


def _with_retained_tokens(vllm_config: Any, layer_specs: Mapping[str, Any]) -> dict[str, Any]:
    """The layers with every sliding-window spec keeping ``num_prefill_lookahead_tokens - 1`` tokens below
    its window (vLLM 0.34 tags them so before grouping: several speculative modules re-prefill them; kvspec's
    ``SlidingWindowSpec.extra_retained_tokens``)."""
    extra = max(0, int(getattr(vllm_config, "num_prefill_lookahead_tokens", 0) or 0) - 1)
    window_cls = importlib.import_module("vllm.v1.kv_cache_interface").SlidingWindowSpec
    return {
        name: dataclasses.replace(spec, extra_retained_tokens=extra) if isinstance(spec, window_cls) else spec
        for name, spec in layer_specs.items()
    }


def get_kv_cache_configs(
    vllm_config: Any,
    kv_cache_specs: Sequence[Mapping[str, Any]],
    available_memory: Sequence[int],
    global_kv_cache_groups: Sequence[Any],
) -> list[Any]:
    """vLLM 0.34's ``get_kv_cache_configs``: one config per worker with kvspec's block count.

    kvspec projects the global groups onto each worker, applies ``num_gpu_blocks_override``, holds the
    null block back from auto-fit and the checks (``VLLM_0_34.planning.reserve_null_block``), fits
    ``max_model_len`` when the user asked for -1 (written back into ``model_config`` as vLLM does), checks
    that every worker holds one max-length request, and gives every worker the smallest block count. The
    builder then places each worker's groups for that count; ``kv_tp_replicas`` and the zeroing decision
    are resolved across workers as vLLM does."""
    module: Any = importlib.import_module(_PLANNING)
    builder = module.get_kv_cache_config_builder(vllm_config)
    ours = [group_from_vllm(g) for g in global_kv_cache_groups]
    worker_groups = [planning.project_groups_to_worker(ours, worker) for worker in kv_cache_specs]
    vllm_groups = [
        _projected_to_vllm(global_kv_cache_groups, projected, worker)
        for projected, worker in zip(worker_groups, kv_cache_specs)
    ]
    budgets = planning.WorkerBudgets(
        worker_groups=worker_groups,
        available_bytes=available_memory,
        num_blocks_override=vllm_config.cache_config.num_gpu_blocks_override,
        reserve_null_block=VLLM_0_34.planning.reserve_null_block,
        block_bytes=[_placed_block_bytes(builder, vllm_config, g) for g in vllm_groups],
    )
    model_config = vllm_config.model_config
    if getattr(model_config, "original_max_model_len", None) == -1:
        model_config.max_model_len = planning.auto_fit_from_groups(
            budgets, limits_from_vllm_config(vllm_config)
        )
    # The limits are read again: auto-fit may just have lowered max_model_len.
    num_blocks = planning.plan_num_blocks(budgets, limits_from_vllm_config(vllm_config))
    configs = [
        builder.get_kv_cache_config_from_groups(vllm_config, groups, num_blocks) for groups in vllm_groups
    ]
    parallel = vllm_config.parallel_config
    for config in configs:
        config.kv_tp_replicas = module.kv_cache_groups_tp_replicas(
            config.kv_cache_groups, parallel.tensor_parallel_size, parallel.decode_context_parallel_size
        )
    zeroing = any(c.needs_kv_cache_zeroing for c in configs)
    for config in configs:
        config.needs_kv_cache_zeroing = zeroing
    return configs


def check_enough_kv_cache_memory(
    vllm_config: Any, kv_cache_spec: Mapping[str, Any], available_memory: int
) -> None:
    """vLLM 0.34's ``check_enough_kv_cache_memory``: one max-length request must fit the blocks left
    beside the null block (kvspec's ``InsufficientKVCacheMemoryError``, a ValueError with vLLM's text)."""
    if not kv_cache_spec:
        return
    groups = _groups_of(vllm_config, kv_cache_spec)
    limits = limits_from_vllm_config(vllm_config)
    planning.check_enough_kv_cache_memory(
        list(groups),
        planning.usable_bytes(groups, available_memory, VLLM_0_34.planning.reserve_null_block),
        limits,
    )


def _projected_to_vllm(
    global_groups: Sequence[Any], projected: Sequence[KVCacheGroupSpec], worker_specs: Mapping[str, Any]
) -> list[Any]:
    """vLLM's groups for kvspec's projection of ``global_groups`` onto a worker: a group the worker holds
    whole is the caller's object; a part keeps the group's other fields (role, transfer, host residency)."""
    out = []
    for theirs, ours in zip(global_groups, projected, strict=True):
        if list(ours.layer_names) == list(theirs.layer_names):
            out.append(theirs)
            continue
        spec = (
            spec_to_vllm(ours.kv_cache_spec, [worker_specs[n] for n in ours.layer_names])
            if ours.layer_names
            else theirs.kv_cache_spec
        )
        out.append(dataclasses.replace(theirs, layer_names=list(ours.layer_names), kv_cache_spec=spec))
    return out


def _placed_block_bytes(builder: Any, vllm_config: Any, groups: list[Any]) -> int:
    """What one block id costs a worker under the builder's placement: the builder's own answer when it
    gives one (placements with several allocations), else the size of a one-block placement's single
    device backing, as vLLM 0.34's core reads it (``vllm/v1/core/kv_cache_planning.py``: ``_pool_bytes_per_block_from_builder`` (0.34.0)). 0 for a worker without layers."""
    if not any(g.layer_names for g in groups):
        return 0
    declared = builder._get_pool_bytes_per_block(vllm_config, groups)
    if declared is not None:
        return int(declared)
    cache_config = vllm_config.cache_config
    saved, cache_config.num_gpu_blocks_override = cache_config.num_gpu_blocks_override, None
    try:
        probe = builder.get_kv_cache_config_from_groups(vllm_config, groups, 1)
    finally:
        cache_config.num_gpu_blocks_override = saved
    sizes = {t.size for t in probe.kv_cache_tensors if not getattr(t, "host_resident", False)}
    if len(sizes) != 1:
        raise PlanningError(
            f"The KV cache builder placed one block in {len(sizes)} device backings of sizes {sorted(sizes)}; "
            "a builder with several device allocations must say what a block costs "
            "(KVCacheConfigBuilder._get_pool_bytes_per_block)."
        )
    size: int = sizes.pop()
    return size


def group_to_vllm(group: KVCacheGroupSpec, vllm_layer_specs: Mapping[str, Any]) -> Any:
    """vLLM's ``KVCacheGroupSpec`` for kvspec's ``group``, its spec built from the layers' vLLM specs
    (``spec_to_vllm``); ``vllm_layer_specs`` maps each of the group's layers to its vLLM spec."""
    iface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    spec = spec_to_vllm(group.kv_cache_spec, [vllm_layer_specs[n] for n in group.layer_names])
    kwargs: dict[str, Any] = {"is_eagle_group": group.is_eagle_group}
    if group.role is not None:
        kwargs["role"] = iface.KVCacheGroupRole(group.role)
    return iface.KVCacheGroupSpec(list(group.layer_names), spec, **kwargs)


def spec_to_vllm(ours: KVCacheSpec, theirs: Sequence[Any]) -> Any:
    """vLLM's spec for kvspec's ``ours``, decided for layers whose vLLM specs are ``theirs``: the first
    layer's own object when kvspec left it as it was (a merged group of equal layers), else kvspec's spec
    converted with the fields kvspec does not model copied from that layer's spec (a uniform-type group:
    per layer)."""
    if isinstance(ours, UniformTypeKVCacheSpecs):
        iface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
        names = list(ours.kv_cache_specs)
        return iface.UniformTypeKVCacheSpecs(
            block_size=ours.block_size,
            kv_cache_specs={
                name: spec_to_vllm(ours.kv_cache_specs[name], [layer]) for name, layer in zip(names, theirs)
            },
        )
    first = theirs[0]
    if as_kvspec(first) == ours:
        return first
    converted = to_vllm(ours)
    carried = {
        f.name: getattr(first, f.name)
        for f in dataclasses.fields(converted)
        if f.init and not hasattr(ours, f.name) and hasattr(first, f.name)
    }
    return dataclasses.replace(converted, **carried) if carried else converted
