"""What vLLM's code reads beside the manager: its coordinator (``kv_cache_manager.coordinator``: the groups,
``get_num_blocks_to_allocate``, the hit search) and its block pool, as facades over kvspec's coordinator and
pool, and the block pools vLLM's tests construct (``Vllm023BlockPool``, ``Vllm034BlockPool``)."""

from __future__ import annotations

import abc
import functools
import importlib
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, cast

from kvspec.blocks.pool import BlockPool, KVCacheBlock
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.release import VLLM_0_34
from kvspec.coordinator import KVCacheCoordinator
from kvspec.errors import BlockPoolError
from kvspec.integrations.vllm import VLLM_SPECS_MODULE
from kvspec.integrations.vllm_events import event_to_vllm
from kvspec.integrations.vllm_names import VllmManagerView
from kvspec.integrations.vllm_request_view import as_kvspec_request


def _retention_interval(kv_cache_config: Any) -> int | None:
    """vLLM 0.34 plans the retention into the config (``KVCacheConfig.prefix_cache_retention_interval``);
    0.23 reads the ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL`` environment setting."""
    if hasattr(kv_cache_config, "prefix_cache_retention_interval"):
        planned: int | None = kv_cache_config.prefix_cache_retention_interval
        return planned
    envs = importlib.import_module("vllm.envs")
    from_env: int | None = envs.VLLM_PREFIX_CACHE_RETENTION_INTERVAL
    return from_env


def _zeroed_groups_034(kv_cache_config: Any) -> tuple[bool, ...]:
    """vLLM 0.34's zeroing policy, read off its config: when the model needs zeroing (Mamba layers or mixed
    precision, ``KVCacheConfig.needs_kv_cache_zeroing``) every attention group except a ring reports its new
    blocks, otherwise none does. (0.23's managers report the full-attention families' blocks always: the
    specs' ``zero_new_blocks`` traits.)"""
    needs = bool(getattr(kv_cache_config, "needs_kv_cache_zeroing", False))
    return tuple(needs and zeroed_by_vllm_034(g.kv_cache_spec) for g in kv_cache_config.kv_cache_groups)


def zeroed_by_vllm_034(vllm_spec: Any) -> bool:
    """Whether vLLM 0.34 zeroes a group of ``vllm_spec`` when its model needs zeroing: attention, not a
    ring."""
    return _vllm_spec_is(vllm_spec, "AttentionSpec") and not _vllm_spec_is(vllm_spec, "CircularBufferSpec")


def _vllm_spec_is(spec: Any, class_name: str) -> bool:
    """Whether vLLM's ``spec`` derives from vLLM's spec class ``class_name`` (its own module's class, read by
    name: vLLM's policy is stated over its classes, which kvspec's code never tests for)."""
    return any(c.__name__ == class_name and c.__module__ == VLLM_SPECS_MODULE for c in type(spec).__mro__)


class VllmSpecGroup(NamedTuple):
    """One entry of vLLM 0.34's ``coordinator.attention_groups``."""

    spec: Any
    group_ids: list[int]
    manager_cls: type
    use_eagle: bool


