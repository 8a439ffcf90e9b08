"""One manager per built-in spec family, and the registration of the built-ins."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvspec.managers.base import SingleTypeKVCacheManager as SingleTypeKVCacheManager
from kvspec.managers.chunked_local import ChunkedLocalAttentionManager as ChunkedLocalAttentionManager
from kvspec.managers.cross import CrossAttentionManager as CrossAttentionManager
from kvspec.managers.full import (
    FullAttentionManager as FullAttentionManager,
)
from kvspec.managers.full import (
    SinkFullAttentionManager as SinkFullAttentionManager,
)
from kvspec.managers.mamba import MambaManager as MambaManager
from kvspec.managers.sliding_window import SlidingWindowManager as SlidingWindowManager
from kvspec.specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    TQFullAttentionSpec,
)

if TYPE_CHECKING:
    from kvspec.protocols import KVCacheManager, KVCacheSpec
    from kvspec.registry import Registry


def register_builtins(registry: Registry[KVCacheSpec, KVCacheManager]) -> None:
    """Register the ten built-in spec classes (vLLM's register_all_kvcache_specs), atomically."""
    from kvspec.registry import Capabilities

    paged = frozenset({"cpu", "cuda", "npu"})
    table: list[tuple[type[KVCacheSpec], type[KVCacheManager], type[KVCacheSpec], str, str]] = [
        (FullAttentionSpec, FullAttentionManager, FullAttentionSpec, "kvspec.full_attention", "paged_kv"),
        (
            TQFullAttentionSpec,
            FullAttentionManager,
            FullAttentionSpec,
            "kvspec.turboquant_full_attention",
            "paged_kv",
        ),
        (MLAAttentionSpec, FullAttentionManager, FullAttentionSpec, "kvspec.mla_attention", "paged_latent"),
        (
            HiddenStateCacheSpec,
            FullAttentionManager,
            FullAttentionSpec,
            "kvspec.hidden_state",
            "paged_latent",
        ),
        (
            SinkFullAttentionSpec,
            SinkFullAttentionManager,
            FullAttentionSpec,
            "kvspec.sink_full_attention",
            "paged_kv",
        ),
        (SlidingWindowSpec, SlidingWindowManager, SlidingWindowSpec, "kvspec.sliding_window", "paged_kv"),
        (
            SlidingWindowMLASpec,
            SlidingWindowManager,
            SlidingWindowMLASpec,
            "kvspec.sliding_window_mla",
            "paged_latent",
        ),
        (
            ChunkedLocalAttentionSpec,
            ChunkedLocalAttentionManager,
            ChunkedLocalAttentionSpec,
            "kvspec.chunked_local_attention",
            "paged_kv",
        ),
        (MambaSpec, MambaManager, MambaSpec, "kvspec.mamba", "state"),
        (CrossAttentionSpec, CrossAttentionManager, CrossAttentionSpec, "kvspec.cross_attention", "paged_kv"),
    ]
    with registry.transaction():
        for spec_cls, manager_cls, base, identifier, layout in table:
            registry.register(
                spec_cls,
                manager_cls,
                base,
                capabilities=Capabilities(identifier=identifier, storage_layout=layout, devices=paged),
                source="builtin",
            )
