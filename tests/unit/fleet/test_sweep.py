"""Sweeps: the same rows from every executor (Ray in local mode too), resumable output, and the CLI."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from kvspec.cli.main import main
from kvspec.errors import FleetConfigError, InsufficientKVCacheMemoryError
from kvspec.fleet.sweep import SweepPoint, expand_points, finished_keys, run_sweep


def _trace(tmp_path: Path) -> Path:
    """40 Mooncake lines (512-token hash blocks): 4 conversations growing turn by turn."""
    lines = []
    for i in range(40):
        conversation, turn = i % 4, i // 4
        ids = [100 * conversation + t for t in range(turn + 1)] + [10_000 + i]
        lines.append(
            {"timestamp": 400 * i, "input_length": 512 * len(ids) - 100, "output_length": 20, "hash_ids": ids}
        )
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _points(trace: Path, routers: tuple[str, ...] = ("round_robin", "kv_cost")) -> list[SweepPoint]:
    return expand_points(
        {"model": "llama-3.1-8b", "trace": str(trace), "block_size": 64, "step_time": "dynosim"},
        {"num_instances": [2, 3], "num_blocks": [400], "router": list(routers)},
    )


def _results(rows: list[dict[str, object]]) -> list[tuple[object, object, object]]:
    return [(r["key"], r["total"], r["instances"]) for r in rows]


def test_every_executor_gives_the_same_rows(tmp_path: Path) -> None:
    points = _points(_trace(tmp_path))
    here = run_sweep(points, executor="inprocess")
    pool = run_sweep(points, executor="process", workers=2)
    assert _results(here) == _results(pool)
    assert [r["point"]["router"] for r in here] == ["round_robin", "kv_cost"] * 2
    # Three instances in turn scatter the four conversations; kv_cost finds each one's last turn.
    assert here[3]["total"]["reuse_ratio"] > here[2]["total"]["reuse_ratio"]


class _StandInRay:
    """The slice of Ray's API the executor uses, run in this process: no cluster, no listening socket.
    Counts what crosses to the object store and how many tasks run."""

    def __init__(self) -> None:
        self.initialized = False
        self.puts = 0
        self.tasks = 0

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **settings: object) -> None:
        assert settings["address"] is None  # no --ray-address: a local Ray
        self.initialized = True

    def shutdown(self) -> None:
        self.initialized = False

    def put(self, value: object) -> tuple[str, object]:
        self.puts += 1
        return ("ref", value)

    def remote(self, fn: Any) -> Any:
        stand_in = self

        class Remote:
            @staticmethod
            def remote(point: object, ref: tuple[str, object]) -> tuple[str, object]:
                stand_in.tasks += 1
                return ("ref", fn(point, ref[1]))

        return Remote

    def wait(self, pending: list[Any], num_returns: int) -> tuple[list[Any], list[Any]]:
        return pending[:num_returns], pending[num_returns:]

    def get(self, ref: tuple[str, object]) -> object:
        return ref[1]


def test_the_ray_executor_ships_the_trace_once_and_gives_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four points of one trace: one object put, four tasks, the rows a loop gives; Ray is started for the
    sweep and shut down after it."""
    import sys

    ray = _StandInRay()
    monkeypatch.setitem(sys.modules, "ray", ray)
    points = _points(_trace(tmp_path))
    shipped = run_sweep(points, executor="ray")
    assert (ray.puts, ray.tasks, ray.initialized) == (1, 4, False)
    assert _results(shipped) == _results(run_sweep(points, executor="inprocess"))


def test_an_unreachable_ray_cluster_is_one_line_within_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 51: an unreachable --ray-address retried for ever with no message."""
    import sys
    import time

    ray = _StandInRay()
    monkeypatch.setitem(sys.modules, "ray", ray)
    start = time.monotonic()
    with pytest.raises(FleetConfigError, match=r"no Ray cluster answers at 127\.0\.0\.1:9 within 10 s"):
        run_sweep(_points(_trace(tmp_path))[:1], executor="ray", ray_address="127.0.0.1:9")
    assert time.monotonic() - start < 15 and not ray.initialized
    with pytest.raises(FleetConfigError, match="give auto, HOST:PORT or ray://HOST:PORT"):
        run_sweep(_points(_trace(tmp_path))[:1], executor="ray", ray_address="headnode")


def test_a_cluster_that_refuses_the_driver_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster that answers on its port but refuses this driver (Ray 2.60's ``ray start`` turns on token
    authentication; a driver sends the token only under RAY_AUTH_MODE=token) raised Ray's ConnectionError
    traceback after Ray's own 20 s of retries."""
    import socket
    import sys

    class Refusing(_StandInRay):
        def init(self, **settings: object) -> None:
            raise ConnectionError(f"Failed to connect to Ray cluster at {settings['address']}\nmore")

    monkeypatch.setitem(sys.modules, "ray", Refusing())
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with socket.create_server(("127.0.0.1", 0)) as server:  # something answers on the port
        address = f"127.0.0.1:{server.getsockname()[1]}"
        with pytest.raises(FleetConfigError) as err:
            run_sweep(_points(_trace(tmp_path))[:1], executor="ray", ray_address=address)
    assert str(err.value) == (
        f"the Ray cluster at {address} refused this driver (Failed to connect to Ray cluster at {address}); "
        "a cluster started by `ray start` authenticates by token: run with RAY_AUTH_MODE=token"
    )