class _CoordinatorFacade:
    """``kv_cache_manager.coordinator`` as vLLM's scheduler uses it (its remaining-blocks estimate)."""

    __slots__ = ("_coordinator", "_vllm_specs")

    def __init__(self, coordinator: KVCacheCoordinator, vllm_specs: Sequence[Any] = ()) -> None:
        self._coordinator = coordinator
        # vLLM's own spec of each group: vLLM code reading a manager's kv_cache_spec type-checks it.
        self._vllm_specs = tuple(vllm_specs)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int | None = None,
        prefill_end: int = 0,
    ) -> int:
        """vLLM's estimate (0.23's arguments; 0.34 adds ``num_local_computed_tokens``, which only matters
        for sub-block partial hits kvspec does not make, and ``prefill_end``, where Mamba "align" reserves
        a prefill checkpoint)."""
        return self._coordinator.get_num_blocks_to_allocate(
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            num_tokens_main_model,
            num_encoder_tokens,
            apply_admission_cap,
            prefill_end=prefill_end,
        )

    @property
    def attention_groups(self) -> list[VllmSpecGroup]:
        """vLLM 0.34's hit-search groups (equal specs searched together, groups never cached left out), each
        with vLLM's spec of its first group when known."""
        specs = self._vllm_specs
        return [
            VllmSpecGroup(
                spec=specs[g.group_ids[0]] if specs else g.spec,
                group_ids=list(g.group_ids),
                manager_cls=g.manager_cls,
                use_eagle=g.use_eagle,
            )
            for g in self._coordinator.hit_search.spec_groups
        ]

    @property
    def single_type_managers(self) -> list[Any]:
        """vLLM's name for the per-group managers, each seen with vLLM's state names (``req_to_blocks``,
        ``num_cached_block``: private fields on kvspec's managers)."""
        specs = self._vllm_specs or (None,) * len(self._coordinator.managers)
        return [VllmManagerView(m, s) for m, s in zip(self._coordinator.managers, specs, strict=True)]

    # vLLM 0.34's coordinator state the Scheduler and its tests read.
    @property
    def retention_interval(self) -> int | None:
        """The sparse retention interval in effect (tokens; None: dense)."""
        return self._coordinator.prefix_cache_retention_interval

    @retention_interval.setter
    def retention_interval(self, interval: int | None) -> None:
        # vLLM 0.34's coordinator keeps it as a plain attribute its tests set after construction.
        self._coordinator.set_prefix_cache_retention_interval(interval)

    @property
    def enable_partial_hash_hits(self) -> bool:
        """Whether sub-block prefix hits apply (vLLM 0.34's name; kvspec's ``partial_hash_hits``)."""
        return self._coordinator.partial_hash_hits

    @property
    def _cache_hit_alignment_tokens(self) -> int:
        """Tokens every prefix hit is a multiple of (vLLM 0.34's name): the hash block with sub-block hits,
        else the scheduler block."""
        return self._coordinator.cache_hit_alignment_tokens

    @property
    def group_block_sizes(self) -> tuple[int, ...]:
        """Each group's block in tokens (context parallelism included), as vLLM 0.34's coordinator lists it."""
        return self._coordinator.group_block_sizes

    @property
    def eagle_group_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._coordinator._eagle_group_ids))

    @property
    def full_attention_group_id(self) -> int | None:
        """The first group of the first spec group searched when that is full attention (left-closed
        hits), else None: vLLM 0.34's reference group for per-group lookups."""
        groups = self._coordinator.hit_search.spec_groups
        if not groups or not groups[0].left_closed:
            return None
        return groups[0].group_ids[0]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._coordinator, name)


class _CachePartialBlock(Protocol):
    """kvspec's ``BlockPool.cache_partial_block``, bound."""

    def __call__(
        self,
        request: RequestView,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        *,
        replace_existing: bool = False,
    ) -> bytes | None: ...


def _cache_partial_block_for_vllm(
    pool_cache_partial_block: _CachePartialBlock,
    hash_block: int,
    request: Any,
    block: KVCacheBlock,
    num_tokens: int,
    kv_cache_group_id: int,
    block_size: int | None,
    replace_existing_hashes: bool,
) -> bytes | None:
    """vLLM 0.34's ``cache_partial_block(request, block, num_tokens, kv_cache_group_id, block_size,
    replace_existing_hashes)`` on a kvspec pool of ``hash_block`` tokens per hash (its ``cache_partial_block``
    given): the vLLM request read in place; ``block_size`` is the owning group's block, a multiple of the
    hash block."""
    if block_size is not None and block_size % hash_block:
        raise BlockPoolError(
            f"A partial entry's group block size ({block_size} tokens) must be a multiple of the hash "
            f"block ({hash_block} tokens)."
        )
    return pool_cache_partial_block(
        as_kvspec_request(request, hash_block),
        block,
        num_tokens,
        kv_cache_group_id,
        replace_existing=replace_existing_hashes,
    )


