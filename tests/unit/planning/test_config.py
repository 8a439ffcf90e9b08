"""The plan's output values (kvspec.planning.config): derived properties and the scheduler's spec."""

from __future__ import annotations

import torch

from kvspec import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from kvspec.planning.config import scheduler_spec

FULL = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16)
WIDE = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=8, dtype=torch.float16)
MAMBA = MambaSpec(block_size=16, shapes=((4, 8),), dtypes=(torch.float32,))


def _config(*groups: KVCacheGroupSpec) -> KVCacheConfig:
    tensors = (KVCacheTensor(size=1024, shared_by=("a",)), KVCacheTensor(size=4096, shared_by=("b", "c")))
    return KVCacheConfig(num_blocks=8, kv_cache_tensors=tensors, kv_cache_groups=groups)


def test_total_bytes_sums_the_tensors() -> None:
    assert _config().total_bytes == 5120


def test_mamba_and_zeroing_come_from_the_declared_traits() -> None:
    attention = _config(KVCacheGroupSpec(layer_names=("a",), kv_cache_spec=FULL))
    assert not attention.has_mamba_layers and not attention.needs_kv_cache_zeroing
    hybrid = _config(
        KVCacheGroupSpec(layer_names=("a",), kv_cache_spec=FULL),
        KVCacheGroupSpec(layer_names=("m",), kv_cache_spec=MAMBA),
    )
    assert hybrid.has_mamba_layers and hybrid.needs_kv_cache_zeroing


def test_a_uniform_group_is_scheduled_by_its_first_layer() -> None:
    uniform = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": WIDE, "b": FULL})
    assert scheduler_spec(uniform) == WIDE
    window = SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16, sliding_window=64
    )
    assert scheduler_spec(window) is window
    group = KVCacheGroupSpec(layer_names=("a", "b"), kv_cache_spec=uniform)
    assert not _config(group).has_mamba_layers
