"""Coarse spec kinds and windows, used to annotate KV events for routers."""

from __future__ import annotations

from enum import Enum

from kvspec.protocols import KVCacheSpec
from kvspec.specs.attention import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from kvspec.specs.mamba import MambaSpec
from kvspec.specs.mla import MLAAttentionSpec, SlidingWindowMLASpec
from kvspec.specs.uniform import UniformTypeKVCacheSpecs


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


# Subclasses before their bases, so the most specific kind wins.
_KIND_ORDER: tuple[tuple[type, KVCacheSpecKind], ...] = (
    (SlidingWindowMLASpec, KVCacheSpecKind.SLIDING_WINDOW_MLA),
    (MLAAttentionSpec, KVCacheSpecKind.MLA_ATTENTION),
    (SinkFullAttentionSpec, KVCacheSpecKind.SINK_FULL_ATTENTION),
    (FullAttentionSpec, KVCacheSpecKind.FULL_ATTENTION),
    (ChunkedLocalAttentionSpec, KVCacheSpecKind.CHUNKED_LOCAL_ATTENTION),
    (SlidingWindowSpec, KVCacheSpecKind.SLIDING_WINDOW),
    (MambaSpec, KVCacheSpecKind.MAMBA),
    (EncoderOnlyAttentionSpec, KVCacheSpecKind.ENCODER_ONLY_ATTENTION),
    (CrossAttentionSpec, KVCacheSpecKind.CROSS_ATTENTION),
)


def get_kv_cache_spec_kind(spec: KVCacheSpec) -> KVCacheSpecKind:
    """The kind of ``spec``; a uniform-type group has its layers' kind if they share one."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        kinds = {get_kv_cache_spec_kind(s) for s in spec.kv_cache_specs.values()}
        return kinds.pop() if len(kinds) == 1 else KVCacheSpecKind.UNKNOWN
    for cls, kind in _KIND_ORDER:
        if isinstance(spec, cls):
            return kind
    return KVCacheSpecKind.UNKNOWN


def get_kv_cache_spec_sliding_window(spec: KVCacheSpec) -> int | None:
    """The window of a sliding-window spec (or of a uniform group with one window), else None."""
    if isinstance(spec, SlidingWindowSpec):
        return spec.sliding_window
    if isinstance(spec, UniformTypeKVCacheSpecs):
        windows = {get_kv_cache_spec_sliding_window(s) for s in spec.kv_cache_specs.values()}
        return windows.pop() if len(windows) == 1 else None
    return None