class _BlockPoolFacade:
    """kvspec's block pool, taking vLLM requests where it takes a request (everything else passes through)."""

    def __init__(self, pool: BlockPool) -> None:
        object.__setattr__(self, "_pool", pool)

    def cache_full_blocks(
        self,
        request: Any,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        self._pool.cache_full_blocks(
            as_kvspec_request(request, self._pool.hash_block_size),
            blocks,
            num_cached_blocks,
            num_full_blocks,
            block_size,
            kv_cache_group_id,
            block_mask,
        )

    def cache_partial_block(
        self,
        request: Any,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int | None = None,
        replace_existing_hashes: bool = False,
    ) -> bytes | None:
        """vLLM 0.34's ``cache_partial_block`` on kvspec's pool (see ``_cache_partial_block_for_vllm``)."""
        pool: BlockPool = self._pool
        return _cache_partial_block_for_vllm(
            pool.cache_partial_block,
            pool.hash_block_size,
            request,
            block,
            num_tokens,
            kv_cache_group_id,
            block_size,
            replace_existing_hashes,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._pool, name, value)


# vLLM picks one of three coordinator classes; the facade carries the name vLLM's choice would have.
_FACADE_CLASSES: dict[str, type[_CoordinatorFacade]] = {
    name: cast("type[_CoordinatorFacade]", type(name, (_CoordinatorFacade,), {"__slots__": ()}))
    for name in ("KVCacheCoordinatorNoPrefixCache", "UnitaryKVCacheCoordinator", "HybridKVCacheCoordinator")
}


def _coordinator_facade(
    coordinator: KVCacheCoordinator, enable_caching: bool, vllm_config: Any = None
) -> _CoordinatorFacade:
    if not enable_caching:
        name = "KVCacheCoordinatorNoPrefixCache"
    elif coordinator.num_groups == 1:
        name = "UnitaryKVCacheCoordinator"
    else:
        name = "HybridKVCacheCoordinator"
    groups = getattr(vllm_config, "kv_cache_groups", None) or ()
    facade_cls = _FACADE_CLASSES[name]
    _register_with_vllm(name)
    return facade_cls(coordinator, [g.kv_cache_spec for g in groups])


@functools.cache
def _register_with_vllm(name: str) -> None:
    """Make the facade an instance of vLLM's coordinator class of the same name, as vLLM's code checks it
    (0.34's ``get_computed_blocks_for_connector`` asks ``isinstance(coordinator, HybridKVCacheCoordinator)``):
    vLLM's coordinators are ABCs, so the facade is registered as a virtual subclass. Nothing without vLLM."""
    try:
        module = importlib.import_module("vllm.v1.core.kv_cache_coordinator")
    except ImportError:
        return
    vllm_cls = getattr(module, name, None)
    if isinstance(vllm_cls, abc.ABCMeta):
        vllm_cls.register(_FACADE_CLASSES[name])


class Vllm023BlockPool(BlockPool):
    """kvspec's ``BlockPool`` that also takes vLLM requests in ``cache_full_blocks`` (read through a view)."""

    def cache_full_blocks(
        self,
        request: Any,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        super().cache_full_blocks(
            as_kvspec_request(request, self.hash_block_size),
            blocks,
            num_cached_blocks,
            num_full_blocks,
            block_size,
            kv_cache_group_id,
            block_mask,
        )

    def cache_partial_block(  # vLLM's order: block_size 5th; kvspec's keyword-only replace_existing too
        self,
        request: Any,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int | None = None,
        replace_existing_hashes: bool = False,
        *,
        replace_existing: bool = False,
    ) -> bytes | None:
        """kvspec's partial prompt-tail entry for a vLLM request (see ``_cache_partial_block_for_vllm``);
        ``replace_existing`` is kvspec's name of vLLM's ``replace_existing_hashes`` (kvspec's managers pass it
        by that name)."""
        return _cache_partial_block_for_vllm(
            super().cache_partial_block,
            self.hash_block_size,
            request,
            block,
            num_tokens,
            kv_cache_group_id,
            block_size,
            replace_existing_hashes or replace_existing,
        )

    @property
    def cached_block_hashes_by_block(self) -> dict[int, set[bytes]]:
        """vLLM 0.34's name for the keys a block is cached under besides its own hash (block id -> keys;
        only blocks that have such keys). A copy: the map is the pool's to change."""
        return {
            block_id: set(keys)
            for block_id, keys in self.cached_block_hash_to_block.secondary_keys_by_block().items()
        }

    def take_events(self) -> list[Any]:
        """The queued events as vLLM's event objects."""
        return [event_to_vllm(e) for e in super().take_events()]


class Vllm034BlockPool(Vllm023BlockPool):
    """``Vllm023BlockPool`` behind vLLM 0.34.0's constructor, with that release's pool rules (the ``VLLM_0_34``
    profile: unhashed frees first, a coarse block keyed by its last fine hash)."""

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: Any = None,
        num_hash_lookahead_tokens: int = 0,
        medium: str = "GPU",
    ) -> None:
        super().__init__(
            num_gpu_blocks,
            enable_caching,
            hash_block_size,
            enable_kv_cache_events,
            medium,
            metrics_collector,
            free_unhashed_first=VLLM_0_34.pool.free_unhashed_first,
            coarse_hash_is_last_fine=VLLM_0_34.pool.coarse_hash_is_last_fine,
            hash_lookahead_tokens=num_hash_lookahead_tokens,
        )


#: vLLM 0.23.0's block pool under its earlier name.
VllmBlockPool = Vllm023BlockPool