# A real Ray (Ray 2.60 here): `nox -s ray` runs these in CI. Opt-in elsewhere, since a local Ray's servers
# listen on every interface (Ray's choice; token authentication, on by default since Ray 2.5x, guards them).
real_ray = pytest.mark.skipif(
    not os.environ.get("KVSPEC_REAL_RAY"), reason="a real Ray: opt in with KVSPEC_REAL_RAY=1 (nox -s ray)"
)


@real_ray
def test_a_real_local_ray_gives_the_process_pools_rows(tmp_path: Path) -> None:
    """No --ray-address: the executor starts a local Ray for the sweep and shuts it down after."""
    ray = pytest.importorskip("ray")
    points = _points(_trace(tmp_path))
    shipped = run_sweep(points, executor="ray")
    assert not ray.is_initialized()
    assert _results(shipped) == _results(run_sweep(points, executor="process", workers=2))
    assert _results(shipped) == _results(run_sweep(points, executor="inprocess"))


@real_ray
def test_the_documented_ray_start_recipe_runs_a_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/FLEET.md's recipe: `ray start --head --port PORT --dashboard-host 127.0.0.1`, then
    `RAY_AUTH_MODE=token` and `--ray-address 127.0.0.1:PORT`: the same rows as in process."""
    import shutil
    import socket
    import subprocess
    import sys

    pytest.importorskip("ray")
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = [ray_cli, "start", "--head", f"--port={port}", "--dashboard-host=127.0.0.1", "--num-cpus=2"]
    subprocess.run(start, check=True, capture_output=True, timeout=120)
    try:
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        points = _points(_trace(tmp_path))[:2]
        shipped = run_sweep(points, executor="ray", ray_address=f"127.0.0.1:{port}")
    finally:
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=120)
    assert _results(shipped) == _results(run_sweep(points, executor="inprocess"))


def test_a_sweep_resumes_from_its_file(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    out = tmp_path / "sweep.jsonl"
    first = run_sweep(_points(trace, ("round_robin",)), executor="inprocess", out=out)
    assert len(first) == 2 and len(finished_keys(out)) == 2
    more = run_sweep(_points(trace), executor="inprocess", out=out)
    assert [r["point"]["router"] for r in more] == ["kv_cost", "kv_cost"]  # the two finished points skipped
    assert len(out.read_text().splitlines()) == 4
    assert run_sweep(_points(trace), executor="inprocess", out=out) == []
    (tmp_path / "other.jsonl").write_text('{"not": "a row"}\n')
    with pytest.raises(FleetConfigError, match=r"other\.jsonl line 1 is not a sweep row"):
        run_sweep(_points(trace), executor="inprocess", out=tmp_path / "other.jsonl")


@pytest.mark.parametrize("executor", ["inprocess", "process"])
def test_a_point_that_cannot_run_names_itself_and_keeps_the_finished_ones(
    tmp_path: Path, executor: str
) -> None:
    """Llama 3.1 8B's 131,072-token context does not fit 8 GiB: vLLM refuses that plan, so does the sweep,
    with the planner's own error (class and figures, across the process pool) and a note naming the point."""
    trace = _trace(tmp_path)
    good = _points(trace, ("round_robin",))[0]
    bad = SweepPoint(model="llama-3.1-8b", trace=str(trace), num_instances=2, memory=8 << 30, block_size=64)
    out = tmp_path / "sweep.jsonl"
    run_sweep([good], executor="inprocess", out=out)
    with pytest.raises(InsufficientKVCacheMemoryError) as err:
        run_sweep([good, bad], executor=executor, workers=2, out=out)
    assert err.value.__notes__ == ["sweep point llama-3.1-8b x 2, round_robin, lru, 8,589,934,592 bytes"]
    assert err.value.max_model_len == 131_072 and err.value.needed_bytes == 16 << 30
    assert finished_keys(out) == {good.key()}


