"""What a plan costs and holds: bytes per block and per request, the usable memory and the check that a request
fits it, the longest context that fits, and the concurrency a config allows (compiled with the planner).

Units: memory in bytes, lengths in tokens, blocks in blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvspec.contracts.spec import SchedulerLimits
from kvspec.errors import (
    InsufficientKVCacheMemoryError,
    PlanningError,
)
from kvspec.intmath import cdiv
from kvspec.planning.config import (
    KVCacheConfig,
    KVCacheGroupSpec,
)
from kvspec.specs.uniform import UniformTypeKVCacheSpecs

GiB = 1 << 30


CONSERVING_MEMORY_HINT = (
    "Give the KV cache more memory (a larger budget or gpu_memory_utilization), or lower max_model_len."
)


def format_gib(num_bytes: int) -> str:
    return f"{num_bytes / GiB:.2f}"


def uniform_page_size(groups: Sequence[KVCacheGroupSpec]) -> int:
    pages = {g.kv_cache_spec.page_size_bytes for g in groups}
    if len(pages) != 1:
        raise PlanningError(
            f"KV cache groups must share one page size to share tensors, got {sorted(pages)}."
        )
    return pages.pop()


def group_bytes_per_request(group: KVCacheGroupSpec, limits: SchedulerLimits) -> int:
    """Bytes one request of ``limits.max_model_len`` tokens needs in the group's layers: each layer's own
    bound (a uniform-type group's spec covers every layer of it already, so it is never multiplied)."""
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return sum(s.max_memory_usage_bytes(limits) for s in spec.kv_cache_specs.values())
    return len(group.layer_names) * spec.max_memory_usage_bytes(limits)


def is_packed_layout(groups: Sequence[KVCacheGroupSpec]) -> bool:
    """Whether ``groups`` came from packing (``packed_kv_cache_groups``): several groups, some of them
    uniform-type. Their pages then lie side by side in one block strided by the widest group, instead of
    every group sharing one page size across per-layer tensors."""
    return len(groups) > 1 and any(isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs) for g in groups)


def group_block_bytes(group: KVCacheGroupSpec) -> int:
    """The bytes one block id takes in ``group``'s layers: a page of each."""
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.page_size_bytes
    return len(group.layer_names) * spec.page_size_bytes


def group_blocks_per_request(group: KVCacheGroupSpec, limits: SchedulerLimits) -> int:
    """Blocks one request of ``limits.max_model_len`` tokens takes in ``group`` (a uniform-type group: its
    hungriest layer's, since all its layers share the block ids)."""
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.max_memory_usage_pages(limits)
    return cdiv(spec.max_memory_usage_bytes(limits), spec.page_size_bytes)


def blocks_per_request(groups: Sequence[KVCacheGroupSpec], limits: SchedulerLimits) -> int:
    """Block ids one request of ``limits.max_model_len`` tokens holds at most, over every group (each group
    takes its own ids from the shared pool)."""
    return sum(group_blocks_per_request(g, limits) for g in groups)


def max_memory_usage_bytes_from_groups(groups: Sequence[KVCacheGroupSpec], limits: SchedulerLimits) -> int:
    """Bytes one request of ``limits.max_model_len`` tokens needs, padding layers of short groups counted
    (packed groups: the blocks every group takes, each costing the widest group's bytes)."""
    if not groups:
        return 0
    if len(groups) == 1 and isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs):
        return group_bytes_per_request(groups[0], limits)
    if is_packed_layout(groups):
        return bytes_per_block(groups) * sum(group_blocks_per_request(g, limits) for g in groups)
    group_size = max(len(g.layer_names) for g in groups)
    page = uniform_page_size(groups)
    blocks = sum(cdiv(g.kv_cache_spec.max_memory_usage_bytes(limits), page) for g in groups)
    return group_size * page * blocks


