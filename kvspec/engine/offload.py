"""An engine's tiers, built from its coordinator and :class:`~kvspec.tiers.settings.TierSettings`.

:func:`offload_groups` reads each KV-cache group's family from its declared traits (a recurrent state:
``state``; a sliding window or attention chunk: ``window``; otherwise ``full``), its block size and the
bytes of one block (page bytes times the group's layers). Tier capacities are bytes over the largest of
those (vLLM's offload chunk is one size for all groups). :func:`build_pool` makes the pool a fleet shares;
:func:`build_connector` one instance's connector over its host tier and that pool.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvspec.coordinator import KVCacheCoordinator
from kvspec.errors import TierConfigError
from kvspec.tiers.base import OffloadTier
from kvspec.tiers.connector import GroupOffload, TierConnector, TierSlot, window_blocks
from kvspec.tiers.registry import TierContext, build_tier, resolve_tier
from kvspec.tiers.settings import TierSettings


def offload_groups(coordinator: KVCacheCoordinator, offload: tuple[str, ...]) -> tuple[GroupOffload, ...]:
    """The coordinator's groups as the connector sees them (see the module docstring)."""
    groups = []
    config = coordinator.kv_cache_config
    for gid, (traits, block_size) in enumerate(
        zip(coordinator.traits, coordinator.group_block_sizes, strict=True)
    ):
        group = config.kv_cache_groups[gid]
        block_bytes = group.kv_cache_spec.page_size_bytes * max(1, len(group.layer_names))
        window = traits.sliding_window or traits.attention_chunk_size
        if traits.fixed_state_per_request:
            family, blocks = "state", 1
        elif window:
            family, blocks = "window", window_blocks(window + traits.extra_retained_tokens, block_size)
        else:
            family, blocks = "full", 0
        groups.append(
            GroupOffload(
                index=gid,
                family=family,
                block_size=block_size,
                block_bytes=block_bytes,
                window_blocks=blocks,
                offloaded=family in offload and traits.prefix_cacheable,
            )
        )
    return tuple(groups)


def chunk_bytes(coordinator: KVCacheCoordinator) -> int:
    """Bytes of one tier block: the largest group block (all its layers)."""
    return _chunk(offload_groups(coordinator, ("full",)))


def _chunk(groups: tuple[GroupOffload, ...]) -> int:
    return max(g.block_bytes for g in groups)


def _capacity(what: str, num_bytes: int, chunk: int) -> int:
    blocks = num_bytes // chunk
    if blocks < 1:
        raise TierConfigError(
            f"{what} of {num_bytes} bytes holds no block of this model ({chunk} bytes per block, all layers "
            "of a group); give at least that much."
        )
    return blocks


def build_pool(coordinator: KVCacheCoordinator, settings: TierSettings) -> OffloadTier | None:
    """The shared pool the settings ask for (None without ``pool_bytes``), sized in this model's blocks."""
    if not settings.pool_bytes:
        return None
    return _build(
        settings.pool_tier,
        "The shared pool",
        settings.pool_bytes,
        settings.pool_options,
        chunk_bytes(coordinator),
    )


def _build(
    name: str, what: str, num_bytes: int, options: Mapping[str, str | float], chunk: int
) -> OffloadTier:
    """The registered tier ``name`` holding ``num_bytes`` in blocks of ``chunk`` bytes."""
    context = TierContext(
        capacity_blocks=_capacity(what, num_bytes, chunk), block_bytes=chunk, options=options
    )
    return build_tier(resolve_tier(name), context)


def build_connector(
    coordinator: KVCacheCoordinator, settings: TierSettings, *, pool: OffloadTier | None = None
) -> TierConnector | None:
    """One instance's connector: its own host tier (``host_bytes``) then ``pool`` (a fleet's shared pool,
    from :func:`build_pool`; built here when None and the settings ask for one). None without tiers."""
    if not settings.enabled:
        return None
    groups = offload_groups(coordinator, settings.offload)
    chunk = _chunk(groups)
    slots = []
    if settings.host_bytes:
        tier = _build(settings.host_tier, "Host memory", settings.host_bytes, settings.host_options, chunk)
        slots.append(TierSlot(name="host", tier=tier, link=settings.host_link))
    if pool is None and settings.pool_bytes:
        pool = _build(
            settings.pool_tier, "The shared pool", settings.pool_bytes, settings.pool_options, chunk
        )
    if pool is not None:
        slots.append(TierSlot(name="pool", tier=pool, link=settings.pool_link, shared=True))
    return TierConnector(groups, slots, hash_block_size=coordinator.hash_block_size)


__all__ = ["build_connector", "build_pool", "chunk_bytes", "offload_groups"]
