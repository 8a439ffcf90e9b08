"""Bad input, drawn (issue 34): pairs of bad or contradicting options over both commands, bad models and every
kind of bad trace file. Each must end with exit code 1 or 2, no traceback, nothing written, within seconds
and under a memory cap (the commands run in a worker process whose data segment is capped at 2 GiB more
than kvspec and torch take; a command that grows with its input fails there with MemoryError)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

MEMORY_CAP = 2 << 30
ROOT = Path(__file__).resolve().parents[3]

#: (option, value or None for a flag) pairs that are wrong alone, per command.
PLAN_BAD: list[tuple[str, str | None]] = [
    ("--memory", "-1GiB"),
    ("--memory", "lots"),
    ("--memory", "1e400"),
    ("--memory", "1KiB"),
    ("--tp", "0"),
    ("--tp", "x"),
    ("--tp", "3"),
    ("--pp", "1000"),
    ("--max-model-len", "0"),
    ("--max-model-len", "9999999999"),
    ("--block-size", "7"),
    ("--kv-cache-dtype", "nope"),
    ("--dtype", "fp7"),
    ("--vllm-release", "0.1"),
    ("--mamba-cache-mode", "align"),
    ("--plot", "{tmp}/x.txt"),
    ("--plot", "{tmp}/no/such/folder.png"),
    ("--plot", "/proc/version.png"),
]
SIMULATE_BAD: list[tuple[str, str | None]] = [
    ("--requests", "0"),
    ("--requests", "1000000000"),
    ("--sweep", "100"),
    ("--limit", "0"),
    ("--step-time", "a,b"),
    ("--retention-interval", "-1"),
    ("--policy", "nope"),
    ("--timed", None),
    ("--sweep", "3"),
    ("--device", "tpu"),
    ("--num-blocks", "0"),
    ("--prompt-len", "0"),
    ("--memory", "0"),
    ("--max-model-len", "999999999"),
    ("--block-size", "12"),
]
#: Options that are fine on their own (a pair with a bad one must still be refused).
HARMLESS = [("--json", None), ("--no-plugins", None)]
BAD_MODELS = [
    "no/such-model",
    "{tmp}",
    "{tmp}/bad.json",
    "{tmp}/unknown.json",
    "{tmp}/pattern.json",
    "/dev/zero",
]
BAD_TRACES = [
    "empty.jsonl",
    "binary.jsonl",
    "truncated.jsonl.gz",
    "nan.jsonl",
    "huge_id.jsonl",
    "list.jsonl",
    "deep.jsonl",
    "missing.jsonl",
    "fifo",
    "/dev/zero",
    "{tmp}",
    "long_line.jsonl",
    "descending.jsonl",
]


def _write_inputs(tmp: Path) -> None:
    (tmp / "bad.json").write_text('{"model_type": "llama",')
    (tmp / "unknown.json").write_text(json.dumps({"model_type": "mystery", "num_hidden_layers": 2}))
    (tmp / "pattern.json").write_text(
        json.dumps(
            {
                "model_type": "nemotron_h",
                "num_hidden_layers": 4,
                "hybrid_override_pattern": "M*X-",
                "num_attention_heads": 8,
                "hidden_size": 512,
            }
        )
    )
    good = {"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}
    lines = {
        "empty.jsonl": "",
        "nan.jsonl": '{"timestamp": NaN, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n',
        "huge_id.jsonl": json.dumps({**good, "hash_ids": [1 << 40, 2]}) + "\n",
        "list.jsonl": json.dumps(good) + "\n[1, 2]\n",
        "deep.jsonl": "[" * 100_000 + "\n",
        "descending.jsonl": json.dumps({**good, "timestamp": 5}) + "\n" + json.dumps(good) + "\n",
    }
    for name, text in lines.items():
        (tmp / name).write_text(text)
    (tmp / "binary.jsonl").write_bytes(bytes(range(256)) * 64)
    (tmp / "truncated.jsonl.gz").write_bytes(gzip.compress((json.dumps(good) + "\n").encode() * 50)[:40])
    with (tmp / "long_line.jsonl").open("wb") as handle:
        handle.write(b'{"timestamp": 0, "output_length": 1, "hash_ids": [' + b"7, " * 1_500_000 + b"7]}\n")
    os.mkfifo(tmp / "fifo")


def _option(pair: tuple[str, str | None], tmp: Path) -> list[str]:
    flag, value = pair
    return [flag] if value is None else [flag, value.format(tmp=tmp)]


@st.composite
def bad_command(draw: st.DrawFn, tmp: Path) -> list[str]:
    kind = draw(st.sampled_from(["plan", "simulate", "model", "trace"]))
    extra = draw(st.lists(st.sampled_from(HARMLESS), max_size=1))
    if kind == "model":
        command = draw(st.sampled_from(["plan", "simulate"]))
        argv = [command, draw(st.sampled_from(BAD_MODELS)).format(tmp=tmp)]
    elif kind == "trace":
        name = draw(st.sampled_from(BAD_TRACES))
        trace = name.format(tmp=tmp) if name.startswith(("/", "{")) else str(tmp / name)
        argv = ["simulate", "llama-3.1-8b", "--trace", trace]
        # A second option that applies to a replay, so bad files are met in several modes.
        argv += draw(st.sampled_from([[], ["--timed"], ["--limit", "5"], ["--policy", "lru,lfu"]]))
    else:
        pool = PLAN_BAD if kind == "plan" else SIMULATE_BAD
        first, second = (
            draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2, unique=True).map(tuple)),
            None,
        )
        argv = [kind]
        for pair in first:
            argv += _option(pair, tmp)
        del second
    for pair in extra:
        argv += _option(pair, tmp)
    return argv


def _run(cases: list[list[str]]) -> list[dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.cli.bad_input_worker", str(MEMORY_CAP)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "KVSPEC_TYPECHECK": "api", "COLUMNS": "120"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bad-input")
    _write_inputs(tmp)
    return tmp


def test_bad_input_ends_cleanly(inputs: Path) -> None:
    # No shrinking: each example is a worker process; a failure reports its whole case list, which names the
    # failing command line.
    @settings(
        max_examples=4,
        deadline=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(bad_command(inputs), min_size=15, max_size=15))
    def check(cases: list[list[str]]) -> None:
        before = sorted(p.name for p in inputs.iterdir())
        for result in _run(cases):
            assert result["code"] in (1, 2), result
            assert not result["escaped"] and not result["traceback_printed"], result
            assert isinstance(result["seconds"], float) and result["seconds"] < 20, result
            assert result["said_why"], result
        assert sorted(p.name for p in inputs.iterdir()) == before  # nothing written

    check()
