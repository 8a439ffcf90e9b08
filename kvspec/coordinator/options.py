"""How a coordinator runs: one frozen, validated value object (httpx's ``Limits`` style).

:class:`CoordinatorOptions` holds every setting of a :class:`~kvspec.KVCacheCoordinator` beside the planned
``KVCacheConfig`` and the run's ``SchedulerLimits``. It is checked once, when it is built (types by beartype,
values here), so a coordinator, an adapter and the wrapper pass one object through instead of repeating a
list of keywords; a variant is ``dataclasses.replace(options, ...)`` (checked again).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from kvspec.blocks.eviction import EvictionPolicyFactory
from kvspec.blocks.hashing import get_hash_constructor
from kvspec.contracts.checking import check_api
from kvspec.contracts.release import DEFAULT_PROFILE, ReleaseProfile
from kvspec.errors import KVSpecTypeError, UnsupportedConfigurationError
from kvspec.planning.config import KVCacheConfig
from kvspec.registry.core import AnyRegistry

__all__ = ["PLANNED", "CoordinatorOptions", "CoordinatorSettings"]

#: ``CoordinatorOptions.prefix_cache_retention_interval``'s default: run the retention the planner wrote into
#: the ``KVCacheConfig`` (vLLM 0.34's coordinator reads ``kv_cache_config.prefix_cache_retention_interval``).
PLANNED: Literal["planned"] = "planned"


@check_api
@dataclass(frozen=True, kw_only=True, slots=True)
class CoordinatorOptions:
    """Every setting of a coordinator (units: tokens unless named otherwise).

    - ``enable_caching``: prefix caching (vLLM's ``enable_prefix_caching``).
    - ``use_eagle``: the model drafts with EAGLE (hits drop their last block, which EAGLE recomputes).
    - ``enable_kv_cache_events`` / ``log_stats``: KV events (``take_events``) and prefix-cache statistics.
    - ``hash_block_size``: tokens per block hash (None: the scheduler block, or the smallest group block in
      a hybrid with caching); ``hash_algorithm``: a name ``kvspec.blocks.hashing`` knows.
    - ``registry``: where spec types find their managers (None: ``default_registry``).
    - ``profile``: the vLLM release whose run-time behaviour to reproduce (``kvspec.contracts.release``).
    - ``prefix_cache_retention_interval``: sparse retention (a multiple of the scheduler block; 0: only the
      prompt's replay boundary; None: dense, every full block cached). ``PLANNED`` (the default): what the
      ``KVCacheConfig`` carries, which the planner sets from its profile (0 under 0.34, None under 0.23).
    - ``hash_lookahead_tokens``: tokens after each block its hash also covers (vLLM 0.34's EAGLE lookahead
      hashes); blocks are published only once hashed. ``num_reprefillable_tokens``: the last computed
      tokens a multi-module MTP drafter may prefill again (not published until final).
    - ``zero_new_blocks``: per group, whether its new block ids are reported for zeroing (None: each spec's
      ``zero_new_blocks`` trait).
    - ``eviction_policy``: which free cached block is reused first, a name registered in ``kvspec.eviction``
      or a factory (None or "lru": vLLM's LRU order); ``eviction_clock``: the policy's clock in seconds.
    - ``allow_partial_hash_hits``: sub-block prefix hits where they apply (the engine then runs the block
      copies ``take_block_copies`` hands out); ``shared_prefix_checkpoints``: with them, EAGLE and nothing
      re-prefilled, state groups also key a request's shared-prefix junction.
    - ``check_admissions``: refuse a live id given to a second request, a prompt over max_model_len and
      computed tokens no hit block backs (on for kvspec's own API; an engine that checks them itself, as
      vLLM's Scheduler does, turns them off).
    """

    enable_caching: bool = True
    use_eagle: bool = False
    enable_kv_cache_events: bool = False
    log_stats: bool = False
    hash_block_size: int | None = None
    hash_algorithm: str = "sha256"
    registry: AnyRegistry | None = None
    profile: ReleaseProfile = DEFAULT_PROFILE
    prefix_cache_retention_interval: int | Literal["planned"] | None = PLANNED
    hash_lookahead_tokens: int = 0
    num_reprefillable_tokens: int = 0
    zero_new_blocks: tuple[bool, ...] | None = None
    eviction_policy: str | EvictionPolicyFactory | None = None
    eviction_clock: Callable[[], float] | None = None
    allow_partial_hash_hits: bool = False
    shared_prefix_checkpoints: bool = False
    check_admissions: bool = True

    def __post_init__(self) -> None:
        size = self.hash_block_size
        if size is not None and size <= 0:
            raise UnsupportedConfigurationError(
                f"hash_block_size must be a positive int (tokens) or None, got {size!r}."
            )
        get_hash_constructor(self.hash_algorithm)  # an unknown algorithm is refused here, not at a request
        for name in ("hash_lookahead_tokens", "num_reprefillable_tokens"):
            value = getattr(self, name)
            if value < 0:
                raise UnsupportedConfigurationError(f"{name} must be >= 0 (tokens), got {value}.")
        interval = self.prefix_cache_retention_interval
        if isinstance(interval, int) and interval < 0:
            raise UnsupportedConfigurationError(
                f"prefix_cache_retention_interval ({interval!r}) must be a non-negative int (tokens), None "
                "(dense) or PLANNED (the config's)."
            )
        if isinstance(self.eviction_policy, str):
            from kvspec.eviction import resolve_eviction_policy

            resolve_eviction_policy(self.eviction_policy)  # an unknown name is refused with the known ones

    def retention_for(self, kv_cache_config: KVCacheConfig) -> int | None:
        """The retention a coordinator of ``kv_cache_config`` runs: the explicit setting, else the planned one."""
        interval = self.prefix_cache_retention_interval
        return kv_cache_config.prefix_cache_retention_interval if interval == PLANNED else interval

    @classmethod
    def from_settings(
        cls, options: CoordinatorOptions | None, settings: Mapping[str, Any]
    ) -> CoordinatorOptions:
        """``options`` (None: the defaults) with the keyword ``settings`` applied on top; a name that is not
        a setting is a KVSpecTypeError naming the settings there are. ``profile=None`` and
        ``zero_new_blocks`` given as any sequence are accepted as the keyword API always did."""
        base = cls() if options is None else options
        if not settings:
            return base
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise KVSpecTypeError(
                f"Unknown coordinator setting(s) {', '.join(unknown)}; the settings are: {', '.join(sorted(known))}."
            )
        changes = dict(settings)
        if "profile" in changes and changes["profile"] is None:
            changes["profile"] = DEFAULT_PROFILE
        zero = changes.get("zero_new_blocks")
        if zero is not None and not isinstance(zero, (tuple, str, bytes)):
            try:
                changes["zero_new_blocks"] = tuple(zero)
            except TypeError:
                pass  # not a sequence: beartype names the wrong type
        return dataclasses.replace(base, **changes)


class CoordinatorSettings(TypedDict, total=False):
    """``CoordinatorOptions``'s fields as keyword arguments (``KVCacheCoordinator(config, limits,
    eviction_policy="lfu")``), so that mypy checks a caller's keywords; the options object validates them.
    A test keeps the two in step."""

    enable_caching: bool
    use_eagle: bool
    enable_kv_cache_events: bool
    log_stats: bool
    hash_block_size: int | None
    hash_algorithm: str
    registry: AnyRegistry | None
    profile: ReleaseProfile | None
    prefix_cache_retention_interval: int | Literal["planned"] | None
    hash_lookahead_tokens: int
    num_reprefillable_tokens: int
    zero_new_blocks: Sequence[bool] | None
    eviction_policy: str | EvictionPolicyFactory | None
    eviction_clock: Callable[[], float] | None
    allow_partial_hash_hits: bool
    shared_prefix_checkpoints: bool
    check_admissions: bool
