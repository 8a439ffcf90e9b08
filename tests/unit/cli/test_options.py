"""Options that cannot apply are errors, trace replays respect the model's context length, and output is
readable piped (issue 34). Each case ran with exit 0 (or a traceback) before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.cli.main import main
from tests.unit.cli.test_main import kvspec

CONFIGS = Path(__file__).parents[2] / "fixtures" / "configs"


def run(argv: list[str]) -> int:
    """main's exit code, whether it returns it or exits with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _trace(tmp_path: Path, rows: list[dict[str, object]]) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


ROWS = [{"timestamp": i, "input_length": 600, "output_length": 2, "hash_ids": [1, 2 + i]} for i in range(3)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--timed"], "--timed applies to a trace replay"),
        (["simulate", "llama-3.1-8b", "--sweep", "3"], "--sweep applies to a trace replay"),
        (["simulate", "--policy", "lfu"], "--policy applies to a trace replay"),
        (["simulate", "--retention-interval", "dense"], "--retention-interval applies to a trace replay"),
        (["simulate", "llama-3.1-8b", "--num-blocks", "100"], "--num-blocks sizes the tiny models'"),
        (["simulate", "llama-3.1-8b", "--device", "cuda"], "--device runs the tiny models' tensors"),
        (["simulate", "tiny-hybrid", "--memory", "1GiB"], "--memory sizes a preset's cache"),
        (["simulate", "TRACE", "--step-time", "1,2,3"], "--step-time is the timed replay's"),
        (["simulate", "TRACE", "--requests", "5"], "--requests sets the synthetic workload"),
        (["simulate", "TRACE", "--num-blocks", "10", "--memory", "1GiB"], "--num-blocks and --memory both"),
        (["simulate", "TRACE", "--sweep", "3", "--num-blocks", "10"], "--sweep picks the cache sizes itself"),
        (["simulate", "TRACE", "--max-num-seqs", "4"], "--max-num-seqs applies to --timed replays"),
        (["simulate", "--per-group"], "--per-group applies to a trace replay"),
        (["simulate", "TRACE", "--timed", "--per-group"], "--per-group counts each group's hits in the pure"),
        (["simulate", "TRACE", "--no-prefix-caching"], "--no-prefix-caching cannot apply"),
        (["simulate", "TRACE", "--plot", "PLOT"], "--plot with --trace draws the hit rate against KV memory"),
        (
            ["plan", "--block-size", "7"],
            "--block-size: 7 is not a multiple of 16 tokens (vLLM's attention kernels",
        ),
        # One validator for the option in every command (simulate and fleet once took any positive size).
        (["simulate", "--block-size", "12"], "--block-size: 12 is not a multiple of 16 tokens"),
        (["simulate", "TRACE", "--block-size", "8"], "--block-size: 8 is not a multiple of 16 tokens"),
        (
            ["fleet", "--trace", "TRACEFILE", "--block-size", "24"],
            "--block-size: 24 is not a multiple of 16 tokens",
        ),
        (["plan", "--mamba-cache-mode", "align"], "--mamba-cache-mode applies to models with Mamba layers"),
        (
            ["plan", "--assume-dense"],
            "--assume-dense applies to a config.json of a model_type kvspec does not know",
        ),
        (["simulate", "llama-3.1-8b", "--assume-dense"], "is planned by the dense decoder family"),
        (["simulate", "TRACE", "--assume-dense"], "--assume-dense applies to a config.json"),
        (
            ["simulate", "tiny-hybrid", "--assume-dense"],
            "--assume-dense applies to a config.json; the tiny model",
        ),
        (["simulate", "LAYOUT", "--block-size", "32"], "--block-size does not apply to a layout file"),
        (
            ["simulate", "TRACE", "--host-memory", "64GiB"],
            "--host-memory sets offload tiers, which the timed",
        ),
        (
            ["simulate", "TRACE", "--timed", "--host-policy", "arc"],
            "--host-policy sets up offload tiers: add",
        ),
        (["simulate", "TRACE", "--timed", "--host-memory", "1KiB"], "holds no block of this model"),
        (
            ["simulate", "TRACE", "--timed", "--shared-pool", "1GiB", "--store-threshold", "2"],
            "--store-threshold sets the host tier: add --host-memory",
        ),
        (
            ["simulate", "TRACE", "--timed", "--host-memory", "1GiB", "--pool-link", "8"],
            "--pool-link sets the shared pool's link: add --shared-pool",
        ),
        (
            ["fleet", "llama-3.1-8b", "--trace", "TRACEFILE", "--host-policy", "arc"],
            "--host-policy sets up offload tiers: add --host-memory",
        ),
        (
            [
                "fleet",
                "llama-3.1-8b",
                "--trace",
                "TRACEFILE",
                "--host-memory",
                "0",
                "--shared-pool",
                "1GiB",
                "--host-link",
                "8",
            ],
            "--host-link sets the host tier: add --host-memory",
        ),
        (
            ["simulate", "TRACE", "--timed", "--host-memory", "1GiB", "--host-link", "fast"],
            "Cannot read the link",
        ),
        (
            ["simulate", "TRACE", "--timed", "--offload", "full,mla"],
            "name one or more of full, window, state",
        ),
    ],
)
def test_an_option_that_cannot_apply_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    trace = _trace(tmp_path, ROWS)
    plot = tmp_path / "out.png"
    layout = str(Path(__file__).parents[3] / "examples" / "ring_window" / "layout.json")
    named = {
        "TRACE": ["llama-3.1-8b", "--trace", trace],
        "TRACEFILE": [trace],
        "PLOT": [str(plot)],
        "LAYOUT": [layout],
    }
    parts = [named.get(a, [a]) for a in argv]
    flat = [x for part in parts for x in part]
    assert run(flat) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not plot.exists()


