"""Field checks the spec families share (each raises SpecValidationError naming the class and field)."""

from __future__ import annotations

import torch

from kvspec.errors import SpecValidationError


def require_positive(spec: object, field: str, value: object) -> None:
    """Raise SpecValidationError unless ``value`` is a positive int."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecValidationError(f"{type(spec).__name__}.{field} must be a positive int, got {value!r}.")


def require_non_negative(spec: object, field: str, value: object) -> None:
    """Raise SpecValidationError unless ``value`` is an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecValidationError(f"{type(spec).__name__}.{field} must be an int >= 0, got {value!r}.")


def require_optional_positive(spec: object, field: str, value: object) -> None:
    if value is not None:
        require_positive(spec, field, value)


def require_dtype(spec: object, field: str, value: object) -> None:
    if not isinstance(value, torch.dtype):
        raise SpecValidationError(
            f"{type(spec).__name__}.{field} must be a torch.dtype (e.g. torch.bfloat16), got {value!r}."
        )
