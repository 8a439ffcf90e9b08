"""One manager per built-in spec family (registered by kvspec.registry.builtins)."""

from __future__ import annotations

from kvspec.managers.base import SingleTypeKVCacheManager as SingleTypeKVCacheManager
from kvspec.managers.chunked_local import ChunkedLocalAttentionManager as ChunkedLocalAttentionManager
from kvspec.managers.circular_buffer import CircularBufferManager as CircularBufferManager
from kvspec.managers.cross import CrossAttentionManager as CrossAttentionManager
from kvspec.managers.full import (
    FullAttentionManager as FullAttentionManager,
)
from kvspec.managers.full import (
    SinkFullAttentionManager as SinkFullAttentionManager,
)
from kvspec.managers.mamba import MambaManager as MambaManager
from kvspec.managers.rswa import RSWAManager as RSWAManager
from kvspec.managers.sliding_window import SlidingWindowManager as SlidingWindowManager
