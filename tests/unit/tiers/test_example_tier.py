"""The README's tier plugin registers, passes the kit and runs as an engine's host tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from examples.fifo_tier.plugin import register
from kvspec.contracts.spec import SchedulerLimits
from kvspec.engine.replay import replay_coordinator
from kvspec.engine.timed_replay import replay_timed
from kvspec.tiers import TierSettings, check_tier, registry
from tests.helpers import full_spec, make_config
from tests.unit.fleet.fleet_helpers import family_trace


@pytest.fixture(autouse=True)
def _restore_registry() -> Iterator[None]:
    saved = registry.snapshot()
    yield
    registry.restore(saved)


def test_the_fifo_tier_example() -> None:
    register()
    check_tier("example.fifo")

    # 12 GPU blocks: each 8-block family request evicts most of the other family; host memory brings it back.
    def replay(tiers: TierSettings | None) -> tuple[int, int]:
        coordinator = replay_coordinator(
            make_config([full_spec(16)], 13), SchedulerLimits(max_model_len=1024)
        )
        stats = replay_timed(
            family_trace([0, 1, 0, 1]), coordinator, max_num_batched_tokens=256, max_num_seqs=4, tiers=tiers
        )
        coordinator.check_invariants()
        return stats.first_admission_hit_tokens, 0 if stats.tiers is None else stats.tiers.first_hit_tokens[
            "host"
        ]

    gpu_only, _ = replay(None)
    both, host = replay(TierSettings(host_bytes=64 * full_spec(16).page_size_bytes, host_tier="example.fifo"))
    assert both == 2 * 6 * 16 > gpu_only  # each family's second request reuses its 6 shared blocks
    assert host == both - gpu_only > 0
