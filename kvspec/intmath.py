"""Integer arithmetic on token and block counts (torch-free; every layer may import it)."""

from __future__ import annotations

import math


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints: blocks needed to hold ``a`` tokens of ``b`` per block."""
    return -(a // -b)


def round_up(x: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``x``."""
    return cdiv(x, multiple) * multiple


def prod(shape: tuple[int, ...]) -> int:
    """Number of elements of a tensor of ``shape``."""
    return math.prod(shape)
