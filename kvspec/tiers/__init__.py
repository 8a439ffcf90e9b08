"""Offload tiers below the GPU's block pool: host memory per instance and a pool a fleet shares.

- :mod:`~kvspec.tiers.base`: the :class:`OffloadTier` protocol (vLLM 0.34's ``kv_offload`` calls), keys,
  :class:`TierRequest`, :class:`StorePlan`, :class:`TierEvent`;
- :mod:`~kvspec.tiers.policies`: the host tier's LRU and ARC, as vLLM 0.34's;
- :mod:`~kvspec.tiers.host`: :class:`HostTier` (vLLM's CPU offloading manager);
- :mod:`~kvspec.tiers.pool`: :class:`SharedPool` (Mooncake Store);
- :mod:`~kvspec.tiers.transfer`: :class:`TransferModel`, :func:`parse_link`;
- :mod:`~kvspec.tiers.connector`: :class:`TierConnector`, how an engine's GPU cache reaches its tiers;
- :mod:`~kvspec.tiers.registry`: tiers by name; :mod:`~kvspec.tiers.kit`: :func:`check_tier`.
"""

from kvspec.tiers.base import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    LookupResult,
    OffloadKey,
    OffloadTier,
    StorePlan,
    TierEvent,
    TierRequest,
    key_block_hash,
    key_group,
    offload_key,
)
from kvspec.tiers.connector import FAMILIES, GroupOffload, TierConnector, TierSlot, TierStats
from kvspec.tiers.host import HostTier
from kvspec.tiers.kit import check_tier
from kvspec.tiers.pool import SharedPool
from kvspec.tiers.registry import (
    TierContext,
    TierSpec,
    build_tier,
    register_tier,
    resolve_tier,
    tier_names,
)
from kvspec.tiers.settings import TierSettings
from kvspec.tiers.transfer import HOST_LINK, POOL_LINK, TransferModel, parse_link

__all__ = [
    "FAMILIES",
    "HOST_LINK",
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "MEDIUM_STORAGE",
    "POOL_LINK",
    "GroupOffload",
    "HostTier",
    "LookupResult",
    "OffloadKey",
    "OffloadTier",
    "SharedPool",
    "StorePlan",
    "TierConnector",
    "TierContext",
    "TierEvent",
    "TierRequest",
    "TierSlot",
    "TierSpec",
    "TierSettings",
    "TierStats",
    "TransferModel",
    "build_tier",
    "check_tier",
    "key_block_hash",
    "key_group",
    "offload_key",
    "parse_link",
    "register_tier",
    "resolve_tier",
    "tier_names",
]
