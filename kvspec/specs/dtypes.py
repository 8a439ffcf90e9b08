"""Dtypes of KV cache specs: bytes per element, quantisation modes and the engine's cache-dtype strings."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Final

import torch


def nvfp4_full(head_size: int) -> int:
    """Bytes-equivalent elements of one NVFP4 head: packed 4-bit values plus one scale per 16."""
    return head_size // 2 + head_size // 16


#: Bytes per element of every dtype torch defines, read once at import and never written (planning asks
#: once per layer, and a dict lookup costs a fifth of torch's attribute).
_DTYPE_SIZES: Final[Mapping[torch.dtype, int]] = {
    d: int(d.itemsize) for d in vars(torch).values() if isinstance(d, torch.dtype)
}


def dtype_size(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    size = _DTYPE_SIZES.get(dtype)
    return int(dtype.itemsize) if size is None else size


class KVQuantMode(IntEnum):
    """How the KV cache is quantised (vLLM's numbering)."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    NVFP4 = 4

    # Module constants, not KVQuantMode.X: an enum class attribute lookup costs more than the test itself,
    # and page sizes (which ask both) are computed once per layer when planning.
    @property
    def is_per_token_head(self) -> bool:
        """Modes that store one fp32 scale per token and head for K and for V."""
        return self in _PER_TOKEN_HEAD_MODES

    @property
    def is_nvfp4(self) -> bool:
        return self is _NVFP4


_PER_TOKEN_HEAD_MODES = frozenset({KVQuantMode.INT8_PER_TOKEN_HEAD, KVQuantMode.FP8_PER_TOKEN_HEAD})
_NVFP4 = KVQuantMode.NVFP4


def get_kv_quant_mode(kv_cache_dtype: str) -> KVQuantMode:
    """Map an engine's ``kv_cache_dtype`` string to a quantisation mode (unknown strings: NONE)."""
    if kv_cache_dtype == "int8_per_token_head":
        return KVQuantMode.INT8_PER_TOKEN_HEAD
    if kv_cache_dtype == "fp8_per_token_head":
        return KVQuantMode.FP8_PER_TOKEN_HEAD
    if kv_cache_dtype == "nvfp4":
        return KVQuantMode.NVFP4
    if kv_cache_dtype.startswith("fp8"):
        return KVQuantMode.FP8_PER_TENSOR
    return KVQuantMode.NONE


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    """True for every cache dtype other than "auto" (the model dtype)."""
    return kv_cache_dtype != "auto"


def kv_cache_uses_per_token_head_scales(kv_cache_dtype: str) -> bool:
    return get_kv_quant_mode(kv_cache_dtype).is_per_token_head