def test_bad_sweep_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FleetConfigError, match="by memory or by num_blocks: give exactly one"):
        SweepPoint(model="llama-3.1-8b", trace="t", num_instances=1)
    with pytest.raises(FleetConfigError, match="executor 'dask'"):
        run_sweep([], executor="dask")


def test_the_fleet_command_runs_one_fleet_and_a_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path)
    common = ["fleet", "llama-3.1-8b", "--trace", str(trace), "--block-size", "64", "--num-blocks", "400"]
    assert main([*common, "--instances", "3", "--router", "exact", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["point"]["router"] == "exact" and len(row["instances"]) == 3
    assert row["total"]["requests"] == 40 and row["total"]["finished"] == 40
    # One fleet with an executor named runs through it (the sweep's table), not silently in process.
    assert (
        main([*common, "--instances", "2", "--router", "kv_cost", "--executor", "inprocess", "--json"]) == 0
    )
    through = json.loads(capsys.readouterr().out)
    assert through["point"]["router"] == "kv_cost" and "key" in through
    out = tmp_path / "s.jsonl"
    argv = [*common, "--instances", "2,3", "--router", "round_robin,cache_aware", "--executor", "inprocess"]
    assert main([*argv, "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert table.count("cache_aware") == 2 and table.count("round_robin") == 2
    assert len(out.read_text().splitlines()) == 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--router", "nope"], "Unknown router 'nope'"),
        (["--eviction", "fifo"], "Unknown eviction policy 'fifo'"),
        (
            ["--router", "cache_aware", "--router-option", "cache_treshold=0.5"],
            "takes no option 'cache_treshold'",
        ),
        (["--speedup", "0"], "speedup must be a finite number > 0"),
        (["--step-time", "fast"], "give three numbers in milliseconds"),
        (["--executor", "ray", "--workers", "2"], "--workers sizes the process pool"),
        (["--ray-address", "auto"], "--ray-address names a Ray cluster; it needs --executor ray"),
        # issue 51: --out was opened after the whole replay (an IsADirectoryError traceback)
        (["--out", "TMP"], "is a folder; name a file"),
        (["--out", "TMP/missing/points.jsonl"], "does not exist"),
    ],
)
def test_the_fleet_command_refuses_bad_input_before_it_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    trace = _trace(tmp_path)
    extra = [arg.replace("TMP", str(tmp_path)) for arg in extra]
    assert main(["fleet", "llama-3.1-8b", "--trace", str(trace), *extra]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [trace]  # nothing written


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--instances", "4,"], "'4,' has an empty item"),
        (["--instances", "4,,8"], "has an empty item"),
        (["--memory", "64"], "size '64' has no unit"),
        (["--event-wire", "0.33"], "expected a vLLM release (0.34, 0.32, 0.23), got '0.33'"),
    ],
)
def test_the_fleet_command_refuses_malformed_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    trace = _trace(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["fleet", "llama-3.1-8b", "--trace", str(trace), *extra])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ("\n\n", "holds no requests"),
        (
            '{"timestamp": 1, "input_length": 5, "output_length": 1}\n',
            "line 1: missing 'token_ids' or 'hash_ids'",
        ),
    ],
)
def test_a_bad_trace_fails_fleet_and_simulate_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: str, message: str
) -> None:
    """Issue 51: an empty trace was a table of zeros in ``fleet`` and an error in ``simulate``; a bad line
    exited 2 in one and 1 in the other. Now both exit 1 with the same message, before any replay."""
    path = tmp_path / "bad.jsonl"
    path.write_text(lines)
    for command in (["fleet", "--num-blocks", "400", "--instances", "2,3"], ["fleet"], ["simulate"]):
        assert main([command[0], "llama-3.1-8b", "--trace", str(path), *command[1:]]) == 1, command
        assert message in capsys.readouterr().err


def test_a_points_key_names_per_group_only_when_on() -> None:
    """Sweep files written before --per-group resume: the key leaves the setting out at its default."""
    point = SweepPoint(model="llama-3.1-8b", trace="t", num_instances=1, memory=1 << 30)
    assert "per_group" not in json.loads(point.key())
    assert json.loads(dataclasses.replace(point, per_group=True).key())["per_group"] is True
