"""The README's router plugin registers, passes the kit and keeps a conversation on one instance."""

from __future__ import annotations

from examples.sticky_router.plugin import register
from kvspec.contracts.spec import SchedulerLimits
from kvspec.engine.step_time import StepTimeModel
from kvspec.fleet import FleetSettings, run_fleet
from kvspec.fleet.kit import check_router
from tests.helpers import full_spec, make_config
from tests.unit.fleet.fleet_helpers import family_trace


def test_the_sticky_router_example() -> None:
    register()
    assert check_router("example.sticky").reads == {"loads"}
    settings = FleetSettings(
        num_instances=4, router="example.sticky", max_num_batched_tokens=64, step_time=StepTimeModel()
    )
    report = run_fleet(
        family_trace([0, 1, 2] * 4),
        make_config([full_spec(16)], 60),
        SchedulerLimits(max_model_len=4096),
        settings,
    )
    assert report.total["reused_tokens"] == 9 * 96  # each family's later requests find its home's cache
    assert sorted(r["requests"] for r in report.instances)[-1] in (4, 8, 12)  # whole families per instance
