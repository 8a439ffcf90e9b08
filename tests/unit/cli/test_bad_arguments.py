"""Bad input through the installed ``kvspec`` command and the config loader: one line on stderr, exit 2
(bad input) or 1 (does not fit), never a traceback or a hang; and random junk never escapes otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec import KVSpecError
from kvspec.cli.main import make_parser
from kvspec.errors import ModelConfigError
from kvspec.models import layout_from_config, load_model_config

KVSPEC = Path(sys.executable).parent / "kvspec"
LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it."""
    return subprocess.run(
        [str(KVSPEC), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def _config(tmp: Path, **changes: Any) -> str:
    path = tmp / "config.json"
    path.write_text(json.dumps({**LLAMA, **changes}))
    return str(path)


def _write(tmp: Path, name: str, data: bytes) -> str:
    path = tmp / name
    path.write_bytes(data)
    return str(path)


def _config_dir(tmp: Path) -> str:
    (tmp / "model" / "config.json").mkdir(parents=True)
    return str(tmp / "model")


def _fifo(tmp: Path) -> str:
    path = tmp / "f.json"
    os.mkfifo(path)
    return str(path)


CASES: list[tuple[str, Callable[[Path], list[str]], int, str]] = [
    (
        "simulate on a CPU-only torch with cuda",
        lambda t: ["simulate", "--device", "cuda"],
        2,
        "CUDA is not available",
    ),
    ("unknown device", lambda t: ["simulate", "--device", "banana"], 2, "Unknown device 'banana'"),
    ("npu without torch_npu", lambda t: ["simulate", "--device", "npu"], 2, "needs torch_npu"),
    ("memory overflow", lambda t: ["plan", "--memory", "1e400B"], 2, "larger than 1 EiB"),
    ("memory rounds to zero", lambda t: ["plan", "--memory", "0.5B"], 2, "at least 1 byte"),
    ("plot into a missing folder", lambda t: ["plan", "--plot", "/nonexistent/x.png"], 2, "does not exist"),
    (
        "plot with an unknown suffix",
        lambda t: ["plan", "--plot", str(t / "x.foo")],
        2,
        "use a file ending in",
    ),
    (
        "simulate plot into a missing folder",
        lambda t: ["simulate", "--plot", "/nonexistent/a.png"],
        2,
        "does not exist",
    ),
    ("a million requests", lambda t: ["simulate", "--requests", "1000000"], 2, "at most 100,000"),
    ("binary config", lambda t: ["plan", _write(t, "c.json", bytes(range(256)))], 2, "not UTF-8"),
    (
        "non-UTF-8 config",
        lambda t: ["plan", _write(t, "c.json", '{"model_type": "ll\xe9ma"}'.encode("latin-1"))],
        2,
        "not UTF-8",
    ),
    ("config.json is a folder", lambda t: ["plan", _config_dir(t)], 2, "not a regular file"),
    ("config is a FIFO", lambda t: ["plan", _fifo(t)], 2, "not a regular file"),
    (
        "deeply nested JSON",
        lambda t: ["plan", _write(t, "c.json", b"[" * 100_000 + b"]" * 100_000)],
        2,
        "nests JSON too deeply",
    ),
    (
        "torch_dtype 16",
        lambda t: ["plan", _config(t, torch_dtype=16)],
        2,
        "'torch_dtype' must be a dtype name",
    ),
    (
        "model_type a list",
        lambda t: ["plan", _config(t, model_type=["llama"])],
        2,
        "'model_type' must be a non-empty string",
    ),
    ("ten million layers", lambda t: ["plan", _config(t, num_hidden_layers=10_000_000)], 2, "at most 10,000"),
    (
        "dict in layer_types",
        lambda t: ["plan", _config(t, layer_types=[{"a": 1}] * 32)],
        2,
        "unknown layer type",
    ),
    (
        "llama4 interval 0",
        lambda t: [
            "plan",
            _config(t, model_type="llama4", no_rope_layer_interval=0, attention_chunk_size=8192),
        ],
        2,
        "'no_rope_layer_interval' must be a positive integer",
    ),
    (
        "llama4 interval a string",
        lambda t: ["plan", _config(t, model_type="llama4", no_rope_layer_interval="4")],
        2,
        "'no_rope_layer_interval' must be a positive integer",
    ),
    (
        "jamba offset a string",
        lambda t: ["plan", _config(t, model_type="jamba", attn_layer_period=8, attn_layer_offset="abc")],
        2,
        "'attn_layer_offset' must be an integer >= 0",
    ),
    (
        "qwen2 max_window_layers a string",
        lambda t: [
            "plan",
            _config(
                t, model_type="qwen2", use_sliding_window=True, sliding_window=4096, max_window_layers="4"
            ),
        ],
        2,
        "'max_window_layers' must be an integer >= 0",
    ),
    (
        "tp 3 with 8 KV heads",
        lambda t: ["plan", "--tp", "3"],
        2,
        "does not divide the llama model's 32 attention heads",
    ),
    ("tp 64 with 32 heads", lambda t: ["plan", "--tp", "64"], 2, "tensor_parallel_size=64 does not divide"),
]


@pytest.mark.parametrize(("label", "args", "code", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_through_the_installed_command(
    label: str, args: Callable[[Path], list[str]], code: int, message: str, tmp_path: Path
) -> None:
    proc = run(*args(tmp_path))
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    # One error line, last (argparse prints its usage lines above it).
    assert [line for line in lines if "error:" in line] == [lines[-1]]


def test_tp_that_replicates_kv_heads_is_accepted_and_each_rank_holds_one() -> None:
    proc = run("plan", "--tp", "16", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["stages"][0]["groups"][0]["page_size_bytes"] == 64 * 1 * 2 * 128 * 2  # one KV head per rank


CLOSED_PIPE = """
import io, sys
from kvspec.cli.main import main

class ClosedPipe(io.TextIOWrapper):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

sys.stdout = ClosedPipe(open(sys.stdout.fileno(), "wb", closefd=False))
raise SystemExit(main(["plan", "--json"]))
"""


def test_plan_json_into_a_closed_pipe_is_quiet() -> None:
    """`kvspec plan --json | head`: the reader went away; exit 0 without a BrokenPipeError traceback."""
    proc = subprocess.run([sys.executable, "-c", CLOSED_PIPE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "BrokenPipeError" not in proc.stderr and "Traceback" not in proc.stderr
    shell = subprocess.run(
        f"'{KVSPEC}' plan --json | head -c 10", shell=True, capture_output=True, text=True, timeout=60
    )
    assert shell.stdout == '{\n  "model' and "Traceback" not in shell.stderr


def test_no_plot_message_when_the_model_does_not_fit(tmp_path: Path) -> None:
    proc = run("plan", "--memory", "1GiB", "--plot", str(tmp_path / "p.png"))
    assert proc.returncode == 1
    assert "no plot written" in proc.stderr and not (tmp_path / "p.png").exists()


# -- random junk: a ModelConfigError or a layout, never another exception ---------------------------

JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=8)
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=12,
)
KEYS = sorted(
    {
        *LLAMA,
        "layer_types",
        "sliding_window",
        "attention_chunk_size",
        "no_rope_layers",
        "no_rope_layer_interval",
        "attn_layer_period",
        "attn_layer_offset",
        "use_sliding_window",
        "max_window_layers",
        "sliding_window_pattern",
        "text_config",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "mamba_expand",
        "decoder_layers",
        "d_model",
    }
)
MODEL_TYPES = st.sampled_from(
    ["llama", "gemma2", "gemma3", "llama4", "jamba", "qwen2", "deepseek_v3", "whisper", "mistral"]
)


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(
    model_type=MODEL_TYPES,
    changes=st.dictionaries(st.sampled_from(KEYS), JSON, max_size=5),
    tp=st.integers(1, 8),
)
def test_config_loader_never_escapes_with_another_exception(
    model_type: str, changes: dict[str, Any], tp: int
) -> None:
    cfg = {**LLAMA, "model_type": model_type, **changes}
    try:
        layout_from_config(cfg, tensor_parallel_size=tp)
    except KVSpecError:
        pass


@settings(max_examples=200, deadline=2000)
@given(data=st.binary(max_size=200))
def test_config_file_junk_is_a_model_config_error(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("junk") / "config.json"
    path.write_bytes(data)
    try:
        _, cfg = load_model_config(str(path))
        layout_from_config(cfg)
    except KVSpecError:
        pass


ARGS = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "plan",
                "simulate",
                "inspect",
                "--memory",
                "--tp",
                "--pp",
                "--requests",
                "--block-size",
                "--json",
                "--device",
                "--max-model-len",
                "--kv-cache-dtype",
                "-h",
            ]
        ),
        st.text(max_size=6),
        st.integers(-5, 10**6).map(str),
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=2000)
@given(argv=ARGS)
def test_argument_parser_exits_2_or_parses(argv: list[str]) -> None:
    parser = make_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        assert exc.code in (0, 2)  # -h prints help and exits 0


def test_model_config_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ModelConfigError, match=r"c\.json is not UTF-8"):
        load_model_config(str(path))
