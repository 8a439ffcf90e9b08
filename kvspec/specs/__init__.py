"""Concrete KV cache specs, one module per family. All are frozen keyword-only dataclasses."""

from kvspec.specs._common import (
    KVQuantMode as KVQuantMode,
    cdiv as cdiv,
    dtype_size as dtype_size,
    get_kv_quant_mode as get_kv_quant_mode,
    is_quantized_kv_cache as is_quantized_kv_cache,
    kv_cache_uses_per_token_head_scales as kv_cache_uses_per_token_head_scales,
    nvfp4_full as nvfp4_full,
    round_up as round_up,
)
from kvspec.specs.attention import (
    AttentionSpec as AttentionSpec,
    ChunkedLocalAttentionSpec as ChunkedLocalAttentionSpec,
    CrossAttentionSpec as CrossAttentionSpec,
    EncoderOnlyAttentionSpec as EncoderOnlyAttentionSpec,
    FullAttentionSpec as FullAttentionSpec,
    SinkFullAttentionSpec as SinkFullAttentionSpec,
    SlidingWindowSpec as SlidingWindowSpec,
    TQFullAttentionSpec as TQFullAttentionSpec,
)
from kvspec.specs.kinds import (
    KVCacheSpecKind as KVCacheSpecKind,
    get_kv_cache_spec_kind as get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window as get_kv_cache_spec_sliding_window,
)
from kvspec.specs.mamba import MambaSpec as MambaSpec
from kvspec.specs.mla import (
    HiddenStateCacheSpec as HiddenStateCacheSpec,
    MLAAttentionSpec as MLAAttentionSpec,
    SlidingWindowMLASpec as SlidingWindowMLASpec,
)
from kvspec.specs.uniform import UniformTypeKVCacheSpecs as UniformTypeKVCacheSpecs
