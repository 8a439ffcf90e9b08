"""Coarse spec kinds and windows, used to annotate KV events for routers.

The kind comes from the spec's declared traits (``SpecTraits.kind``), never from its class: a plugin
family reports its own kind string; built-in kinds are members of :class:`KVCacheSpecKind`.
"""

from __future__ import annotations

from enum import Enum

from kvspec.contracts.traits import traits_of


class KVCacheSpecKind(str, Enum):
    FULL_ATTENTION = "full_attention"
    MLA_ATTENTION = "mla_attention"
    SLIDING_WINDOW = "sliding_window"
    SLIDING_WINDOW_MLA = "sliding_window_mla"
    MAMBA = "mamba"
    CHUNKED_LOCAL_ATTENTION = "chunked_local_attention"
    SINK_FULL_ATTENTION = "sink_full_attention"
    ENCODER_ONLY_ATTENTION = "encoder_only_attention"
    CROSS_ATTENTION = "cross_attention"
    UNKNOWN = "unknown"


_BY_VALUE = {kind.value: kind for kind in KVCacheSpecKind}


def get_kv_cache_spec_kind(spec: object) -> KVCacheSpecKind | str:
    """The declared kind of ``spec``: a KVCacheSpecKind for built-in kinds, the plugin's string otherwise
    ("unknown" when it declares none). A uniform-type group has its layers' kind if they share one."""
    kind = traits_of(spec).kind
    if kind is None:
        return KVCacheSpecKind.UNKNOWN
    return _BY_VALUE.get(kind, kind)


def get_kv_cache_spec_sliding_window(spec: object) -> int | None:
    """The window KV events report for ``spec`` (a uniform group's if all its layers share one), else None."""
    return traits_of(spec).event_sliding_window


def get_kv_cache_spec_kind_name(spec: object) -> str:
    """The declared kind of ``spec`` as a plain string ("unknown" when it declares none)."""
    kind = get_kv_cache_spec_kind(spec)
    return kind.value if isinstance(kind, KVCacheSpecKind) else kind
