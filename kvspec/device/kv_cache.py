"""KV cache tensors on a device: one byte buffer per KVCacheTensor, per-layer typed views into it.

Every layer's view is block-major (``[num_blocks, ...]``) so that one block id addresses one page of
``page_size_bytes`` in every layer that aliases the buffer; that is what lets groups share tensors. A packed
buffer (``KVCacheTensor.block_stride``) holds each block's pages side by side, at the layers' offsets.
"""

from __future__ import annotations

import torch

from kvspec.contracts.spec import KVCacheSpec
from kvspec.contracts.traits import PageView, traits_of
from kvspec.errors import DeviceError
from kvspec.planning.config import KVCacheConfig
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


def page_views_of(spec: KVCacheSpec) -> tuple[tuple[PageView, ...], bool]:
    """The typed views a spec declares for one page (traits), and whether its cache is a tuple.

    A spec that declares none gets one raw uint8 view of its whole page, so any spec can be laid out.
    """
    traits = traits_of(spec)
    views = traits.device_views or (PageView(name="raw", dtype=torch.uint8, shape=(spec.page_size_bytes,)),)
    for view in views:
        size = view.dtype.itemsize
        if spec.page_size_bytes % size or view.offset_bytes % size:
            raise DeviceError(
                f"{type(spec).__name__}: device view {view.name!r} of {view.dtype} needs its offset "
                f"({view.offset_bytes}) and the page ({spec.page_size_bytes} bytes) to be multiples of {size} "
                "bytes; pad the page (page_size_padded) or reorder the views."
            )
        if view.offset_bytes + view.num_bytes > spec.page_size_bytes:
            raise DeviceError(
                f"{type(spec).__name__} declares device view {view.name!r} of {view.num_bytes} bytes at offset "
                f"{view.offset_bytes}, past its page of {spec.page_size_bytes} bytes; fix its kv_cache_traits()."
            )
    return views, traits.device_view_is_tuple


def _views(
    buffer: torch.Tensor, spec: KVCacheSpec, num_blocks: int, block_stride: int | None = None, offset: int = 0
) -> LayerCache:
    """Block-major views ``[num_blocks, *view.shape]`` of ``buffer`` for each declared page view; pages
    ``block_stride`` bytes apart from byte ``offset`` (a packed buffer), else back to back."""
    views, as_tuple = page_views_of(spec)
    page = spec.page_size_bytes
    stride = page if block_stride is None else block_stride
    pages = buffer[: num_blocks * stride].view(num_blocks, stride)[:, offset : offset + page]
    try:
        out = tuple(
            pages[:, v.offset_bytes : v.offset_bytes + v.num_bytes].view(v.dtype).view(num_blocks, *v.shape)
            for v in views
        )
    except RuntimeError as exc:  # a typed view of a packed page needs its offset and stride aligned
        raise DeviceError(
            f"{type(spec).__name__}: its page at byte {offset} of {stride}-byte blocks cannot be viewed as its "
            f"declared dtypes ({exc}); align the packed layout's offsets and block stride to the dtypes."
        ) from exc
    if len(out) == 1 and not as_tuple:
        return out[0]
    return out


def allocate_kv_caches(config: KVCacheConfig, device: str | torch.device = "cpu") -> dict[str, LayerCache]:
    """Allocate ``config``'s tensors (zeroed) and return each layer's typed views of its buffer.

    A layer's cache is one tensor, or a tuple when its spec declares several views (Mamba states) or
    ``device_view_is_tuple``; shapes come from the spec's ``SpecTraits.device_views``.
    """
    specs = layer_specs_of(config)
    caches: dict[str, LayerCache] = {}
    for tensor in config.kv_cache_tensors:
        buffer = torch.zeros(tensor.size, dtype=torch.int8, device=device)
        for i, name in enumerate(tensor.shared_by):
            spec = specs[name]
            stride = spec.page_size_bytes if tensor.block_stride is None else tensor.block_stride
            offset = tensor.offsets[i] if tensor.offsets else 0
            if offset + spec.page_size_bytes > stride:
                raise DeviceError(
                    f"Layer {name}'s page of {spec.page_size_bytes} bytes at byte {offset} does not fit the "
                    f"tensor's {stride}-byte blocks."
                )
            num_blocks = tensor.size // stride
            if num_blocks < config.num_blocks:
                raise DeviceError(
                    f"Tensor of {tensor.size} bytes holds {num_blocks} blocks of layer {name}, fewer than the "
                    f"config's {config.num_blocks}."
                )
            caches[name] = _views(buffer, spec, config.num_blocks, tensor.block_stride, offset)
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
