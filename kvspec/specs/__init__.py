"""Concrete KV cache specs, one module per family. All are frozen keyword-only dataclasses."""

from kvspec.intmath import cdiv as cdiv
from kvspec.intmath import round_up as round_up
from kvspec.specs.attention import (
    AttentionSpec as AttentionSpec,
)
from kvspec.specs.attention import (
    ChunkedLocalAttentionSpec as ChunkedLocalAttentionSpec,
)
from kvspec.specs.attention import (
    CircularBufferSpec as CircularBufferSpec,
)
from kvspec.specs.attention import (
    CrossAttentionSpec as CrossAttentionSpec,
)
from kvspec.specs.attention import (
    EncoderOnlyAttentionSpec as EncoderOnlyAttentionSpec,
)
from kvspec.specs.attention import (
    FullAttentionSpec as FullAttentionSpec,
)
from kvspec.specs.attention import (
    RSWASpec as RSWASpec,
)
from kvspec.specs.attention import (
    SinkFullAttentionSpec as SinkFullAttentionSpec,
)
from kvspec.specs.attention import (
    SlidingWindowSpec as SlidingWindowSpec,
)
from kvspec.specs.attention import (
    TQFullAttentionSpec as TQFullAttentionSpec,
)
from kvspec.specs.dtypes import KVQuantMode as KVQuantMode
from kvspec.specs.dtypes import dtype_size as dtype_size
from kvspec.specs.dtypes import get_kv_quant_mode as get_kv_quant_mode
from kvspec.specs.dtypes import is_quantized_kv_cache as is_quantized_kv_cache
from kvspec.specs.dtypes import kv_cache_uses_per_token_head_scales as kv_cache_uses_per_token_head_scales
from kvspec.specs.dtypes import nvfp4_full as nvfp4_full
from kvspec.specs.kinds import (
    KVCacheSpecKind as KVCacheSpecKind,
)
from kvspec.specs.kinds import (
    get_kv_cache_spec_kind as get_kv_cache_spec_kind,
)
from kvspec.specs.kinds import (
    get_kv_cache_spec_sliding_window as get_kv_cache_spec_sliding_window,
)
from kvspec.specs.mamba import MambaSpec as MambaSpec
from kvspec.specs.mla import (
    HiddenStateCacheSpec as HiddenStateCacheSpec,
)
from kvspec.specs.mla import (
    MLAAttentionSpec as MLAAttentionSpec,
)
from kvspec.specs.mla import (
    SlidingWindowMLASpec as SlidingWindowMLASpec,
)
from kvspec.specs.uniform import UniformTypeKVCacheSpecs as UniformTypeKVCacheSpecs