def bytes_per_block(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Bytes one block id costs across all tensors of the layout (packed groups: the widest group's)."""
    if not groups:
        return 0
    if len(groups) == 1 and isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs):
        return groups[0].kv_cache_spec.page_size_bytes
    if is_packed_layout(groups):
        return max(group_block_bytes(g) for g in groups)
    return uniform_page_size(groups) * max(len(g.layer_names) for g in groups)


def placed_usage_bytes(
    groups: Sequence[KVCacheGroupSpec], limits: SchedulerLimits, block_bytes: int | None = None
) -> int:
    """Bytes one request of ``limits.max_model_len`` tokens takes: ``max_memory_usage_bytes_from_groups``
    under kvspec's layout, or with ``block_bytes`` (what one block costs under the engine's placement) the
    blocks it needs times that cost."""
    usage = max_memory_usage_bytes_from_groups(groups, limits)
    if block_bytes is None or not groups:
        return usage
    return cdiv(usage, bytes_per_block(groups)) * block_bytes


def estimate_max_model_len(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    limits: SchedulerLimits,
    block_bytes: int | None = None,
) -> int:
    """The largest max_model_len (<= limits.max_model_len) whose one request fits; 0 if none does
    (``block_bytes``: see ``placed_usage_bytes``)."""

    def fits(length: int) -> bool:
        return (
            placed_usage_bytes(groups, dataclasses.replace(limits, max_model_len=length), block_bytes)
            <= available_memory
        )

    lo, hi = 0, limits.max_model_len
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def usable_bytes(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    reserve_null_block: bool,
    block_bytes: int | None = None,
) -> int:
    """The bytes of ``available_memory`` requests can use: with ``reserve_null_block`` one block less (the
    pool holds block 0 back as the null block for its lifetime; vLLM 0.34 plans its checks and auto-fit
    against the usable blocks, ``vllm/v1/core/kv_cache_planning.py``: ``get_kv_cache_configs`` (0.34.0)). The blocks allocated still come from all of it. ``block_bytes``:
    what one block costs under the engine's placement (None: ``bytes_per_block(groups)``)."""
    if not reserve_null_block or not groups:
        return available_memory
    return available_memory - (bytes_per_block(groups) if block_bytes is None else block_bytes)


def check_enough_kv_cache_memory(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    limits: SchedulerLimits,
    *,
    worker: str = "",
    block_bytes: int | None = None,
) -> None:
    """Raise InsufficientKVCacheMemoryError (with needed, available and the max_model_len that would fit)
    unless one request of ``limits.max_model_len`` tokens fits in ``available_memory`` bytes
    (``block_bytes``: see ``placed_usage_bytes``)."""
    if not groups:
        return
    where = f" on {worker}" if worker else ""
    needed = placed_usage_bytes(groups, limits, block_bytes)
    if available_memory <= 0:
        raise InsufficientKVCacheMemoryError(
            f"No available memory for the cache blocks{where} ({available_memory} bytes). {CONSERVING_MEMORY_HINT}",
            needed_bytes=needed,
            available_bytes=available_memory,
            max_model_len=limits.max_model_len,
            estimated_max_model_len=0,
        )
    if needed > available_memory:
        estimate = estimate_max_model_len(groups, available_memory, limits, block_bytes)
        estimated_msg = (
            f"Based on the available memory, the estimated maximum model length is {estimate}. "
            if estimate > 0
            else "Not even one token fits. "
        )
        raise InsufficientKVCacheMemoryError(
            f"To serve at least one request with the model's max seq len ({limits.max_model_len}), "
            f"{format_gib(needed)} GiB KV cache is needed{where}, which is larger than the available KV cache "
            f"memory ({format_gib(available_memory)} GiB). {estimated_msg}{CONSERVING_MEMORY_HINT}",
            needed_bytes=needed,
            available_bytes=available_memory,
            max_model_len=limits.max_model_len,
            estimated_max_model_len=estimate,
        )


def get_max_concurrency(config: KVCacheConfig, limits: SchedulerLimits) -> float:
    """How many requests of ``limits.max_model_len`` tokens fit in ``config`` at once."""
    groups = config.kv_cache_groups
    if not groups:
        return float("inf")
    if is_packed_layout(groups):
        return config.num_blocks / sum(group_blocks_per_request(g, limits) for g in groups)
    layers = max(len(g.layer_names) for g in groups)
    per_request = layers * sum(g.kv_cache_spec.max_memory_usage_bytes(limits) for g in groups)
    per_block = groups[0].kv_cache_spec.page_size_bytes * layers
    return config.num_blocks / cdiv(per_request, per_block)
