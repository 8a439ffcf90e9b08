"""The built-in registrations (vLLM's register_all_kvcache_specs): twelve spec classes and their managers.

This module sits above both the registry and the managers (neither imports the other). Importing it
registers the built-ins into the default registry once; modules that use the default registry import it
from here (``from kvspec.registry.builtins import default_registry``) so it is never seen empty.
"""

from __future__ import annotations

from kvspec.contracts.manager import KVCacheManager
from kvspec.contracts.spec import KVCacheSpec
from kvspec.managers import (
    ChunkedLocalAttentionManager,
    CircularBufferManager,
    CrossAttentionManager,
    FullAttentionManager,
    MambaManager,
    RSWAManager,
    SinkFullAttentionManager,
    SlidingWindowManager,
)
from kvspec.registry.core import AnyRegistry, Capabilities
from kvspec.registry.core import default_registry as default_registry  # re-exported, registered
from kvspec.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    TQFullAttentionSpec,
)

_PAGED = frozenset({"cpu", "cuda", "npu"})

#: (spec class, manager class, uniform-type base, capability identifier, storage layout)
BUILTIN_REGISTRATIONS: tuple[
    tuple[type[KVCacheSpec], type[KVCacheManager], type[KVCacheSpec], str, str], ...
] = (
    (FullAttentionSpec, FullAttentionManager, FullAttentionSpec, "kvspec.full_attention", "paged_kv"),
    (
        TQFullAttentionSpec,
        FullAttentionManager,
        FullAttentionSpec,
        "kvspec.turboquant_full_attention",
        "paged_kv",
    ),
    (MLAAttentionSpec, FullAttentionManager, FullAttentionSpec, "kvspec.mla_attention", "paged_latent"),
    (HiddenStateCacheSpec, FullAttentionManager, FullAttentionSpec, "kvspec.hidden_state", "paged_latent"),
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
    (CircularBufferSpec, CircularBufferManager, CircularBufferSpec, "kvspec.circular_buffer", "paged_kv"),
    (RSWASpec, RSWAManager, FullAttentionSpec, "kvspec.rswa", "paged_kv"),
)


def register_builtins(registry: AnyRegistry) -> None:
    """Register the ten built-in spec classes into ``registry``, atomically (idempotent)."""
    with registry.transaction():
        for spec_cls, manager_cls, base, identifier, layout in BUILTIN_REGISTRATIONS:
            registry.register(
                spec_cls,
                manager_cls,
                base,
                capabilities=Capabilities(identifier=identifier, storage_layout=layout, devices=_PAGED),
                source="builtin",
            )


register_builtins(default_registry)
