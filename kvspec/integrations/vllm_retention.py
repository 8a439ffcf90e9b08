"""A request's retention as vLLM carries it: ``vllm_xargs`` / ``SamplingParams.extra_args`` key and value.

Kept apart (no torch, no vLLM) so the vLLM plugin can be imported in every vLLM process at no cost.
"""

from __future__ import annotations

import math
from typing import Final

#: The key of a request's retention in vLLM's ``vllm_xargs`` / ``SamplingParams.extra_args`` (seconds).
RETENTION_XARG: Final = "kv_retention_seconds"


def parse_retention_seconds(value: object) -> float:
    """``value`` as a retention in seconds (a finite number >= 0, not a bool); ``ValueError`` naming what is
    wrong otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{RETENTION_XARG} must be a number of seconds >= 0, got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{RETENTION_XARG} must be a finite number of seconds >= 0, got {value!r}")
    return seconds


__all__ = ["RETENTION_XARG", "parse_retention_seconds"]
