"""The real ``kvspec`` command, run in a subprocess."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.cli.args import parse_bytes
from kvspec.cli.main import main


def kvspec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvspec.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "KVSPEC_TYPECHECK": "full"},
    )


def test_bare_plan_runs_on_the_default_model() -> None:
    proc = kvspec("plan")
    assert proc.returncode == 0, proc.stderr
    assert "meta-llama/Llama-3.1-8B" in proc.stdout
    # vLLM 0.34's default block of 64 tokens: 40 GiB / (32 layers x 256 KiB)
    assert (
        "blocks: 5,120" in proc.stdout
        and "vLLM 0.34 rules: attention block size 64 (its default)" in proc.stdout
    )
    assert "token slots: 327,680" in proc.stdout  # 5,120 blocks x 64 tokens, one group
    assert "max concurrency: 2.50 requests of 131,072 tokens" in proc.stdout
    assert "family: dense decoder" in proc.stdout
    # Where vLLM 0.23 differs (16-token blocks): 40 GiB / (32 layers x 64 KiB)
    assert (
        "under vLLM 0.23 (default block size 16, attention block 16): 20,480 blocks, 1 group(s), 327,680 token slots"
        in proc.stdout
    )
    old = kvspec("plan", "--vllm-release", "0.23")
    assert "blocks: 20,480" in old.stdout
    assert "under vLLM 0.34 (default block size 64, attention block 64): 5,120 blocks" in old.stdout
    assert (
        "under vLLM" not in kvspec("plan", "--block-size", "32").stdout
    )  # an explicit block size: no other release


def test_plan_figures_of_a_mamba_hybrid() -> None:
    """Jamba under each release's rules: the attention block grows to hold a Mamba1 state of 311,296 bytes in
    steps of 64 (0.34: 128 tokens) or 16 (0.23: 80 tokens), and each release's line names its own block. A
    Mamba state is per request: bytes per token count the 4 attention layers only (4 x 2 x 8 x 128 x 2), the
    28 states are a per-request figure (one 512 KiB padded page each in mode "none")."""
    proc = kvspec("plan", "ai21labs/AI21-Jamba-1.5-Mini", "--json")
    plan = json.loads(proc.stdout)
    assert plan["block_size"] == 128 and plan["other_release"]["block_size"] == 80
    assert plan["bytes_per_token_per_rank"] == 4 * 2 * 8 * 128 * 2 == 16_384
    assert plan["state_bytes_per_request_per_rank"] == 28 * 128 * 4096
    assert sum(g["bytes_per_token"] for g in plan["stages"][0]["groups"]) == plan["bytes_per_token_per_rank"]
    tp2 = json.loads(kvspec("plan", "ai21labs/AI21-Jamba-1.5-Mini", "--json", "--tp", "2").stdout)
    assert tp2["bytes_per_token_per_rank"] == 8_192 and tp2["bytes_per_token_all_ranks"] == 16_384
    text = kvspec("plan", "ai21labs/AI21-Jamba-1.5-Mini").stdout
    assert "attention block size 128 (vLLM 0.34's default 64, raised to hold a state)" in text
    assert "under vLLM 0.23 (default block size 16, attention block 80)" in text
    # PP 2: each worker holds half the layers; the busiest stage bounds a worker.
    pp = json.loads(kvspec("plan", "llama-3.1-8b", "--json", "--pp", "2").stdout)
    assert pp["bytes_per_token_per_rank"] == 16 * 4096 and pp["bytes_per_token_all_ranks"] == 32 * 4096


def test_plan_capacity_error_names_kvspec_options() -> None:
    """Llama 3.1 8B at 131,072 tokens needs exactly 16 GiB; --memory 16GiB holds one 8 MiB block (32 layers x 256 KiB) back for the
    null block, so it does not fit, and the message says so in kvspec's options (not vLLM's)."""
    proc = kvspec("plan", "--memory", "16GiB")
    assert proc.returncode == 1
    assert "gpu_memory_utilization" not in proc.stdout
    assert "--memory leaves 16.00 GiB" not in proc.stdout
    assert "held back for the null block" in proc.stdout and "--max-model-len 131,008" in proc.stdout


def test_plan_json_hybrid(tmp_path: Path) -> None:
    png = tmp_path / "layout.png"
    proc = kvspec(
        "plan",
        "google/gemma-3-27b-it",
        "--memory",
        "20GiB",
        "--json",
        "--plot",
        str(png),
        "--vllm-release",
        "0.23",
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["fits"] and plan["num_blocks"] == 20 * 2**30 // (128 * 1024) // 10 == 16_384
    # vLLM 0.34's defaults: 64-token blocks (4x the page), sparse retention for the sliding-window groups.
    assert (
        plan["other_release"]["num_blocks"] == 16_384 // 4 and plan["prefix_cache_retention_interval"] is None
    )
    now = json.loads(kvspec("plan", "google/gemma-3-27b-it", "--memory", "20GiB", "--json").stdout)
    assert now["num_blocks"] == 4_096 and now["prefix_cache_retention_interval"] == 0
    groups = plan["stages"][0]["groups"]
    assert [g["layers"] for g in groups] == [9, 9, 9, 9, 8, 8, 10]
    assert {g["page_size_bytes"] for g in groups} == {131_072}
    assert plan["bytes_per_token_per_rank"] == plan["bytes_per_token_all_ranks"] == 507_904
    assert plan["token_slots"] == 16_384 // 7 * 16  # 7 groups share the blocks; each token takes one in each
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_tp_pp_and_dtypes() -> None:
    proc = kvspec(
        "plan",
        "llama-3.1-8b",
        "--tp",
        "2",
        "--pp",
        "2",
        "--memory",
        "8GiB",
        "--max-model-len",
        "8192",
        "--kv-cache-dtype",
        "fp8",
        "--block-size",
        "32",
        "--json",
    )
    plan = json.loads(proc.stdout)
    assert proc.returncode == 0
    # per worker: 16 layers, 4 KV heads, fp8: page = 32 * 2 * 4 * 128 = 32 KiB; 8 GiB / (16 x 32 KiB)
    assert plan["num_blocks"] == 8 * 2**30 // (16 * 32 * 1024) == 16_384
    assert [s["layers"] for s in plan["stages"]] == [16, 16]


def test_model_that_does_not_fit() -> None:
    proc = kvspec("plan", "deepseek-v3", "--memory", "10GiB", "--vllm-release", "0.23")
    assert proc.returncode == 1
    assert "Does not fit" in proc.stdout and "max_model_len that would fit: 152,784" in proc.stdout
    data = json.loads(
        kvspec("plan", "deepseek-v3", "--memory", "10GiB", "--json", "--vllm-release", "0.23").stdout
    )
    assert data["fits"] is False and data["max_model_len_that_fits"] == 152_784
    # vLLM 0.34's 64-token blocks: the fitting length is a whole number of them, one block less than the
    # memory holds (0.34 holds the null block back from the check)
    now = json.loads(kvspec("plan", "deepseek-v3", "--memory", "10GiB", "--json").stdout)
    assert now["max_model_len_that_fits"] == 152_704 == (152_784 // 64 - 1) * 64
    assert data["needed_bytes"] == 61 * 576 * 2 * 163_840


def test_unknown_model_exits_2() -> None:
    proc = kvspec("plan", "no-such-model")
    assert proc.returncode == 2 and "Unknown model 'no-such-model'" in proc.stderr


def test_negative_memory_exits_2() -> None:
    proc = kvspec("plan", "--memory=-80GiB")
    assert proc.returncode == 2 and "size must be at least 1 byte" in proc.stderr


def test_console_script() -> None:
    script = Path(sys.executable).parent / "kvspec"
    if not script.exists():
        pytest.skip("kvspec is not installed as a console script in this environment")
    proc = subprocess.run([str(script), "inspect", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["registrations"]) == 12


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "--memory=-5GiB"], "size must be at least 1 byte"),
        (["plan", "--memory", "0B"], "size must be at least 1 byte"),
        (["plan", "--memory", "lots"], "invalid size 'lots'"),
        (["plan", "--tp", "0"], "expected a positive integer"),
        (["plan", "--kv-cache-dtype", "fp3"], "invalid choice"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_parse_bytes() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes("512mib") == 512 * 2**20
    assert parse_bytes("1e9B") == parse_bytes("1E9b") == parse_bytes("1e+9 B") == 10**9
    for bad, message in (
        ("0.5B", "at least 1 byte"),
        ("1e400B", "larger than 1 EiB"),
        ("nan", "invalid size"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse_bytes(bad)


@pytest.mark.parametrize("bare", ["64", "0.5", "1e9", " 80 "])
def test_a_size_without_a_unit_is_refused_with_the_units_named(bare: str) -> None:
    """Issue 51: ``--memory 64`` planned 64 bytes and reported negative free bytes."""
    with pytest.raises(
        argparse.ArgumentTypeError, match=r"has no unit; write e\.g\. .*GiB \(units: B, KB, .*GiB, TiB"
    ):
        parse_bytes(bare)


def test_plot_under_pipeline_parallelism_says_which_stage(tmp_path: Path) -> None:
    png = tmp_path / "pp.png"
    proc = kvspec(
        "plan", "ai21labs/AI21-Jamba-1.5-Mini", "--pp", "2", "--memory", "40GiB", "--plot", str(png)
    )
    assert proc.returncode == 0, proc.stderr
    assert f"layout plot written to {png} (stage 0 of 2)" in proc.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_malformed_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    proc = kvspec("plan", str(bad))
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr


def test_inspect() -> None:
    data = json.loads(kvspec("inspect", "--json").stdout)
    assert len(data["registrations"]) == 12
    full = next(r for r in data["registrations"] if r["spec"].endswith(".FullAttentionSpec"))
    assert full["manager"].endswith(".FullAttentionManager") and full["identifier"] == "kvspec.full_attention"
    table = kvspec("inspect")
    assert table.returncode == 0 and "SlidingWindowMLASpec" in table.stdout


def test_inspect_says_whether_a_vllm_started_here_runs_on_kvspec(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KVSPEC_VLLM", raising=False)
    assert main(["inspect", "--no-plugins"]) == 0
    assert "vLLM plugin: off" in capsys.readouterr().out
    monkeypatch.setenv("KVSPEC_VLLM_EVICTION", "lfu")
    assert main(["inspect", "--no-plugins"]) == 0
    assert "ignored while off: KVSPEC_VLLM_EVICTION (set KVSPEC_VLLM=1" in capsys.readouterr().out
    monkeypatch.setenv("KVSPEC_VLLM", "1")
    monkeypatch.setenv("KVSPEC_VLLM_EVICTION", "retention")
    monkeypatch.setenv("KVSPEC_VLLM_RETENTION_SECONDS", "600")
    assert main(["inspect", "--no-plugins", "--json"]) == 0
    plugin = json.loads(capsys.readouterr().out)["vllm_plugin"]
    assert plugin == {
        "enabled": True,
        "eviction_policy": "retention",
        "default_retention_seconds": 600.0,
        "strict_release": False,
        "imports": [],
        "ignored_settings": [],
    }
    assert main(["inspect", "--no-plugins"]) == 0
    assert (
        "vLLM plugin: on (a vLLM started here runs on kvspec): eviction policy 'retention', default retention 600 s"
        in capsys.readouterr().out
    )
    monkeypatch.setenv("KVSPEC_VLLM_EVICTION", "nope")
    with pytest.raises(SystemExit) as info:
        main(["inspect", "--no-plugins"])
    assert info.value.code == 2
    assert "KVSPEC_VLLM_EVICTION='nope'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [[], ["plan"], ["inspect"], ["simulate"], ["events"]])
def test_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0 and "usage: kvspec" in capsys.readouterr().out


def test_readme_example_is_the_type_checked_file() -> None:
    root = Path(__file__).resolve().parents[3]
    readme = (root / "README.md").read_text()
    example = (root / "tests" / "typing" / "accept_readme_example.py").read_text().rstrip("\n")
    assert f"```python\n{example}\n```" in readme
    assert len([line for line in example.splitlines() if line.strip()]) <= 20
    assert "nox --no-venv -s lint mypy tests" in readme
    assert "nox --no-venv -s lint mypy tests" in (root / ".ci" / "run").read_text()


def test_readme_engine_snippet_runs() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = readme.split("## Using it in an engine", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["new_blocks"] is not None


NO_EXTRAS = """
import sys
sys.modules["rich"] = None  # what `pip install kvspec` without the cli extra looks like
sys.modules["matplotlib"] = None
from kvspec.cli.main import main
code = main(sys.argv[1:])
raise SystemExit(code)
"""


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["plan"], "token slots:"),
        (["inspect"], "kvspec.full_attention"),
        (["simulate", "tiny-full", "--requests", "4"], "prefix cache hit rate"),
    ],
)
def test_commands_run_without_the_cli_extra(args: list[str], expect: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NO_EXTRAS, *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout
    assert "[bold]" not in proc.stdout  # markup dropped, not printed


def test_plot_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NO_EXTRAS, "plan", "--plot", str(tmp_path / "p.png")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "pip install 'kvspec[cli]'" in proc.stderr


def test_token_slots_do_not_depend_on_max_model_len_and_ranks_are_named() -> None:
    """Token slots are what the blocks hold (not concurrency x max_model_len); bytes per token are per rank."""
    short = json.loads(kvspec("plan", "--max-model-len", "17", "--json", "--vllm-release", "0.23").stdout)
    assert short["token_slots"] == 327_680 and short["tokens_at_max_concurrency"] == 10_240 * 17
    # 64-token blocks: a 17-token request still takes a whole block
    short = json.loads(kvspec("plan", "--max-model-len", "17", "--json").stdout)
    assert short["token_slots"] == 327_680 and short["tokens_at_max_concurrency"] == 5_120 * 17
    tp2 = json.loads(kvspec("plan", "--tp", "2", "--json").stdout)
    assert tp2["bytes_per_token_per_rank"] == 65_536 and tp2["bytes_per_token_all_ranks"] == 131_072


def test_simulate_default_demo_shows_prefix_caching_and_a_starved_pool_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["prefix_cache_hit_rate"] > 0.5 and report["preemptions"] == 0 and not report["notes"]
    assert main(["simulate", "--json", "--num-blocks", "16"]) == 0  # 16 blocks of 64 tokens
    starved = json.loads(capsys.readouterr().out)
    assert starved["prefix_cache_hit_rate"] < report["prefix_cache_hit_rate"] / 4
    assert any("ran full" in note and "--num-blocks" in note for note in starved["notes"])


@pytest.mark.parametrize(
    "argv", [["--help"], ["plan", "--help"], ["simulate", "--help"], ["inspect", "--help"]]
)
def test_help_does_not_load_torch_or_the_library(argv: list[str]) -> None:
    """Help is answered from the parser alone (benchmarks/cli_startup.py times it)."""
    code = (
        "import sys\n"
        "from kvspec.cli.main import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'kvspec.coordinator', 'kvspec.registry.builtins') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_importing_kvspec_registers_the_builtins_on_first_use() -> None:
    code = (
        "import sys, kvspec\n"
        "print('torch' in sys.modules)\n"
        "print(len(kvspec.default_registry), 'torch' in sys.modules)\n"
        "from kvspec.planning import get_kv_cache_config\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["False", "12", "True"], proc.stderr


def test_plan_counts_a_uniform_groups_layers_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Layers of one type with two shapes share one uniform-type group: the group's per-request bytes are
    the layers' own bounds (issue 18, item 9: they were multiplied by the layer count again)."""
    args = {"block_size": 16, "head_size": 128, "dtype": "bfloat16"}
    layout = {
        "kvspec_layout": 1,
        "max_model_len": 4096,
        "layers": [
            {
                "name": "wide.{i}",
                "count": 4,
                "spec": "kvspec.full_attention",
                "args": {**args, "num_kv_heads": 8},
            },
            {
                "name": "narrow.{i}",
                "count": 2,
                "spec": "kvspec.full_attention",
                "args": {**args, "num_kv_heads": 4},
            },
        ],
    }
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(layout))
    assert main(["plan", str(path), "--memory", "4GiB", "--json"]) == 0
    stage = json.loads(capsys.readouterr().out)["stages"][0]
    (group,) = stage["groups"]
    assert group["spec"] == "UniformTypeKVCacheSpecs" and group["layers"] == 6
    # 4096 tokens x (4 layers x 8 heads + 2 layers x 4 heads) x 128 x 2 (K, V) x 2 bytes
    expected = 4096 * (4 * 8 + 2 * 4) * 128 * 2 * 2
    assert group["bytes_per_request"] == stage["bytes_per_request"] == expected


