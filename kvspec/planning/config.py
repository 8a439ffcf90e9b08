"""The KV cache layout a planner produces and the coordinator and workers consume."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.contracts.spec import KVCacheSpec
from kvspec.contracts.traits import traits_of
from kvspec.errors import PlanningError
from kvspec.specs.uniform import UniformTypeKVCacheSpecs


@dataclass(frozen=True, kw_only=True, slots=True)
class KVCacheTensor:
    """One device buffer of ``size`` bytes; every layer in ``shared_by`` aliases it.

    Layers of different groups may share a buffer: their block ids come from one pool, so they never
    write the same block. Without ``block_stride`` each layer's pages lie back to back from byte 0 (block
    ``b`` at ``b * page``). A packed buffer (``block_stride`` set) holds blocks of ``block_stride`` bytes, and
    layer ``shared_by[i]``'s page of block ``b`` starts at ``b * block_stride + offsets[i]``.
    """

    size: int
    shared_by: tuple[str, ...]
    block_stride: int | None = None
    offsets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.block_stride is None and self.offsets:
            raise PlanningError("KVCacheTensor.offsets place pages within a block; set block_stride too.")
        if self.block_stride is not None and len(self.offsets) != len(self.shared_by):
            raise PlanningError(
                f"A packed KVCacheTensor needs one offset per layer: {len(self.shared_by)} layers, "
                f"{len(self.offsets)} offsets."
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class KVCacheGroupSpec:
    """Layers that share one block table (same spec, or a uniform-type spec of them)."""

    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec
    is_eagle_group: bool = False
    #: vLLM 0.34's group role: a role with a registered manager (``Registry.register_role_manager``) runs
    #: this group with that manager. None: the spec's manager.
    role: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class KVCacheConfig:
    """``num_blocks`` blocks per layer; ``kv_cache_tensors`` back them; ``kv_cache_groups`` run them.

    An attention-free model has no groups or tensors and one block (the pool's null block).
    """

    num_blocks: int
    kv_cache_tensors: tuple[KVCacheTensor, ...]
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    #: The prefix-cache retention the planner chose (tokens; None: dense, every full block cached), as vLLM
    #: 0.34's planner writes it (``PlanningRules.prefix_cache_retention_interval``: 0 under 0.34, None under
    #: 0.23). A coordinator built from the config runs it unless told otherwise. A config built by hand keeps
    #: the default None, as vLLM's dataclass does.
    prefix_cache_retention_interval: int | None = None
    #: The name of the release profile whose planning rules planned this config (``ReleaseProfile.name``;
    #: None: built by hand or converted from an engine's own plan). A coordinator running another release's
    #: rules refuses it (``ReleaseMismatchError``): the run would reproduce neither release.
    release: str | None = None

    @property
    def has_mamba_layers(self) -> bool:
        """Some group holds layers whose declared kind is "mamba" (a uniform group: any of its layers)."""
        return any(traits_of(s).kind == "mamba" for g in self.kv_cache_groups for s in _layer_specs(g))

    @property
    def needs_kv_cache_zeroing(self) -> bool:
        """Some layer declares ``needs_zeroed_buffers`` (Mamba: states are read before they are written)."""
        return any(traits_of(s).needs_zeroed_buffers for g in self.kv_cache_groups for s in _layer_specs(g))

    @property
    def total_bytes(self) -> int:
        return sum(t.size for t in self.kv_cache_tensors)


def _layer_specs(group: KVCacheGroupSpec) -> list[KVCacheSpec]:
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return list(spec.kv_cache_specs.values())
    return [spec]


def scheduler_spec(spec: KVCacheSpec) -> KVCacheSpec:
    """The spec the scheduler sees for a group: a uniform-type group is run by its first layer's spec."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.representative_spec()
    return spec


@dataclass(frozen=True, kw_only=True)
class WorkerBudgets:
    """What one plan knows of each worker (tensor- or pipeline-parallel rank), in worker order.

    - ``worker_groups``: each worker's projection of the global groups (``project_groups_to_worker``);
    - ``available_bytes``: the memory each worker has for its KV cache;
    - ``num_blocks_override``: every worker gets this many blocks, whatever its memory (the memory its
      blocks take is then what the checks see);
    - ``reserve_null_block``: one max-length request must fit beside the null block (vLLM 0.32 and 0.34;
      the planner sets it from ``PlanningRules.reserve_null_block``);
    - ``block_bytes``: what one block costs each worker under the engine's tensor placement (an aligned or
      padded layout); None: kvspec's layout (``bytes_per_block``).
    """

    worker_groups: Sequence[Sequence[KVCacheGroupSpec]]
    available_bytes: Sequence[int]
    num_blocks_override: int | None = None
    reserve_null_block: bool = False
    block_bytes: Sequence[int] | None = None

    def __post_init__(self) -> None:
        counts = {len(self.worker_groups), len(self.available_bytes)}
        if self.block_bytes is not None:
            counts.add(len(self.block_bytes))
        if len(counts) != 1:
            raise PlanningError(
                f"Got groups for {len(self.worker_groups)} workers, memory for {len(self.available_bytes)}"
                + ("" if self.block_bytes is None else f" and block bytes for {len(self.block_bytes)}")
                + "; give one of each per worker."
            )
