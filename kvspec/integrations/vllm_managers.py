"""kvspec's single-type managers with vLLM 0.23.0's constructor and hit-search signatures.

vLLM builds a manager as ``SlidingWindowManager(kv_cache_spec, block_pool, enable_caching=...,
kv_cache_group_id=..., dcp_world_size=..., pcp_world_size=..., scheduler_block_size=...,
max_admission_blocks_per_request=..., use_eagle=...)`` and searches hits with the 9-parameter classmethod
``find_longest_cache_hit(block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
drop_eagle_block, alignment_tokens, dcp_world_size, pcp_world_size)``. ``vllm_style(ManagerCls)`` gives a
class taking those forms and running kvspec's manager underneath (one ``ManagerContext``, one ``HitQuery``):
code written against vLLM's manager API (a test, a tool) runs on kvspec's managers. Spec arguments may be
vLLM's or kvspec's objects; vLLM's are converted by class name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from kvspec.blocks.pool import BlockPool, KVCacheBlock
from kvspec.contracts.manager import HitQuery, ManagerContext
from kvspec.contracts.traits import traits_of
from kvspec.integrations.vllm import as_kvspec
from kvspec.managers.base import SingleTypeKVCacheManager

__all__ = ["VLLM_STATE_NAMES", "VllmManagerView", "VllmStyleManager", "vllm_style"]


class VllmStyleManager:
    """A kvspec manager behind vLLM's constructor; every other attribute is the kvspec manager's."""

    kvspec_manager_cls: ClassVar[type[SingleTypeKVCacheManager]]

    def __init__(
        self,
        kv_cache_spec: Any,
        block_pool: BlockPool,
        enable_caching: bool = True,
        kv_cache_group_id: int = 0,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        scheduler_block_size: int | None = None,
        max_admission_blocks_per_request: int | None = None,
        use_eagle: bool = False,
        metrics_collector: Any = None,
    ) -> None:
        spec = as_kvspec(kv_cache_spec)
        context = ManagerContext(
            kv_cache_spec=spec,
            traits=traits_of(spec),
            block_pool=block_pool,
            kv_cache_group_id=kv_cache_group_id,
            scheduler_block_size=spec.block_size if scheduler_block_size is None else scheduler_block_size,
            enable_caching=enable_caching,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            max_admission_blocks_per_request=max_admission_blocks_per_request,
            use_eagle=use_eagle,
        )
        object.__setattr__(self, "kvspec_manager", self.kvspec_manager_cls(context))

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: Any,
        drop_eagle_block: bool = False,
        alignment_tokens: int | None = None,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[KVCacheBlock], ...]:
        spec = as_kvspec(kv_cache_spec)
        query = HitQuery(
            block_hashes=block_hashes,
            max_length=max_length,
            kv_cache_group_ids=tuple(kv_cache_group_ids),
            block_pool=block_pool,
            kv_cache_spec=spec,
            traits=traits_of(spec),
            use_eagle=drop_eagle_block,
            alignment_tokens=spec.block_size if alignment_tokens is None else alignment_tokens,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
        )
        return cls.kvspec_manager_cls.find_longest_cache_hit(query).blocks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kvspec_manager, VLLM_STATE_NAMES.get(name, name))

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.kvspec_manager, VLLM_STATE_NAMES.get(name, name), value)


#: vLLM's public names for a manager's per-request state -> kvspec's private fields (vLLM's tests read and
#: write them; kvspec's plugins go through get_blocks / num_cached_blocks instead).
VLLM_STATE_NAMES: dict[str, str] = {
    "req_to_blocks": "_req_to_blocks",
    "num_cached_block": "_num_cached_block",
    "new_block_ids": "_new_block_ids",
}


_CONTEXT_NAMES = frozenset({"dcp_world_size", "pcp_world_size", "max_model_len"})


class VllmManagerView:
    """One of kvspec's managers as vLLM's coordinator lists it (``single_type_managers``): every attribute is
    the manager's, vLLM's state names included, and ``isinstance`` sees the manager's class; its
    ``kv_cache_spec`` is vLLM's spec of the group when given (vLLM code type-checks it)."""

    __slots__ = ("_manager", "_vllm_spec")

    def __init__(self, manager: object, vllm_spec: object = None) -> None:
        object.__setattr__(self, "_manager", manager)
        object.__setattr__(self, "_vllm_spec", vllm_spec)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(view, SlidingWindowManager) answers for the manager
        return type(self._manager)

    def __getattr__(self, name: str) -> Any:
        if name in _CONTEXT_NAMES:  # settings vLLM keeps on the manager, kvspec on its context
            return getattr(self._manager.context, name)
        if name == "kv_cache_spec" and self._vllm_spec is not None:
            return self._vllm_spec
        return getattr(self._manager, VLLM_STATE_NAMES.get(name, name))

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._manager, VLLM_STATE_NAMES.get(name, name), value)


_cache: dict[type[SingleTypeKVCacheManager], type[VllmStyleManager]] = {}


def vllm_style(manager_cls: type[SingleTypeKVCacheManager]) -> type[VllmStyleManager]:
    """The ``VllmStyleManager`` class over ``manager_cls`` (one per manager class, named like it)."""
    adapted = _cache.get(manager_cls)
    if adapted is None:
        adapted = type(manager_cls.__name__, (VllmStyleManager,), {"kvspec_manager_cls": manager_cls})
        adapted.__qualname__ = f"vllm_style({manager_cls.__qualname__})"
        _cache[manager_cls] = adapted
    return adapted