def test_a_replay_refuses_prompts_over_the_models_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Qwen3-8B takes 40,960 tokens: a 50,000-token prompt is refused (before, max_model_len was raised to the
    longest prompt); --max-model-len 1000 refuses the 1,100-token one too; over the model's own is an error."""
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2, 3]},
        {"timestamp": 1, "input_length": 50_000, "output_length": 1, "hash_ids": list(range(10, 108))},
        {"timestamp": 2, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]},
    ]
    trace = _trace(tmp_path, rows)
    assert main(["simulate", "Qwen/Qwen3-8B", "--trace", trace, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_model_len"] == 40_960 and report["refused"] == 1
    # The third (600 tokens) hits the first's ids 1 and 2 up to its last whole 64-token block before its last
    # token (576); the refused one is not cached.
    assert report["hit_tokens"] == 576
    assert main(["simulate", "Qwen/Qwen3-8B", "--trace", trace, "--json", "--max-model-len", "1000"]) == 0
    assert json.loads(capsys.readouterr().out)["refused"] == 2
    assert run(["simulate", "Qwen/Qwen3-8B", "--trace", trace, "--max-model-len", "65536"]) == 2
    assert "larger than the model's context length 40,960" in capsys.readouterr().err


def test_an_empty_trace_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    assert main(["simulate", "llama-3.1-8b", "--trace", str(path)]) == 1
    assert "holds no requests" in capsys.readouterr().err


def test_a_cache_too_small_for_any_prompt_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every 600-token prompt needs 38 blocks of 16; 4 blocks hold none: a report of hit rate 0 would read as
    a result."""
    assert main(["simulate", "llama-3.1-8b", "--trace", _trace(tmp_path, ROWS), "--num-blocks", "4"]) == 1
    assert "every request was refused" in capsys.readouterr().err
    assert (
        main(["simulate", "llama-3.1-8b", "--trace", _trace(tmp_path, ROWS), "--num-blocks", "38", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["refused"] == 0


def test_a_layout_files_block_size_is_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    layout = str(Path(__file__).parents[3] / "examples" / "ring_window" / "layout.json")
    assert run(["plan", layout]) == 0
    out = capsys.readouterr().out
    assert "(the layout file's)" in out and "(its default)" not in out
    assert run(["plan", layout, "--block-size", "32"]) == 2
    assert "--block-size does not apply to a layout file" in capsys.readouterr().err


def test_the_policy_plot_shows_each_policys_gain_over_lru(tmp_path: Path) -> None:
    """Beside LRU, a second panel of gains: the figure is twice as wide (13 in against 8 at 120 dpi)."""
    from kvspec.cli.simulate import plot_sweep

    rows = [
        {"policy": p, "num_blocks": n, "kv_cache_gib": n / 10, "token_hit_rate": r, "block_hit_rate": r}
        for p, scale in (("lru", 1.0), ("lfu", 1.14))
        for n, r in ((10, 0.1 * scale), (100, 0.3 * scale))
    ]
    plot_sweep(rows, str(tmp_path / "two.png"), "t")
    plot_sweep([r for r in rows if r["policy"] == "lru"], str(tmp_path / "one.png"), "t")

    def width(name: str) -> int:  # from the PNG's IHDR chunk
        return int.from_bytes((tmp_path / name).read_bytes()[16:20], "big")

    assert width("two.png") == 13 * 120 and width("one.png") == 8 * 120


def test_piped_output_is_whole_and_warnings_come_once() -> None:
    """Piped, the table is plain text at full width (rich cut it to 80 columns); planning both releases
    warns about padding layers once."""
    proc = kvspec("plan", str(CONFIGS / "nvidia__NVIDIA-Nemotron-Nano-9B-v2.json"))
    assert proc.returncode == 0, proc.stderr
    assert "full_attention" in proc.stdout and "…" not in proc.stdout and "┃" not in proc.stdout
    assert proc.stderr.count("Add 1 padding layers") == 1  # 27 Mamba layers in groups of 4
    assert "family: Nemotron-H (Mamba2 hybrid)" in proc.stdout


def test_reports_print_values_not_python_reprs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "llama-3.1-8b", "--trace", _trace(tmp_path, ROWS), "--policy", "lru,lfu"]) == 0
    out = capsys.readouterr().out
    assert "lru, lfu" in out and "['lru'" not in out
    assert "\n\n" not in out  # no blank line per replay when not a terminal


def test_the_pool_full_note_fires_for_a_hybrid(capsys: pytest.CaptureFixture[str]) -> None:
    """The tiny hybrid's pool peaks at 95.65% of 23 usable blocks (its groups take blocks in steps), which
    never reached the old 100% test, while its hit rate fell to 0; 256 blocks hold the workload. (Blocks of 16
    tokens.)"""
    assert main(["simulate", "tiny-hybrid", "--num-blocks", "24", "--block-size", "16", "--json"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert small["peak_block_usage"] < 1.0 and any("ran full" in n for n in small["notes"])
    assert main(["simulate", "tiny-hybrid", "--num-blocks", "256", "--json"]) == 0
    assert not json.loads(capsys.readouterr().out)["notes"]


def test_the_plot_path_is_opened_before_any_work_and_left_as_it_was(tmp_path: Path) -> None:
    """A new path is created to prove it writable, then removed; an existing file keeps its bytes; a path
    os.access calls writable but that cannot be created (inside /proc, even for root) is refused."""
    from kvspec.cli.args import check_plot_path
    from kvspec.errors import PlotPathError

    fresh = tmp_path / "new.png"
    check_plot_path(str(fresh))
    assert not fresh.exists()
    kept = tmp_path / "old.png"
    kept.write_bytes(b"keep")
    check_plot_path(str(kept))
    assert kept.read_bytes() == b"keep"
    with pytest.raises(PlotPathError, match="cannot be written"):
        check_plot_path("/proc/version.png")


def test_a_timed_replay_with_host_memory_reports_reuse_per_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first and third prompts share hash id 1 (512 tokens); 10 GPU blocks of 64 hold one prompt, so the
    second evicts the first: the third finds the shared block in host memory. The tiers' reuse adds up with
    the GPU's."""
    rows = [
        {"timestamp": 1000 * i, "input_length": 600, "output_length": 2, "hash_ids": ids}
        for i, ids in enumerate([[1, 2], [50, 51], [1, 3]])
    ]
    argv = [
        "simulate",
        "llama-3.1-8b",
        "--trace",
        _trace(tmp_path, rows),
        "--timed",
        "--num-blocks",
        "10",
        "--json",
    ]
    assert main([*argv, "--host-memory", "1GiB"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["host_memory"] == "1.00 GiB" and report["offload"] == "full,window,state"
    assert report["gpu_reused_tokens"] + report["host_reused_tokens"] == round(
        report["prompt_hit_rate"] * 1800
    )
    assert report["host_reused_tokens"] > 0 and report["host_loaded_bytes"] > 0


def test_per_group_reports_each_groups_hits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Gemma 3 27B (five sliding-window groups and one of full attention, after the padding layers) on three
    prompts sharing their first block: each group's own hit rate, and which groups limited a hit."""
    argv = ["simulate", "google/gemma-3-27b-it", "--trace", _trace(tmp_path, ROWS), "--max-model-len", "4096"]
    assert main([*argv, "--per-group", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    groups = row["kv_cache_groups"]
    assert len(row["group_hit_rates"]) == len(row["group_limited_requests"]) == groups > 1
    assert all(rate >= row["token_hit_rate"] for rate in row["group_hit_rates"])
    assert isinstance(row["limiting_groups"], list)
    assert main([*argv, "--per-group"]) == 0
    text = capsys.readouterr().out
    assert "group hit rates" in text and f"{groups - 1} full_attention: " in text
    assert main([*argv, "--json"]) == 0
    assert "group_hit_rates" not in json.loads(capsys.readouterr().out)


def test_every_command_and_the_api_default_to_vllm_034s_block_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One default block size (issue 51): vLLM 0.34's 64 tokens in `plan`, `simulate`, `fleet`, the layout
    builders, the tiny engine and a fleet sweep point. Before, only `plan` used 64; the rest used 16."""
    from kvspec.cli.main import make_parser
    from kvspec.contracts.release import DEFAULT_BLOCK_SIZE, VLLM_0_34
    from kvspec.engine import TINY_FULL, Engine
    from kvspec.fleet.sweep import SweepPoint
    from kvspec.models import build_model_layout, layout_from_config, load_model_config

    assert DEFAULT_BLOCK_SIZE == VLLM_0_34.default_block_size == 64
    assert main(["plan", "llama-3.1-8b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requested_block_size"] == 64
    assert main(["simulate", "llama-3.1-8b", "--trace", _trace(tmp_path, ROWS), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["block_size"] == 64
    fleet = make_parser().parse_args(["fleet", "llama-3.1-8b", "--trace", "t.jsonl"])
    assert fleet.block_size == 64
    assert SweepPoint(model="m", trace="t", num_instances=1, num_blocks=8).block_size == 64
    layout = build_model_layout("llama-3.1-8b")
    assert {spec.block_size for spec in layout.layer_specs.values()} == {64}
    _, cfg = load_model_config("llama-3.1-8b")
    assert {spec.block_size for spec in layout_from_config(cfg).layer_specs.values()} == {64}
    assert Engine.tiny(TINY_FULL, num_blocks=8).coordinator.scheduler_block_size == 64
