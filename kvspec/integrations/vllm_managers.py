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

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, cast, overload

from kvspec.blocks.hashing import BlockHashListWithBlockSize
from kvspec.blocks.pool import BlockPool, KVCacheBlock
from kvspec.contracts.manager import HitQuery, ManagerContext
from kvspec.contracts.release import VLLM_0_34
from kvspec.contracts.traits import block_tokens_of, traits_of
from kvspec.integrations.vllm import as_kvspec
from kvspec.integrations.vllm_facades import zeroed_by_vllm_034
from kvspec.integrations.vllm_names import VLLM_STATE_NAMES, VllmManagerView
from kvspec.integrations.vllm_request_view import as_kvspec_request
from kvspec.managers.base import SingleTypeKVCacheManager

__all__ = ["VLLM_STATE_NAMES", "Vllm034StyleManager", "VllmManagerView", "VllmStyleManager", "vllm_style"]


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
        self._start(
            kv_cache_spec,
            block_pool,
            kv_cache_group_id,
            scheduler_block_size,
            enable_caching=enable_caching,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            max_admission_blocks_per_request=max_admission_blocks_per_request,
            use_eagle=use_eagle,
        )

    def _start(
        self,
        kv_cache_spec: Any,
        block_pool: BlockPool,
        kv_cache_group_id: int,
        scheduler_block_size: int | None,
        **settings: Any,
    ) -> None:
        """Build the kvspec manager over one ``ManagerContext`` (``settings``: its other fields)."""
        spec = as_kvspec(kv_cache_spec)
        context = ManagerContext(
            kv_cache_spec=spec,
            traits=traits_of(spec),
            block_pool=block_pool,
            kv_cache_group_id=kv_cache_group_id,
            scheduler_block_size=spec.block_size if scheduler_block_size is None else scheduler_block_size,
            **settings,
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
    ) -> tuple[Any, ...]:
        """vLLM 0.23's answer: one block list per group. A tuple of any shape, since 0.34's subclass answers
        ``(block lists, hit tokens)``, its release's shape."""
        query = _hit_query(
            block_hashes,
            max_length,
            kv_cache_group_ids,
            block_pool,
            as_kvspec(kv_cache_spec),
            drop_eagle_block,
            alignment_tokens,
            dcp_world_size,
            pcp_world_size,
        )
        return cls.kvspec_manager_cls.find_longest_cache_hit(query).blocks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kvspec_manager, VLLM_STATE_NAMES.get(name, name))

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.kvspec_manager, VLLM_STATE_NAMES.get(name, name), value)


class Vllm034StyleManager(VllmStyleManager):
    """A kvspec manager behind vLLM 0.34.0's constructor and the signatures 0.34 changed: the zeroing
    setting (``needs_kv_cache_zeroing``), the admission count's local-computed and prefill-end arguments, a
    per-call retention interval and replay boundaries in ``cache_blocks``, processed tokens in
    ``remove_skipped_blocks``, and a hit search that also returns the hit's length in tokens. The manager
    runs the ``VLLM_0_34`` profile."""

    def __init__(
        self,
        kv_cache_spec: Any,
        block_pool: BlockPool,
        enable_caching: bool = True,
        kv_cache_group_id: int = 0,
        scheduler_block_size: int | None = None,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        needs_kv_cache_zeroing: bool = False,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        self._start(
            kv_cache_spec,
            block_pool,
            kv_cache_group_id,
            scheduler_block_size,
            enable_caching=enable_caching,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            max_admission_blocks_per_request=max_admission_blocks_per_request,
            profile=VLLM_0_34,
            # vLLM 0.34's policy is stated over its spec classes (kvspec's specs keep their traits' answer).
            zero_new_blocks=(needs_kv_cache_zeroing and zeroed_by_vllm_034(kv_cache_spec))
            if as_kvspec(kv_cache_spec) is not kv_cache_spec
            else None,
        )

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        return int(
            self.kvspec_manager.get_num_blocks_to_allocate(
                request_id,
                num_tokens,
                new_computed_blocks,
                total_computed_tokens,
                num_tokens_main_model,
                apply_admission_cap,
            )
        )

    def cache_blocks(
        self,
        request: Any,
        num_tokens: int,
        retention_interval: int | None = None,
        *,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        manager = self.kvspec_manager
        context = manager.context
        if context.prefix_cache_retention_interval != retention_interval:
            manager.context = dataclasses.replace(context, prefix_cache_retention_interval=retention_interval)
        manager.cache_blocks(as_kvspec_request(request, self.block_pool.hash_block_size), num_tokens)

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        self.kvspec_manager.remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)

    @classmethod
    def find_longest_cache_hit(  # 0.34 also returns the hit's tokens
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
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        spec = as_kvspec(kv_cache_spec)
        if spec.block_size != block_pool.hash_block_size:  # 0.34 hands a manager the pool's finer hashes
            block_hashes = BlockHashListWithBlockSize(
                block_hashes, block_pool.hash_block_size, spec.block_size, block_pool.coarse_hash_is_last_fine
            )
        query = _hit_query(
            block_hashes,
            max_length,
            kv_cache_group_ids,
            block_pool,
            spec,
            drop_eagle_block,
            alignment_tokens,
            dcp_world_size,
            pcp_world_size,
        )
        hit = cls.kvspec_manager_cls.find_longest_cache_hit(query)
        tokens = hit.num_tokens if hit.num_tokens is not None else hit.num_blocks * block_tokens_of(spec)
        return hit.blocks, tokens


_cache: dict[tuple[type[SingleTypeKVCacheManager], str], type[VllmStyleManager]] = {}


def _hit_query(
    block_hashes: Sequence[bytes],
    max_length: int,
    kv_cache_group_ids: Sequence[int],
    block_pool: BlockPool,
    spec: Any,
    drop_eagle_block: bool,
    alignment_tokens: int | None,
    dcp_world_size: int,
    pcp_world_size: int,
) -> HitQuery:
    """vLLM's hit-search arguments as kvspec's one ``HitQuery`` (``spec``: kvspec's)."""
    return HitQuery(
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


@overload
def vllm_style(
    manager_cls: type[SingleTypeKVCacheManager], release: Literal["0.34.0"]
) -> type[Vllm034StyleManager]: ...
@overload
def vllm_style(
    manager_cls: type[SingleTypeKVCacheManager], release: str = "0.23.0"
) -> type[VllmStyleManager]: ...
def vllm_style(
    manager_cls: type[SingleTypeKVCacheManager], release: str = "0.23.0"
) -> type[VllmStyleManager]:
    """The ``VllmStyleManager`` class (``Vllm034StyleManager`` for ``release`` "0.34.0") over
    ``manager_cls`` (one per manager class and release, named like the manager)."""
    adapted = _cache.get((manager_cls, release))
    if adapted is None:
        base = Vllm034StyleManager if release == "0.34.0" else VllmStyleManager
        adapted = cast(
            "type[VllmStyleManager]", type(manager_cls.__name__, (base,), {"kvspec_manager_cls": manager_cls})
        )
        adapted.__qualname__ = f"vllm_style({manager_cls.__qualname__}, {release!r})"
        _cache[(manager_cls, release)] = adapted
    return adapted
