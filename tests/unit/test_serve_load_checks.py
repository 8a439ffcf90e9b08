"""The serve load run's own logic (tests/vllm_serve/load.py), without a server: the workload carries the faults
it claims, and every way a server can fail the run is caught by ``failures``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.vllm_serve.load import failures, load_workload


def _row(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "config": "kvspec-lru",
        "requests": 320,
        "completed": 272,
        "hung_up": 32,
        "refused": 16,
        "errors": 0,
        "error_details": [],
        "wrong_refusals": [],
        "preemptions": 38,
        "running_after": 0.0,
        "waiting_after": 0.0,
        "kv_usage_after": 0.0,
        "blocks_leaked": 0,
        "probe_checks": 1,
        "probe_failures": [],
        "log_errors": [],
        "healthy_after": True,
        "kvspec_manages": True,
    }
    row.update(changes)
    return row


def test_the_workload_has_its_faults() -> None:
    asks = load_workload(320)
    assert len(asks) == 320 and len({a.name for a in asks}) == 320
    assert sum(a.over_limit for a in asks) == 16 and sum(a.hang_up for a in asks) == 32
    assert not any(a.over_limit and a.hang_up for a in asks)
    assert all(len(a.prompt.split()) == 250 for a in asks if a.over_limit)
    assert (
        max(len(a.prompt.split()) for a in asks if not a.over_limit) <= 120
    )  # ~325 tokens: fits 512 with output
    assert load_workload(320) == asks  # seeded: every server gets the same requests


def test_a_clean_row_passes() -> None:
    assert failures(_row()) == []
    assert failures(_row(config="stock", blocks_leaked=None, probe_checks=0, kvspec_manages=False)) == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"errors": 1, "completed": 271}, "1 requests failed"),
        ({"wrong_refusals": ["q3"]}, "refused or not refused"),
        ({"completed": 271}, "requests unaccounted for"),
        ({"running_after": 1.0}, "still running 1.0"),
        ({"kv_usage_after": 0.025}, "KV-cache usage 0.025 after the load"),
        ({"log_errors": ["Traceback (most recent call last):"]}, "errors in the server log"),
        ({"healthy_after": False}, "stopped answering"),
        ({"blocks_leaked": 1}, "blocks leaked: 1"),
        ({"probe_checks": 0}, "blocks leaked: 0 (0 idle checks)"),
        ({"probe_failures": [{"invariants": "AssertionError"}]}, "invariants broken"),
        ({"kvspec_manages": False}, "did not say it manages"),
        ({"preemptions": 0}, "no preemption"),
        ({"hung_up": 0, "completed": 304}, "the faults did not happen"),
    ],
)
def test_each_failure_is_caught(changes: dict[str, Any], message: str) -> None:
    assert any(message in problem for problem in failures(_row(**changes)))
