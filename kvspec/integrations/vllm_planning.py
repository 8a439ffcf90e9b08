"""kvspec's planner behind vLLM 0.23.0's ``kv_cache_utils`` planning functions (``vllm_config`` forms).

Each function takes what vLLM's does (a ``VllmConfig``, vLLM spec dicts, vLLM ``KVCacheConfig``s), converts
it (``SchedulerLimits`` from the config; specs by class name), lets ``kvspec.planning`` decide, and returns
vLLM's objects. ``get_kv_cache_configs`` also does what vLLM's does to the config: with
``max_model_len == -1`` (auto-fit) it writes the fitted length back into ``model_config.max_model_len``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from kvspec import planning
from kvspec.contracts.release import VLLM_0_23
from kvspec.contracts.spec import SchedulerLimits
from kvspec.errors import (
    ConflictingLayerSpecError,
    PageSizeUnificationError,
    VllmConflictingLayerSpecError,
    VllmPageSizeUnificationError,
)
from kvspec.integrations.vllm import SpecConverter, as_kvspec, to_kvspec_layers, to_vllm
from kvspec.planning.config import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvspec.registry.core import AnyRegistry

__all__ = [
    "config_from_vllm",
    "config_to_vllm",
    "estimate_max_model_len",
    "generate_scheduler_kv_cache_config",
    "get_kv_cache_configs",
    "get_max_concurrency_for_kv_cache_config",
    "group_from_vllm",
    "is_kv_cache_spec_uniform",
    "limits_from_vllm_config",
    "project_kv_cache_groups_to_worker",
    "unify_hybrid_kv_cache_specs",
    "uses_hybrid_manager",
]


def limits_from_vllm_config(vllm_config: Any, max_model_len: int | None = None) -> SchedulerLimits:
    """kvspec's limits from the parts of vLLM's config that size the KV cache."""
    model_len = vllm_config.model_config.max_model_len if max_model_len is None else max_model_len
    scheduler = vllm_config.scheduler_config
    parallel = vllm_config.parallel_config
    return SchedulerLimits(
        max_model_len=model_len,
        max_num_batched_tokens=getattr(scheduler, "max_num_batched_tokens", None) or None,
        decode_context_parallel_size=getattr(parallel, "decode_context_parallel_size", 1),
        prefill_context_parallel_size=getattr(parallel, "prefill_context_parallel_size", 1),
        mamba_cache_mode=getattr(vllm_config.cache_config, "mamba_cache_mode", "none"),
    )


def config_to_vllm(config: KVCacheConfig) -> Any:
    """vLLM's ``KVCacheConfig`` for kvspec's (lists where vLLM has lists, vLLM's spec objects)."""
    iface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    return iface.KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_tensors=[
            _tensor_to_vllm(iface, t.size, list(t.shared_by), config.num_blocks)
            for t in config.kv_cache_tensors
        ],
        kv_cache_groups=[
            iface.KVCacheGroupSpec(list(g.layer_names), to_vllm(g.kv_cache_spec), g.is_eagle_group)
            for g in config.kv_cache_groups
        ],
    )


def _tensor_to_vllm(iface: Any, size: int, layers: list[str], num_blocks: int) -> Any:
    """vLLM's ``KVCacheTensor``. 0.23 lists the layers sharing the tensor (``shared_by``); 0.34 places layers
    by strides: kvspec's layers share the whole tensor (one per group, overlaid: a block id belongs to one
    group at a time), so each starts at byte 0 (layer stride 0) with one page per block."""
    names = {f.name for f in dataclasses.fields(iface.KVCacheTensor)}
    if "shared_by" in names:
        return iface.KVCacheTensor(size=size, shared_by=layers)
    return iface.KVCacheTensor(
        size=size, layers=layers, layer_stride=0, block_stride=size // max(num_blocks, 1)
    )


def config_from_vllm(
    config: Any, *, spec_converter: SpecConverter | None = None, registry: AnyRegistry | None = None
) -> KVCacheConfig:
    """kvspec's ``KVCacheConfig`` for vLLM's (same blocks, tensors, groups; vLLM-side specs converted by
    ``kvspec.integrations.vllm.as_kvspec``, a plugin's through ``spec_converter`` or its registered
    ``vllm_counterpart``)."""
    return KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_tensors=tuple(
            # vLLM 0.34 names the layers of a tensor ``layers`` (0.23: ``shared_by``).
            KVCacheTensor(size=t.size, shared_by=tuple(getattr(t, "shared_by", None) or t.layers))
            for t in config.kv_cache_tensors
        ),
        kv_cache_groups=tuple(
            group_from_vllm(g, spec_converter=spec_converter, registry=registry)
            for g in config.kv_cache_groups
        ),
    )


def group_from_vllm(
    group: Any, *, spec_converter: SpecConverter | None = None, registry: AnyRegistry | None = None
) -> KVCacheGroupSpec:
    """kvspec's ``KVCacheGroupSpec`` for vLLM's (its spec through ``as_kvspec``; 0.34's role by value)."""
    return KVCacheGroupSpec(
        layer_names=tuple(group.layer_names),
        kv_cache_spec=as_kvspec(group.kv_cache_spec, converter=spec_converter, registry=registry),
        is_eagle_group=bool(getattr(group, "is_eagle_group", False)),
        role=_role(getattr(group, "role", None)),
    )


