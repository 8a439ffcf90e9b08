"""Memory planning: group layers, unify page sizes, and turn a byte budget into blocks per worker.

Units: memory in bytes, lengths in tokens, ``num_blocks`` in blocks (each block is one page in every
layer of every group). Inputs are never mutated; every function returns new values.

Grouping (vLLM 0.23 rules):
1. hybrid disabled -> windowed layers are converted to full attention first;
2. all specs merge into one -> one group;
3. one uniform type with different shapes -> one group of a ``UniformTypeKVCacheSpecs``;
4. otherwise (hybrid) -> page sizes are unified by scaling block sizes, layers are bucketed by equal
   spec, and buckets are split into groups of ``group_size`` layers with a stride (so pipeline stages
   balance); hidden-state layers each get a group of their own.

Which release's rules apply is one argument, ``profile`` (a ``ReleaseProfile``; None: ``DEFAULT_PROFILE``,
the current vLLM release), read through its ``planning`` section: under vLLM 0.32+ pages that cannot scale
are padded, pages that cannot be unified beside MLA fall back to one full-allocation group, and the null
block is held back from the memory checks; every planned ``KVCacheConfig`` carries the profile's
prefix-cache retention, which the coordinator then runs. ``profile=VLLM_0_23`` plans as vLLM 0.23.0 does; a
mix of behaviours is a derived profile (``VLLM_0_34.derive(pad_pages=False)``).
``pack_pages`` picks a block-outermost tensor layout (pages of several sizes side by side in one block).

The functions are :mod:`kvspec.planning._core`'s (compiled in the compiled build); the public entry
points that check their arguments with beartype are defined here, in plain Python, around them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvspec.contracts.checking import check_door
from kvspec.contracts.release import ReleaseProfile
from kvspec.contracts.spec import KVCacheSpec, SchedulerLimits
from kvspec.planning import _core
from kvspec.planning._core import (
    auto_fit_from_groups,
    check_layer_values,
    draft_groups_unidentified,
    full_allocation_groups,
    generate_scheduler_kv_cache_config,
    is_kv_cache_spec_uniform,
    make_uniform_type_specs,
    mark_eagle_groups,
    merge_worker_specs,
    plan_num_blocks,
    project_groups_to_worker,
    unify_hybrid_kv_cache_specs,
    unify_kv_cache_spec_page_size,
)
from kvspec.planning.config import KVCacheConfig, KVCacheGroupSpec, WorkerBudgets
from kvspec.planning.packing import (
    packed_kv_cache_groups,
)
from kvspec.planning.sizing import (
    CONSERVING_MEMORY_HINT,
    GiB,
    blocks_per_request,
    bytes_per_block,
    check_enough_kv_cache_memory,
    estimate_max_model_len,
    format_gib,
    get_max_concurrency,
    group_bytes_per_request,
    is_packed_layout,
    max_memory_usage_bytes_from_groups,
    usable_bytes,
)
from kvspec.registry.core import AnyRegistry

__all__ = [
    "CONSERVING_MEMORY_HINT",
    "GiB",
    "WorkerBudgets",
    "add_kv_sharing_layers",
    "auto_fit_from_groups",
    "auto_fit_max_model_len",
    "blocks_per_request",
    "bytes_per_block",
    "check_enough_kv_cache_memory",
    "check_layer_values",
    "draft_groups_unidentified",
    "estimate_max_model_len",
    "format_gib",
    "full_allocation_groups",
    "generate_scheduler_kv_cache_config",
    "get_kv_cache_config",
    "get_kv_cache_config_from_groups",
    "get_kv_cache_configs",
    "get_kv_cache_groups",
    "get_max_concurrency",
    "group_bytes_per_request",
    "is_kv_cache_spec_uniform",
    "is_packed_layout",
    "make_uniform_type_specs",
    "mark_eagle_groups",
    "max_memory_usage_bytes_from_groups",
    "merge_worker_specs",
    "packed_kv_cache_groups",
    "plan_num_blocks",
    "project_groups_to_worker",
    "unify_hybrid_kv_cache_specs",
    "unify_kv_cache_spec_page_size",
    "usable_bytes",
]


@check_door(_core.get_kv_cache_groups)
def get_kv_cache_groups(
    layer_specs: Mapping[str, KVCacheSpec],
    *,
    hybrid: bool = True,
    registry: AnyRegistry | None = None,
    profile: ReleaseProfile | None = None,
    pack_pages: bool = False,
) -> list[KVCacheGroupSpec]:
    """Split layers into KV cache groups (each group shares one block table).

    Layers whose traits declare ``own_group`` (hidden-state caches) get one group each, resized to the
    common page by their ``with_page_size``. ``profile`` (None: ``DEFAULT_PROFILE``) picks the release's
    rules (``ReleaseProfile.planning``): where it pads pages (vLLM 0.32 and 0.34) a ``page_paddable`` layer
    whose block cannot scale to the common page is padded to it (see ``unify_kv_cache_spec_page_size``), and
    an ``own_group`` layer's block is the largest that fits the page and divides the other groups' blocks (a
    hit stays whole in its blocks); where it falls back to full allocation (vLLM 0.32+), pages that cannot be
    unified beside a latent (MLA) layer put every layer in one uniform-type group, the sliding windows
    allocated as full attention (``full_allocation_groups``), instead of the PageSizeUnificationError.

    ``pack_pages`` (a block-outermost layout, where a block holds a page of every layer of its group side by
    side): layers of several page sizes are packed into groups instead of unified
    (``packed_kv_cache_groups``); the block then costs the widest group's bytes.
    """
    return _core.get_kv_cache_groups(
        layer_specs,
        hybrid=hybrid,
        registry=registry,
        profile=profile,
        pack_pages=pack_pages,
    )


@check_door(_core.get_kv_cache_config_from_groups)
def get_kv_cache_config_from_groups(
    groups: Sequence[KVCacheGroupSpec], available_memory: int, *, num_blocks_override: int | None = None
) -> KVCacheConfig:
    """Tensors and block count for ``groups`` in ``available_memory`` bytes."""
    return _core.get_kv_cache_config_from_groups(
        groups, available_memory, num_blocks_override=num_blocks_override
    )


@check_door(_core.get_kv_cache_configs)
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
    """One KVCacheConfig per worker (tensor- or pipeline-parallel), all with the same block count.

    The smallest block count over the workers wins (every worker must hold the same block ids); each
    worker's tensors are shrunk to it. With ``num_blocks_override`` every worker gets that many blocks.
    Raises InsufficientKVCacheMemoryError naming the worker that cannot hold one max-length request; under a
    profile that reserves the null block (vLLM 0.32 and 0.34, ``PlanningRules.reserve_null_block``) that
    request must fit in the blocks left beside the null block, which the pool holds back for its lifetime.
    Each config carries the profile's ``prefix_cache_retention_interval`` (0 under 0.34: sparse retention;
    None under 0.23: dense), which ``KVCacheCoordinator`` runs. ``profile`` (None: ``DEFAULT_PROFILE``):
    the release whose planning rules apply, as in :func:`get_kv_cache_groups`.
    """
    return _core.get_kv_cache_configs(
        per_worker_specs,
        per_worker_available_bytes,
        limits,
        num_blocks_override=num_blocks_override,
        hybrid=hybrid,
        registry=registry,
        profile=profile,
        pack_pages=pack_pages,
    )


@check_door(_core.add_kv_sharing_layers)
def add_kv_sharing_layers(
    kv_cache_groups: Sequence[KVCacheGroupSpec], shared_kv_cache_layers: Mapping[str, str]
) -> tuple[KVCacheGroupSpec, ...]:
    """The groups with every KV-sharing layer added to its target layer's group.

    ``shared_kv_cache_layers`` maps a layer that allocates no KV cache of its own to the layer whose cache
    it reads (cross-layer KV sharing); the sharing layer joins that group's ``layer_names`` (after the
    group's own layers, in mapping order) so workers give it the group's block table. Blocks and page
    sizes do not change. A target in no group, a target that itself shares, or a sharing layer that
    already has a group is a PlanningError (nothing is returned half-done: the groups are values).
    """
    return _core.add_kv_sharing_layers(kv_cache_groups, shared_kv_cache_layers)


@check_door(_core.get_kv_cache_config)
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
    """The layout for a single worker (see :func:`get_kv_cache_configs`)."""
    return _core.get_kv_cache_config(
        layer_specs,
        available_memory,
        limits,
        num_blocks_override=num_blocks_override,
        hybrid=hybrid,
        registry=registry,
        profile=profile,
        pack_pages=pack_pages,
    )


@check_door(_core.auto_fit_max_model_len)
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
    """The largest max_model_len every worker can serve one request of (vLLM's max_model_len=-1); under a
    profile that reserves the null block (vLLM 0.32 and 0.34; None: the default profile) in the blocks left
    beside it."""
    return _core.auto_fit_max_model_len(
        per_worker_specs,
        per_worker_available_bytes,
        limits,
        hybrid=hybrid,
        registry=registry,
        profile=profile,
        pack_pages=pack_pages,
    )
