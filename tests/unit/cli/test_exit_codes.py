"""One rule for every command's exit code (issue 51): what was typed and is refused exits 2 (as argparse's
own refusals), any other refusal exits 1 (a trace it cannot read, a cache too small), each with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec import errors
from kvspec.cli.args import USAGE_ERRORS, refuse
from kvspec.cli.main import main

ROWS = [{"timestamp": i, "input_length": 600, "output_length": 2, "hash_ids": [1, 2 + i]} for i in range(3)]


def _trace(tmp_path: Path) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return str(path)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.OptionError("--x"), 2),
        (errors.TierConfigError("host tier"), 2),  # an option value, by its base class
        (errors.RouterOptionError("router option"), 2),
        (errors.UnknownRouterError("nope"), 2),
        (errors.FleetConfigError("ray"), 2),
        (errors.PluginError("plugin"), 2),
        (errors.TraceFormatError("line 3"), 1),
        (errors.PlanningError("cannot plan"), 1),
        (errors.RoutingError("router broke"), 1),
    ],
)
def test_refuse_says_one_line_and_returns_the_code(
    error: errors.KVSpecError, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert refuse(error) == code
    assert capsys.readouterr().err == f"kvspec: error: {error}\n"
    assert refuse(error, "said otherwise") == code
    assert capsys.readouterr().err == "kvspec: error: said otherwise\n"


def test_every_usage_error_is_a_kvspec_error() -> None:
    assert all(issubclass(cls, errors.KVSpecError) for cls in USAGE_ERRORS)


def test_the_same_refusal_exits_alike_in_simulate_and_fleet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Memory that holds no request of the model: 1 in both, in the same words (fleet said 2 for every
    refusal but a bad trace); an unknown eviction policy: 2 in both."""
    trace = _trace(tmp_path)
    small = ["--memory", "1MiB"]
    assert main(["simulate", "llama-3.1-8b", "--trace", trace, *small]) == 1
    simulate_err = capsys.readouterr().err
    assert main(["fleet", "llama-3.1-8b", "--trace", trace, "--no-plugins", *small]) == 1
    fleet_err = capsys.readouterr().err
    # The same words too (fleet printed the planner's "-1048576 bytes"): the command's option, what fits.
    assert fleet_err == simulate_err
    assert simulate_err.startswith(
        "kvspec: error: one request of max_model_len 131,072 tokens needs 16.00 GiB"
    )
    assert simulate_err.endswith("raise --memory.\n") and simulate_err.count("\n") == 1
    policy = ["--policy", "no-such-policy"]
    assert main(["simulate", "llama-3.1-8b", "--trace", trace, *policy]) == 2
    assert "no-such-policy" in capsys.readouterr().err
    assert (
        main(["fleet", "llama-3.1-8b", "--trace", trace, "--no-plugins", "--eviction", "no-such-policy"]) == 2
    )
    assert "no-such-policy" in capsys.readouterr().err
