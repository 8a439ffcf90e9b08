"""Argument types shared by the ``kvspec`` sub-commands (sizes with units, positive counts)."""

from __future__ import annotations

import argparse
import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(-?[0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """'80GiB' -> 85899345920; accepts B, KB/MB/GB/TB (powers of 10) and KiB/MiB/GiB/TiB (powers of 2)."""
    match = _SIZE.match(text)
    if not match or match[2].lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}; use e.g. 80GiB, 512MiB or 1e9")
    value = float(match[1]) * _UNITS[match[2].lower()]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return int(value)


def positive_int(text: str) -> int:
    """argparse type: an int > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