def _trace(tmp_path: Path, rows: list[dict[str, object]], name: str = "trace.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_simulate_trace_replays_the_cache_and_a_bad_line_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvspec simulate PRESET --trace FILE`: three requests sharing two 512-token blocks. The second hits
    them (1,024 tokens); the third also shares the second's third block, of which the second computed 76
    tokens, 64 of them in whole 16-token blocks: it hits 1,088. A trace id seen before is not a hit by
    itself: only what was computed and cached is."""
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 5, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 4]},
        {"timestamp": 9, "input_length": 1536, "output_length": 4, "hash_ids": [1, 2, 4]},
    ]
    trace = _trace(tmp_path, rows)
    assert main(["simulate", "llama-3.1-8b", "--trace", trace, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["requests"], report["prompt_tokens"], report["refused"]) == (3, 3736, 0)
    assert (report["hit_tokens"], report["hit_blocks"], report["prompt_blocks"]) == (1024 + 1088, 2 + 3, 9)
    assert main(["simulate", "llama-3.1-8b", "--trace", trace, "--json", "--limit", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["hit_tokens"] == 0
    bad = _trace(tmp_path, [rows[0], {"timestamp": 1, "input_length": 5, "output_length": 1}], "bad.jsonl")
    assert main(["simulate", "llama-3.1-8b", "--trace", bad]) == 1
    assert "bad.jsonl line 2: missing 'token_ids' or 'hash_ids'" in capsys.readouterr().err
    assert main(["simulate", "tiny-full", "--trace", trace]) == 2
    assert "name a preset or a config.json" in capsys.readouterr().err


def test_simulate_trace_sweep_hit_rate_grows_with_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--sweep 4`: four cache sizes from a tenth of what an unlimited replay keeps (plus room for the longest
    prompt) to all of it; the largest equals the unlimited replay, the smallest refuses the prompts it
    cannot hold."""
    rows = [
        {"timestamp": i, "input_length": 1000, "output_length": 1, "hash_ids": [i % 3, 10 + i]}
        for i in range(12)
    ]
    trace = _trace(tmp_path, rows)
    assert main(["simulate", "llama-3.1-8b", "--trace", trace, "--json"]) == 0
    unlimited = json.loads(capsys.readouterr().out)
    assert main(["simulate", "llama-3.1-8b", "--trace", trace, "--json", "--sweep", "4"]) == 0
    sweep = json.loads(capsys.readouterr().out)["sweep"]
    blocks = [row["num_blocks"] for row in sweep]
    # 64-token blocks (the default). Cached: 3 shared first blocks (8 blocks of 64 each) + 12 own second
    # blocks (488 tokens: 7 full blocks; the 40-token tails are never cached); plus the longest prompt's 16.
    assert blocks[-1] == 3 * 8 + 12 * 7 + 16 and blocks == sorted(blocks) and len(blocks) == 4
    assert blocks[0] == round(blocks[-1] / 10)
    rates = [row["token_hit_rate"] for row in sweep]
    assert rates == sorted(rates) and sweep[-1]["hit_tokens"] == unlimited["hit_tokens"] == 9 * 512
    assert sweep[0]["refused"] == 12 and sweep[0]["hit_tokens"] == 0  # 12 blocks hold no 16-block prompt


def test_simulate_trace_runs_a_sweep_in_a_process_pool_with_the_same_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--workers 2`: the runs of a sweep go to a process pool; every figure but the wall time is what
    the one-process loop gives, in the same order."""
    rows = [
        {"timestamp": i, "input_length": 1000, "output_length": 1, "hash_ids": [i % 3, 10 + i]}
        for i in range(12)
    ]
    trace = _trace(tmp_path, rows)
    argv = ["simulate", "llama-3.1-8b", "--trace", trace, "--json", "--sweep", "3", "--policy", "lru,lfu"]
    tables = []
    for workers in ("1", "2"):
        assert main([*argv, "--workers", workers]) == 0
        sweep = json.loads(capsys.readouterr().out)["sweep"]
        tables.append(
            [
                {k: v for k, v in row.items() if k not in ("wall_seconds", "prompt_tokens_per_second")}
                for row in sweep
            ]
        )
    assert tables[0] == tables[1] and len(tables[0]) == 6


def test_simulate_trace_compares_policies_and_refuses_an_unknown_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--policy lru,lfu --sweep 2`: one row per policy and size, each policy at the same sizes; with room
    for every prompt the policies agree (nothing is evicted). An unknown name is refused before the trace
    is read, naming the registered ones."""
    rows = [
        {"timestamp": i, "input_length": 1000, "output_length": 1, "hash_ids": [i % 3, 10 + i]}
        for i in range(12)
    ]
    trace = _trace(tmp_path, rows)
    argv = ["simulate", "llama-3.1-8b", "--trace", trace, "--json", "--sweep", "2", "--policy", "lru,lfu"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["eviction"] == ["lru", "lfu"]
    sweep = report["sweep"]
    assert [(row["policy"], row["num_blocks"]) for row in sweep] == [
        ("lru", 12),
        ("lru", 124),
        ("lfu", 12),
        ("lfu", 124),
    ]
    assert sweep[1]["hit_tokens"] == sweep[3]["hit_tokens"] == 9 * 512
    plot = tmp_path / "policies.png"
    assert main([*argv[:-1], "lru,slru", "--plot", str(plot)]) == 0 and plot.stat().st_size > 0
    capsys.readouterr()
    assert (
        main(["simulate", "llama-3.1-8b", "--trace", str(tmp_path / "missing.jsonl"), "--policy", "fifo"])
        == 2
    )
    assert (
        "Unknown eviction policy 'fifo'; registered: lru, hybrid, lfu, retention, slru"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("retention", "shown", "hit_tokens"),
    [("dense", "dense", 2 * 2048), (None, 0, 2048), ("1536", 1536, 1536 + 2048)],
)
def test_simulate_trace_retains_sliding_window_blocks_as_vllm_034_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], retention: str | None, shown: object, hit_tokens: int
) -> None:
    """Gemma 3 (1,024-token windows) on three prompts sharing four 512-token trace blocks. Dense window caching
    lets the second and third hit all 2,048 shared tokens. vLLM 0.34's planned retention (0, the default)
    keeps window blocks only at replay boundaries and junctions: the second hits nothing and pins the
    junction at 2,048, which the third hits. Every 1,536 tokens also keeps a window tail at 1,536. 16-token
    blocks: at 64 the replay tail before 2,560 starts at 1,536 and completes the second request's 2,048 hit."""
    rows = [
        {"timestamp": i, "input_length": 2600, "output_length": 1, "hash_ids": [1, 2, 3, 4, 10 + i, 20 + i]}
        for i in range(3)
    ]
    trace = _trace(tmp_path, rows)
    argv = ["simulate", "google/gemma-3-27b-it", "--trace", trace, "--json", "--block-size", "16"]
    assert main(argv + ([] if retention is None else ["--retention-interval", retention])) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["prefix_cache_retention_interval"], report["hit_tokens"]) == (shown, hit_tokens)


