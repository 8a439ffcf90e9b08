"""The random differential against the installed vLLM (tests/vllm/differential.py), a seeded subset sized
for CI; ``python -m tests.vllm.differential --workloads 2000`` runs the full count."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_manager")

from tests.vllm import differential

#: Workloads in CI (about 20 s on 2 cores); the first 2,000 seeds are the reported run.
CI_WORKLOADS = 400


@pytest.fixture(scope="module")
def subset() -> list[differential.Outcome]:
    differential.quiet_logs()
    return differential.run_many(0, CI_WORKLOADS)


def test_no_divergence_and_every_family_and_setting_covered(subset: list[differential.Outcome]) -> None:
    report = differential.summary(subset)
    assert not [o for o in subset if o.divergence or o.stalled or o.refused], report
    families = {f for o in subset if not o.expected for f in o.families}
    # vLLM 0.34 has no Mamba "all" mode.
    expected = set(differential.FAMILIES) - (set() if differential.RELEASE_0_23 else {"mamba_all"})
    assert families == expected, report
    settings = {s for o in subset for s in o.features}
    assert {
        "DCP 2",
        "EAGLE",
        "lookahead",
        "mixed block sizes",
        "caching off",
        "LoRA",
        "cache salts",
    } <= settings
    if not differential.RELEASE_0_23:
        assert {"sparse retention", "Mamba blocks larger than the hash block"} <= settings
    assert sum(o.preemptions for o in subset) > 0 and sum(o.hit_tokens for o in subset) > 0
    assert sum(o.calls for o in subset) > 100_000  # every call was compared, not a handful


def test_each_listed_difference_is_met(subset: list[differential.Outcome]) -> None:
    """The expected-differences list cannot go stale: each entry is met by some workload of the subset."""
    met = {o.expected for o in subset}
    assert set(differential.ACTIVE_DIFFERENCES) <= met


# Workloads that diverged before this fixes (the fix each one checks).
REGRESSIONS = {
    3: "KV events carry vLLM's per-block extra keys (one entry per stored block)",
    29: "Mamba 'align' speculative blocks follow the skipped positions, the new block last",
    30: "Mamba 'align' with EAGLE and prefix caching is accepted",
    65: "Mamba 'align' records the prefix hit's state block and frees it",
    81: "a KV event for a Mamba group whose new blocks are all null",
    112: "Mamba 'align' frees the state block from two steps ago to the free queue's tail",
    1046: "EAGLE's one-block extension once per candidate length; a Mamba hit is never only null blocks",
}


@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_regression_workloads(seed: int) -> None:
    differential.quiet_logs()
    outcome = differential.run_workload(differential.draw_workload(seed, larger_mamba_blocks=False))
    assert outcome.divergence is None, REGRESSIONS[seed]
    assert outcome.steps > 3


# Workloads that diverged from vLLM 0.34 before the profile row each names (each row is needed: turning it
# off makes these diverge again).
REGRESSIONS_0_34 = {
    38: "partial_prompt_tail_entries: the prompt's last hash boundary inside a larger block is a cache entry",
    40: "mamba_align_frees_across_nulls: align frees every retired state past the prefill's null gaps",
    83: "eagle_margin_for_state_groups: no EAGLE margin for a Mamba group's hit search",
    11: "mamba_sparse_retention: under retention Mamba caches only the reachable states and the junction",
}


@pytest.mark.skipif(differential.RELEASE_0_23, reason="vLLM 0.34's behaviour")
@pytest.mark.parametrize("seed", sorted(REGRESSIONS_0_34))
def test_regression_workloads_0_34(seed: int) -> None:
    differential.quiet_logs()
    # Named before 2026-12-05's larger Mamba blocks: drawn as they were then.
    outcome = differential.run_workload(differential.draw_workload(seed, larger_mamba_blocks=False))
    assert outcome.divergence is None, REGRESSIONS_0_34[seed]
    assert outcome.expected is None and outcome.steps > 3


# Workloads with Mamba blocks larger than the hash block (vLLM's sub-block hits on) that diverged before the
# fix each one names.
REGRESSIONS_SUB_BLOCK = {
    320: "a sliding window's sparse retention keeps the tails at hash-block boundaries under sub-block hits",
}


@pytest.mark.skipif(differential.RELEASE_0_23, reason="vLLM 0.34's behaviour")
@pytest.mark.parametrize("seed", sorted(REGRESSIONS_SUB_BLOCK))
def test_regression_workloads_with_sub_block_hits(seed: int) -> None:
    differential.quiet_logs()
    workload = differential.draw_workload(seed)
    assert workload.mamba_block_factor > 1
    outcome = differential.run_workload(workload)
    assert outcome.divergence is None, REGRESSIONS_SUB_BLOCK[seed]
    assert outcome.expected is None and outcome.steps > 3


@pytest.fixture
def _tail_freeing_broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """kvspec's old Mamba rule: the stale state block goes where the next allocation takes it."""
    from kvspec.blocks.pool import BlockPool

    original = BlockPool.free_blocks

    def prepend_always(self: BlockPool, ordered_blocks: Any, prepend: bool = False) -> None:
        original(self, ordered_blocks, True)

    monkeypatch.setattr(BlockPool, "free_blocks", prepend_always)
    yield


@pytest.mark.usefixtures("_tail_freeing_broken")
def test_the_differential_sees_a_free_queue_order_change() -> None:
    differential.quiet_logs()
    outcomes = differential.run_many(0, 150)
    assert any(o.divergence for o in outcomes)
