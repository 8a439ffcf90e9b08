"""The groups a coordinator runs, derived once from the plan: one pure function, :func:`derive_layout`.

Everything a coordinator knows about its groups before it builds a pool or a manager (each group's scheduler
spec and traits, its manager class, the context-parallel ranks its block spans, its block in tokens, the
scheduler and hash block sizes, which groups cache like EAGLE groups) comes from here, so per-group block
sizes have one source and every check on the combination runs before anything is built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.contracts.manager import KVCacheManager
from kvspec.contracts.release import DEFAULT_PROFILE, ReleaseProfile
from kvspec.contracts.spec import KVCacheSpec, SchedulerLimits
from kvspec.contracts.traits import SpecTraits, block_tokens_of, traits_of
from kvspec.coordinator.options import CoordinatorOptions
from kvspec.errors import ReleaseMismatchError, UnsupportedConfigurationError
from kvspec.planning.config import KVCacheConfig, KVCacheGroupSpec, scheduler_spec
from kvspec.registry.builtins import default_registry

__all__ = ["GroupLayout", "check_retention_interval", "derive_layout", "resolve_block_sizes"]


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupLayout:
    """A coordinator's groups, one entry per KV cache group in group-id order (units: tokens).

    ``group_block_sizes[g]`` is the tokens one block of group g holds, context parallelism included (what
    its manager's ``block_size`` is); ``group_cp[g]`` the (DCP, PCP) ranks that block spans;
    ``scheduler_block_size`` the LCM of the groups' blocks; ``hash_block_size`` the tokens per block hash;
    ``eagle_group_ids`` the groups that cache and search like EAGLE groups; ``retention_interval`` the
    prefix-cache retention the coordinator runs (None: dense); ``capability_ids`` each group's registered
    capability identifier (for KV events)."""

    specs: tuple[KVCacheSpec, ...]
    traits: tuple[SpecTraits, ...]
    manager_classes: tuple[type[KVCacheManager], ...]
    capability_ids: tuple[str | None, ...]
    group_cp: tuple[tuple[int, int], ...]
    group_block_sizes: tuple[int, ...]
    scheduler_block_size: int
    hash_block_size: int
    eagle_group_ids: frozenset[int]
    retention_interval: int | None


def _check_release(config: KVCacheConfig, profile: ReleaseProfile) -> None:
    """A config planned under one release's rules runs only under that release's (a profile derived from
    it with ``ReleaseProfile.derive`` keeps its name: a mix made on purpose)."""
    if config.release is not None and config.release != profile.name:
        raise ReleaseMismatchError(
            f"This KVCacheConfig was planned under the {config.release!r} release profile but the coordinator "
            f"runs the {profile.name!r} profile's rules: the run would reproduce neither release. Plan and run with one "
            f"profile (profile=... in both), or derive a mixed profile from {config.release!r} on purpose "
            "(<its profile>.derive(...) keeps its name)."
        )


def derive_layout(config: KVCacheConfig, limits: SchedulerLimits, options: CoordinatorOptions) -> GroupLayout:
    """The layout a coordinator built from ``config``, ``limits`` and ``options`` runs, or the
    ``KVSpecError`` that says why none can: every group's spec registered, caching and EAGLE supported by
    every spec, every cached group's block a multiple of the hash block, a retention that applies, MTP
    re-prefill shorter than the scheduler block, one zeroing choice per group. Pure: nothing is built."""
    registry = default_registry if options.registry is None else options.registry
    profile = options.profile
    _check_release(config, profile)
    groups = config.kv_cache_groups
    specs = tuple(scheduler_spec(g.kv_cache_spec) for g in groups)
    traits = tuple(traits_of(s) for s in specs)
    registrations = [registry.require(spec, f"group {gid}") for gid, spec in enumerate(specs)]
    manager_classes = tuple(
        registry.manager_for_group(spec, group.role) for group, spec in zip(groups, specs, strict=True)
    )
    _check_caching_settings(specs, traits, options.enable_caching, options.use_eagle)
    for spec in specs:
        mode = getattr(spec, "mamba_cache_mode", None)  # a state spec's mode: the release may not run it
        if isinstance(mode, str):
            profile.check_mamba_cache_mode(mode, options.enable_caching)
    scheduler_block_size, hash_block_size = resolve_block_sizes(
        config, limits, options.enable_caching, options.hash_block_size, profile
    )
    dcp, pcp = limits.decode_context_parallel_size, limits.prefill_context_parallel_size
    # Under 0.23 every group's block spans all ranks; under 0.34 only a sharded group's does.
    group_cp = tuple(profile.context_parallel_sizes(t, dcp, pcp) for t in traits)
    group_block_sizes = tuple(
        t.block_tokens(spec.block_size) * math.prod(cp)
        for spec, t, cp in zip(specs, traits, group_cp, strict=True)
    )
    if options.enable_caching and len(specs) > 1:
        for block_tokens, group_traits in zip(group_block_sizes, traits, strict=True):
            if group_traits.prefix_cacheable and block_tokens % hash_block_size:
                raise UnsupportedConfigurationError(
                    f"Group block size {block_tokens} is not a multiple of hash_block_size {hash_block_size}."
                )
    retention = options.retention_for(config)
    check_retention_interval(retention, scheduler_block_size, traits)
    eagle_group_ids = _eagle_groups(groups, specs, options.use_eagle)
    reprefillable = options.num_reprefillable_tokens
    if options.enable_caching and eagle_group_ids and scheduler_block_size <= reprefillable:
        raise UnsupportedConfigurationError(
            f"Multi-module MTP with prefix caching requires scheduler_block_size (={scheduler_block_size}) "
            f">= num_speculative_tokens (={reprefillable + 1}); use a larger block or fewer tokens."
        )
    zero = options.zero_new_blocks
    if zero is not None and len(zero) != len(groups):
        raise UnsupportedConfigurationError(
            f"zero_new_blocks has {len(zero)} entries for {len(groups)} KV cache groups; give one per group "
            "(or None: each spec's zero_new_blocks trait)."
        )
    return GroupLayout(
        specs=specs,
        traits=traits,
        manager_classes=manager_classes,
        capability_ids=tuple(
            r.capabilities.identifier if r.capabilities is not None else None for r in registrations
        ),
        group_cp=group_cp,
        group_block_sizes=group_block_sizes,
        scheduler_block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
        eagle_group_ids=eagle_group_ids,
        retention_interval=retention,
    )


def resolve_block_sizes(
    config: KVCacheConfig,
    limits: SchedulerLimits,
    enable_caching: bool,
    hash_block_size: int | None,
    profile: ReleaseProfile | None = None,
) -> tuple[int, int]:
    """(scheduler_block_size, hash_block_size) in tokens for ``config``.

    One group: both are its block size times the context-parallel ranks its block spans. Several: the
    scheduler block is the LCM of the groups' block sizes; hashes are taken at their GCD (or at the LCM
    without caching or when a group whose hits end only on its own block boundaries (Mamba) has a block
    that is not the smallest), and every group's block size must be a multiple. Under vLLM 0.23's rules
    (``profile``, default the current release) context parallelism scales every group and needs one block
    size; under 0.34's each group's block is scaled by the ranks it is sharded over
    (``ReleaseProfile.context_parallel_sizes``).
    """
    profile = DEFAULT_PROFILE if profile is None else profile
    specs = [scheduler_spec(g.kv_cache_spec) for g in config.kv_cache_groups]
    traits = [traits_of(s) for s in specs]
    own_boundaries = [t.hits_at_own_block_boundaries for t in traits]
    dcp, pcp = limits.decode_context_parallel_size, limits.prefill_context_parallel_size
    spans = [math.prod(profile.context_parallel_sizes(t, dcp, pcp)) for t in traits]
    if len(specs) <= 1:
        size = (block_tokens_of(specs[0]) * spans[0]) if specs else 16 * dcp * pcp
        return size, size if hash_block_size is None else hash_block_size
    sizes = [block_tokens_of(s) for s in specs]
    if profile.managers.context_parallel_per_group:
        sizes = [size * span for size, span in zip(sizes, spans, strict=True)]
        scheduler = math.lcm(*sizes)
    else:
        cp = limits.context_parallel_size
        if cp > 1 and len(set(sizes)) > 1:
            raise UnsupportedConfigurationError(
                "Hybrid KV cache groups with multiple block sizes do not support context parallelism."
            )
        scheduler = math.lcm(*sizes) * (cp if len(set(sizes)) == 1 else 1)
    # Only groups that are cached are hashed (a ring buffer or a replayed window is never hit); with none,
    # every group counts.
    hashed = [size for size, t in zip(sizes, traits, strict=True) if t.prefix_cacheable] or sizes
    if hash_block_size is not None:
        chosen = hash_block_size
    elif not enable_caching or any(
        own and size != min(hashed)
        for own, size, t in zip(own_boundaries, sizes, traits, strict=True)
        if t.prefix_cacheable
    ):
        chosen = scheduler
    else:
        chosen = math.gcd(*hashed)
    if not enable_caching:
        return scheduler, chosen  # no prefix caching: hashes are never read
    bad = [s for s in hashed if s % chosen]
    if bad or scheduler % chosen:
        raise UnsupportedConfigurationError(
            f"Invalid hash_block_size={chosen}: every prefix-cacheable KV cache group block size "
            f"({sorted(set(hashed))}) must be a multiple of it."
        )
    return scheduler, chosen


def _check_caching_settings(
    specs: Sequence[KVCacheSpec], traits: Sequence[SpecTraits], enable_caching: bool, use_eagle: bool
) -> None:
    if not enable_caching:
        return
    for spec, spec_traits in zip(specs, traits, strict=True):
        if not spec_traits.supports_prefix_caching:
            raise UnsupportedConfigurationError(
                f"{type(spec).__name__} does not support prefix caching (encoder-decoder models with "
                "cross attention, for one); run with enable_caching=False."
            )
        if use_eagle and not spec_traits.supports_eagle_with_prefix_caching:
            raise UnsupportedConfigurationError(
                f"EAGLE with prefix caching is not supported for {type(spec).__name__} layers "
                "(e.g. Mamba); turn off one of them."
            )


def _eagle_groups(
    groups: Sequence[KVCacheGroupSpec], specs: Sequence[KVCacheSpec], use_eagle: bool
) -> frozenset[int]:
    """Groups that cache and search like EAGLE groups (the lookahead block dropped from hits): the declared
    EAGLE groups (all of them if none is declared), and every group of the same spec as one of them (groups
    of one spec are searched as one, so their cached blocks must line up)."""
    if not use_eagle:
        return frozenset()
    eagle_ids = {i for i, g in enumerate(groups) if g.is_eagle_group} or set(range(len(groups)))
    return frozenset(
        eagle_ids | {i for i, spec in enumerate(specs) if any(spec == specs[e] for e in eagle_ids)}
    )


def check_retention_interval(
    interval: object, scheduler_block_size: int, traits: Sequence[SpecTraits]
) -> None:
    """UnsupportedConfigurationError unless ``interval`` (tokens; None: dense) is a retention a model of
    ``traits`` runs: a non-negative multiple of the scheduler block, positive only beside a windowed or
    state group (0, vLLM 0.34's planned default, is a no-op anywhere)."""
    if interval is None:
        return
    # Retention thins the caches of windowed and state (Mamba-like) groups; 0 (vLLM 0.34's planned default)
    # is accepted as a no-op for any model, a positive interval only where it has an effect.
    if not any(t.sliding_window is not None or t.hits_at_own_block_boundaries for t in traits):
        if interval == 0:
            return
        raise UnsupportedConfigurationError(
            "prefix_cache_retention_interval is set but this model has no sliding-window or Mamba KV cache "
            "group, so retention has no effect; set it to 0 or None (it only thins sliding-window and Mamba "
            "caches)."
        )
    if (
        isinstance(interval, bool)
        or not isinstance(interval, int)
        or interval < 0
        or interval % scheduler_block_size
    ):
        raise UnsupportedConfigurationError(
            f"prefix_cache_retention_interval ({interval!r}) must be a non-negative int (tokens) and a "
            f"multiple of scheduler_block_size ({scheduler_block_size})."
        )
