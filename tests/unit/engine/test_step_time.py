"""Step-time models, checked by hand against their formulas."""

from __future__ import annotations

import pytest

from kvspec.engine.step_time import DynoSimStepTime, StepBatch, StepTimeModel, parse_step_time
from kvspec.errors import SchedulingError


def test_dynosim_polynomial_by_hand() -> None:
    """Dynamo mocker's defaults: an 8,192-token prefill costs 4.209989e-7 * 8192^2 (28.2527) + 1.518344e-2 *
    8192 (124.3827) + 16.50142 = 169.1368 ms; decode at half the pool held costs -25.74 / 4 + 54.01 / 2 + 5.74
    = 26.31 ms; a step doing both pays both; decode floors at 1 ms; no work, no prefill cost."""
    model = DynoSimStepTime()
    prefill = StepBatch(prefill_tokens=8192, decode_tokens=0, num_requests=1)
    assert model.step_ms(prefill) == pytest.approx(169.1368, abs=1e-3)
    decode = StepBatch(
        prefill_tokens=0, decode_tokens=3, num_requests=3, active_kv_tokens=500, kv_capacity_tokens=1000
    )
    assert model.step_ms(decode) == pytest.approx(26.31)
    both = StepBatch(
        prefill_tokens=8192, decode_tokens=3, num_requests=4, active_kv_tokens=500, kv_capacity_tokens=1000
    )
    assert model.step_ms(both) == pytest.approx(169.1368 + 26.31, abs=1e-3)
    assert model.decode_ms(0.0) == pytest.approx(5.74) and model.decode_ms(1.0) == pytest.approx(34.01)
    assert DynoSimStepTime(decode_constant=-10.0).decode_ms(0.0) == 1.0
    assert model.prefill_ms(0) == 0.0


def test_linear_model_and_names() -> None:
    """6 + 0.06 * 100 tokens + 0.01 * 2 requests = 12.02 ms; "dynosim" names Dynamo's; anything else must
    be three numbers."""
    assert StepTimeModel().step_ms(
        StepBatch(prefill_tokens=99, decode_tokens=1, num_requests=2)
    ) == pytest.approx(12.02)
    assert isinstance(parse_step_time("dynosim"), DynoSimStepTime)
    assert parse_step_time("1,2,3") == StepTimeModel(base_ms=1.0, per_token_ms=2.0, per_request_ms=3.0)
    with pytest.raises(SchedulingError, match="give three numbers in milliseconds"):
        parse_step_time("fast")
    with pytest.raises(SchedulingError, match=r"base_ms must be >= 0 and finite"):
        StepTimeModel(base_ms=float("inf"))