def _role(role: Any) -> str | None:
    """vLLM 0.34's ``KVCacheGroupRole`` (a str enum) as its value; None without one."""
    if role is None:
        return None
    return str(getattr(role, "value", role))


def uses_hybrid_manager(vllm_config: Any) -> bool:
    """Whether vLLM's hybrid KV cache manager is on (windowed layers keep their own groups)."""
    return not getattr(vllm_config.scheduler_config, "disable_hybrid_kv_cache_manager", False)


def get_kv_cache_configs(
    vllm_config: Any, kv_cache_specs: Sequence[Mapping[str, Any]], available_memory: Sequence[int]
) -> list[Any]:
    """vLLM's ``get_kv_cache_configs``: one config per worker, decided by ``kvspec.planning``."""
    specs = [to_kvspec_layers(worker) for worker in kv_cache_specs]
    model_config = vllm_config.model_config
    hybrid = uses_hybrid_manager(vllm_config)
    override = vllm_config.cache_config.num_gpu_blocks_override
    if getattr(model_config, "original_max_model_len", None) == -1:
        memory = list(available_memory)
        if override is not None:  # as vLLM: the override's bytes are what is fitted into
            groups = planning.get_kv_cache_groups(
                planning.merge_worker_specs(specs), hybrid=hybrid, profile=VLLM_0_23
            )
            for i, worker in enumerate(specs):
                projected = [g for g in planning.project_groups_to_worker(groups, worker) if g.layer_names]
                if projected:
                    memory[i] = override * planning.bytes_per_block(projected)
        model_config.max_model_len = planning.auto_fit_max_model_len(
            specs, memory, limits_from_vllm_config(vllm_config), hybrid=hybrid, profile=VLLM_0_23
        )
    try:
        configs = planning.get_kv_cache_configs(
            specs,
            list(available_memory),
            limits_from_vllm_config(vllm_config),
            num_blocks_override=override,
            hybrid=hybrid,
            profile=VLLM_0_23,
        )
    except ConflictingLayerSpecError as exc:
        raise VllmConflictingLayerSpecError(str(exc)) from exc
    except PageSizeUnificationError as exc:
        raise VllmPageSizeUnificationError(str(exc)) from exc
    return [config_to_vllm(c) for c in configs]


def estimate_max_model_len(vllm_config: Any, kv_cache_spec: Mapping[str, Any], available_memory: int) -> int:
    specs = to_kvspec_layers(kv_cache_spec)
    groups = planning.get_kv_cache_groups(specs, hybrid=uses_hybrid_manager(vllm_config), profile=VLLM_0_23)
    return planning.estimate_max_model_len(groups, available_memory, limits_from_vllm_config(vllm_config))


def get_max_concurrency_for_kv_cache_config(vllm_config: Any, kv_cache_config: Any) -> float:
    return planning.get_max_concurrency(
        config_from_vllm(kv_cache_config), limits_from_vllm_config(vllm_config)
    )


def generate_scheduler_kv_cache_config(kv_cache_configs: Sequence[Any]) -> Any:
    return config_to_vllm(
        planning.generate_scheduler_kv_cache_config([config_from_vllm(c) for c in kv_cache_configs])
    )


def is_kv_cache_spec_uniform(kv_cache_spec: Mapping[str, Any]) -> bool:
    return planning.is_kv_cache_spec_uniform(to_kvspec_layers(kv_cache_spec))


def unify_hybrid_kv_cache_specs(kv_cache_spec: dict[str, Any]) -> None:
    """vLLM's form mutates the dict: each layer's spec is replaced by kvspec's unified one (as vLLM's)."""
    unified = planning.unify_hybrid_kv_cache_specs(to_kvspec_layers(kv_cache_spec))
    for layer, spec in unified.items():
        kv_cache_spec[layer] = to_vllm(spec)


def project_kv_cache_groups_to_worker(
    global_kv_cache_groups: Sequence[Any], worker_spec: Mapping[str, Any]
) -> list[Any]:
    """vLLM's ``_project_kv_cache_groups_to_worker``: a worker's share of the global groups (kvspec
    decides). A group whose spec kvspec leaves as it was keeps the caller's own spec object."""
    iface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    ours = [
        KVCacheGroupSpec(
            layer_names=tuple(g.layer_names),
            kv_cache_spec=as_kvspec(g.kv_cache_spec),
            is_eagle_group=bool(getattr(g, "is_eagle_group", False)),
        )
        for g in global_kv_cache_groups
    ]
    projected = planning.project_groups_to_worker(ours, worker_spec)
    out = []
    for theirs, mine, result in zip(global_kv_cache_groups, ours, projected, strict=True):
        spec = (
            theirs.kv_cache_spec
            if result.kv_cache_spec == mine.kv_cache_spec
            else to_vllm(result.kv_cache_spec)
        )
        out.append(iface.KVCacheGroupSpec(list(result.layer_names), spec, result.is_eagle_group))
    return out
