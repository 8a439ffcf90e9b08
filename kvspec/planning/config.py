"""The KV cache layout a planner produces and the coordinator and workers consume."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.contracts.spec import KVCacheSpec
from kvspec.contracts.traits import traits_of
from kvspec.specs.uniform import UniformTypeKVCacheSpecs


@dataclass(frozen=True, kw_only=True, slots=True)
class KVCacheTensor:
    """One device buffer of ``size`` bytes; every layer in ``shared_by`` aliases it.

    Layers of different groups may share a buffer: their block ids come from one pool, so they never
    write the same block.
    """

    size: int
    shared_by: tuple[str, ...]


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
