"""Step-time models: how long one engine step takes, in milliseconds of simulated time.

A timed replay (one instance or a fleet) advances each instance's clock by its model's ``step_ms`` for
the batch the scheduler formed. Two models ship:

- :class:`StepTimeModel` (``"BASE,PER_TOKEN,PER_REQUEST"``): linear in the step's tokens and requests;
  its defaults are illustrative (an 8B model on one recent GPU, order of magnitude), not a calibration.
- :class:`DynoSimStepTime` (``"dynosim"``): Dynamo's mocker's default ``polynomial`` timing (ai-dynamo's
  ``lib/mocker/src/common/perf_model.rs``): prefill ``4.209989e-7 T^2 + 1.518344e-2 T + 16.50142`` ms for
  the ``T`` uncached prompt tokens of the step, plus decode ``max(1, -25.74 p^2 + 54.01 p + 5.74)`` ms when
  the step decodes, ``p`` the fraction of the pool's tokens that running requests hold. Used to replay a
  fleet under DynoSim's assumptions, side by side with it (``nox -s dynosim``).

A plugin's model is any object with ``step_ms(batch: StepBatch) -> float`` (:class:`StepTime`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvspec.errors import SchedulingError


@dataclass(frozen=True, kw_only=True, slots=True)
class StepBatch:
    """What one step computes. Tokens; ``active_kv_tokens`` / ``kv_capacity_tokens``: tokens the running
    requests' blocks hold after the step's allocation / tokens the pool holds (both in the scheduler's
    block, every block counted as full).

    Invariants: every count >= 0; ``prefill_tokens + decode_tokens`` is the step's token count;
    ``decode_tokens <= num_requests``."""

    prefill_tokens: int
    decode_tokens: int
    num_requests: int
    active_kv_tokens: int = 0
    kv_capacity_tokens: int = 1

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens


@runtime_checkable
class StepTime(Protocol):
    """A step-time model: milliseconds for one step's batch (> 0 for a non-empty batch)."""

    def step_ms(self, batch: StepBatch) -> float: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimeModel:
    """One step's duration in milliseconds: ``base_ms + per_token_ms * tokens + per_request_ms * requests``
    (tokens: computed this step, prefill and decode; requests: in the batch)."""

    base_ms: float = 6.0
    per_token_ms: float = 0.06
    per_request_ms: float = 0.01

    def __post_init__(self) -> None:
        for name in ("base_ms", "per_token_ms", "per_request_ms"):
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise SchedulingError(
                    f"StepTimeModel.{name} must be >= 0 and finite (milliseconds), got {value!r}"
                )
        if self.base_ms + self.per_token_ms + self.per_request_ms <= 0:
            raise SchedulingError("StepTimeModel: a step must take some time (all three costs are 0)")

    def step_ms(self, batch: StepBatch) -> float:
        return self.base_ms + self.per_token_ms * batch.num_tokens + self.per_request_ms * batch.num_requests

    @classmethod
    def parse(cls, text: str) -> StepTimeModel:
        """``"BASE,PER_TOKEN,PER_REQUEST"`` in milliseconds (the CLI's ``--step-time``)."""
        parts = text.split(",")
        try:
            base, per_token, per_request = (float(p) for p in parts)
        except ValueError:
            raise SchedulingError(
                f"--step-time {text!r}: give three numbers in milliseconds, BASE,PER_TOKEN,PER_REQUEST "
                "(e.g. 6,0.06,0.01), or 'dynosim'"
            ) from None
        return cls(base_ms=base, per_token_ms=per_token, per_request_ms=per_request)


@dataclass(frozen=True, kw_only=True, slots=True)
class DynoSimStepTime:
    """Dynamo's mocker's default polynomial timing (see the module docstring); coefficients in ms."""

    prefill_quadratic: float = 4.209989e-7
    prefill_linear: float = 1.518344e-2
    prefill_constant: float = 16.50142
    decode_quadratic: float = -25.74
    decode_linear: float = 54.01
    decode_constant: float = 5.74
    decode_floor_ms: float = 1.0

    def prefill_ms(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return self.prefill_quadratic * tokens * tokens + self.prefill_linear * tokens + self.prefill_constant

    def decode_ms(self, usage: float) -> float:
        p = min(max(usage, 0.0), 1.0)
        return max(
            self.decode_floor_ms,
            self.decode_quadratic * p * p + self.decode_linear * p + self.decode_constant,
        )

    def step_ms(self, batch: StepBatch) -> float:
        ms = self.prefill_ms(batch.prefill_tokens)
        if batch.decode_tokens:
            ms += self.decode_ms(batch.active_kv_tokens / max(1, batch.kv_capacity_tokens))
        return ms


#: Named step-time models (``--step-time NAME``).
NAMED_STEP_TIMES: dict[str, StepTime] = {"dynosim": DynoSimStepTime(), "default": StepTimeModel()}


def parse_step_time(text: str) -> StepTime:
    """A step-time model from the CLI: a name of :data:`NAMED_STEP_TIMES` or ``BASE,PER_TOKEN,PER_REQUEST``."""
    named = NAMED_STEP_TIMES.get(text.strip())
    if named is not None:
        return named
    return StepTimeModel.parse(text)


__all__ = [
    "NAMED_STEP_TIMES",
    "DynoSimStepTime",
    "StepBatch",
    "StepTime",
    "StepTimeModel",
    "parse_step_time",
]
