"""KV cache tensors on a device: one byte buffer per KVCacheTensor, per-layer typed views into it.

Every layer's view is block-major (``[num_blocks, ...]``) so that one block id addresses one page of
``page_size_bytes`` in every layer that aliases the buffer; that is what lets groups share tensors.
"""

from __future__ import annotations

import math

import torch

from kvspec.config import KVCacheConfig
from kvspec.errors import DeviceError
from kvspec.protocols import KVCacheSpec
from kvspec.specs.attention import AttentionSpec
from kvspec.specs.mamba import MambaSpec
from kvspec.specs.mla import MLAAttentionSpec, SlidingWindowMLASpec
from kvspec.specs.uniform import UniformTypeKVCacheSpecs

LayerCache = torch.Tensor | tuple[torch.Tensor, ...]


def layer_specs_of(config: KVCacheConfig) -> dict[str, KVCacheSpec]:
    """Each layer's own spec (uniform-type groups resolved to the layer's inner spec)."""
    out: dict[str, KVCacheSpec] = {}
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        for name in group.layer_names:
            out[name] = spec.kv_cache_specs[name] if isinstance(spec, UniformTypeKVCacheSpecs) else spec
    return out


def _attention_view(buffer: torch.Tensor, spec: AttentionSpec, num_blocks: int) -> torch.Tensor:
    pages = buffer[: num_blocks * spec.page_size_bytes].view(num_blocks, spec.page_size_bytes)
    real = pages[:, : spec.real_page_size_bytes].view(spec.dtype)
    h, hs = spec.num_kv_heads, spec.head_size
    if isinstance(spec, (MLAAttentionSpec, SlidingWindowMLASpec)):
        return real.view(num_blocks, spec.storage_block_size, h, hs)
    hsv = getattr(spec, "head_size_v", None) or hs
    # [block, token in block, kv head, K (head_size) then V (head_size_v)]
    return real.view(num_blocks, spec.block_size, h, hs + hsv)


def _mamba_views(buffer: torch.Tensor, spec: MambaSpec, num_blocks: int) -> tuple[torch.Tensor, ...]:
    pages = buffer[: num_blocks * spec.page_size_bytes].view(num_blocks, spec.page_size_bytes)
    views = []
    offset = 0
    for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True):
        nbytes = math.prod(shape) * dtype.itemsize
        views.append(pages[:, offset : offset + nbytes].view(dtype).view(num_blocks, *shape))
        offset += nbytes
    return tuple(views)


def allocate_kv_caches(config: KVCacheConfig, device: str | torch.device = "cpu") -> dict[str, LayerCache]:
    """Allocate ``config``'s tensors (zeroed) and return each layer's typed view of its buffer."""
    specs = layer_specs_of(config)
    caches: dict[str, LayerCache] = {}
    for tensor in config.kv_cache_tensors:
        buffer = torch.zeros(tensor.size, dtype=torch.int8, device=device)
        for name in tensor.shared_by:
            spec = specs[name]
            num_blocks = tensor.size // spec.page_size_bytes
            if num_blocks < config.num_blocks:
                raise DeviceError(
                    f"Tensor of {tensor.size} bytes holds {num_blocks} blocks of layer {name}, fewer than the "
                    f"config's {config.num_blocks}."
                )
            if isinstance(spec, AttentionSpec):
                caches[name] = _attention_view(buffer, spec, config.num_blocks)
            elif isinstance(spec, MambaSpec):
                caches[name] = _mamba_views(buffer, spec, config.num_blocks)
            else:
                raise DeviceError(f"No device layout for {type(spec).__name__} (layer {name}).")
    return caches


def write_kv(cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store K [T, H, hs] and V [T, H, hsv] of T tokens at their slots (slot -1: skipped)."""
    block_size = cache.shape[1]
    hs = key.shape[-1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blocks, offsets = slots // block_size, slots % block_size
    cache[blocks, offsets, :, :hs] = key[valid].to(cache.dtype)
    cache[blocks, offsets, :, hs:] = value[valid].to(cache.dtype)


def gather_kv(
    cache: torch.Tensor, block_row: torch.Tensor, num_tokens: int, head_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of positions [0, num_tokens) of one request, read through its block-table row."""
    block_size = cache.shape[1]
    positions = torch.arange(num_tokens, device=cache.device)
    blocks = block_row[positions // block_size].long()
    kv = cache[blocks, positions % block_size]
    return kv[..., :head_size], kv[..., head_size:]