def test_simulate_trace_refuses_a_retention_the_model_cannot_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path, [{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}])
    assert main(["simulate", "llama-3.1-8b", "--trace", trace, "--retention-interval", "64"]) == 1
    assert "no sliding-window or Mamba KV cache group" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "llama-3.1-8b", "--trace", trace, "--retention-interval", "often"])
    assert "'often' is not a retention interval" in capsys.readouterr().err


def test_simulate_trace_timed_reports_latency_and_refuses_a_bad_step_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--timed`: arrivals at the trace's timestamps through the scheduler; three requests sharing a 512-token
    block, the later two arriving after the first finished, hit it (and the next request's own blocks do
    not exist yet). Step time 10 ms + 0.001 ms a token."""
    rows = [
        {"timestamp": 1000 * i, "input_length": 1000, "output_length": 3, "hash_ids": [7, 100 + i]}
        for i in range(3)
    ]
    trace = _trace(tmp_path, rows)
    argv = ["simulate", "llama-3.1-8b", "--trace", trace, "--json", "--timed", "--step-time", "10,0.001,0"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mode"].startswith("timed replay")
    assert (report["requests"], report["finished"], report["refused"], report["preemptions"]) == (3, 3, 0, 0)
    assert report["prompt_tokens"] == 3000 and report["generated_tokens"] == 9
    assert report["prompt_hit_rate"] == round(2 * 512 / 3000, 4)
    # Each request alone: one 1,000-token prefill step (or 488 after a hit), then two decode steps.
    assert report["ttft_ms_median"] == round(10 + 0.001 * 488, 1) and report["steps"] == 9
    assert main([*argv[:-1], "10,0.001"]) == 2
    assert "give three numbers in milliseconds" in capsys.readouterr().err


def test_plan_says_why_a_hybrids_prefix_hits_are_impossible_or_limited() -> None:
    """Issue 52's diagnosis in kvspec plan: Jamba planned in Mamba cache mode "none" (the plan's default, vLLM's
    with prefix caching off) can never hit; in "align" its states are kept only at replay boundaries and
    junctions (vLLM 0.34's sparse retention); Llama 3.1 8B has nothing to say."""
    none = kvspec("plan", "ai21labs/AI21-Jamba-1.5-Mini", "--max-model-len", "8192")
    assert none.returncode == 0, none.stderr
    lines = [line for line in none.stdout.splitlines() if line.startswith("prefix caching")]
    assert len(lines) == 1 and lines[0].startswith(
        "prefix caching impossible: Mamba cache mode 'none': groups 0, 1, 2, 3, 4, 5, 6 keep one running state"
    )
    align = json.loads(
        kvspec(
            "plan",
            "ai21labs/AI21-Jamba-1.5-Mini",
            "--max-model-len",
            "8192",
            "--mamba-cache-mode",
            "align",
            "--json",
        ).stdout
    )
    assert [(f["code"], f["severity"], f["group_ids"]) for f in align["prefix_caching"]] == [
        ("sparse_retention", "limited", [0, 1, 2, 3, 4, 5, 6])
    ]
    assert "(vLLM 0.34's sparse retention, interval 0)" in align["prefix_caching"][0]["message"]
    llama = kvspec("plan")
    assert "prefix caching" not in llama.stdout
    assert json.loads(kvspec("plan", "--json").stdout)["prefix_caching"] == []
