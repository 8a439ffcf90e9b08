"""Sweeps over fleets: instances x memory x router x eviction policy, run by an executor, resumable.

A :class:`SweepPoint` is one fleet run, fully described by values (model, trace file, settings), so it can
travel to another process or machine. :func:`run_sweep` runs points through an executor:

- ``"inprocess"``: one after another here;
- ``"process"`` (the default): a process pool, one worker per core;
- ``"ray"``: one Ray task per point (``pip install 'kvspec[ray]'``; ``ray_address`` "auto", "HOST:PORT" or
  None for a local Ray), the trace read once here and shipped once through Ray's object store.

Each point is deterministic, so every executor gives identical results. With ``out`` (a JSONL file) each
finished point is appended as it finishes; a rerun with the same file skips the points already there
(matched by their settings), so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec.contracts.release import DEFAULT_BLOCK_SIZE, DEFAULT_EVENT_RELEASE
from kvspec.engine.traces import TraceRequest
from kvspec.errors import FleetConfigError, KVSpecError, TraceFormatError
from kvspec.tiers.connector import FAMILIES

EXECUTORS = ("inprocess", "process", "ray")


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepPoint:
    """One fleet run. ``memory`` (bytes per instance, planned) or ``num_blocks`` (per instance) sizes each
    instance's cache; ``step_time`` is a name ("dynosim", "default") or "BASE,PER_TOKEN,PER_REQUEST"."""

    model: str
    trace: str
    num_instances: int
    router: str = "round_robin"
    eviction_policy: str = "lru"
    memory: int | None = None
    num_blocks: int | None = None
    limit: int | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    step_time: str = "default"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    speedup: float = 1.0
    event_lag_ms: float = 0.0
    event_wire: str = DEFAULT_EVENT_RELEASE
    seed: int = 0
    router_options: tuple[tuple[str, float], ...] = field(default_factory=tuple)
    #: Offload tiers: host memory per instance and a pool the instances share (bytes; 0: none), the host
    #: tier's policy and store threshold, the group families offloaded, and the links ("default" or
    #: "GBPS[,US]"). A point's key leaves these out at their defaults (sweep files from before tiers resume).
    host_memory: int = 0
    shared_pool: int = 0
    host_policy: str = "lru"
    store_threshold: int = 1
    offload: tuple[str, ...] = FAMILIES
    host_link: str = "default"
    pool_link: str = "default"
    #: Cap every request's output at this many tokens (Mooncake's Fig. 10 caps them at 1); None: the trace's.
    max_output_tokens: int | None = None
    #: Count each KV-cache group's own hit (``FleetSettings.per_group``); left out of the key when off.
    per_group: bool = False

    def __post_init__(self) -> None:
        if (self.memory is None) == (self.num_blocks is None):
            raise FleetConfigError(
                "a sweep point sizes its caches by memory or by num_blocks: give exactly one"
            )

    def key(self) -> str:
        """The point's identity in a sweep file: its settings as sorted JSON."""
        fields = dataclasses.asdict(self)
        if not fields["per_group"]:
            del fields["per_group"]
        for name in _TIER_FIELDS:
            if fields[name] == _TIER_DEFAULTS[name]:
                del fields[name]
        return json.dumps(fields, sort_keys=True)


_TIER_FIELDS = (
    "host_memory",
    "shared_pool",
    "host_policy",
    "store_threshold",
    "offload",
    "host_link",
    "pool_link",
)
_TIER_DEFAULTS = {
    f.name: f.default if f.default is not dataclasses.MISSING else None
    for f in dataclasses.fields(SweepPoint)
    if f.name in _TIER_FIELDS
}


def tier_settings(point: SweepPoint) -> Any:
    """The point's :class:`~kvspec.tiers.settings.TierSettings`, or None without tier memory."""
    from kvspec.tiers.settings import tier_settings as settings_of

    return settings_of(
        host_bytes=point.host_memory,
        pool_bytes=point.shared_pool,
        host_policy=point.host_policy,
        store_threshold=point.store_threshold,
        offload=tuple(point.offload),
        host_link=point.host_link,
        pool_link=point.pool_link,
    )


def read_point_trace(point: SweepPoint) -> list[TraceRequest]:
    """The point's requests: its trace's first ``limit`` lines, prompts over the model's context kept as
    lengths only (refused at the fleet's door). A bad line or a trace with no request is a TraceFormatError."""
    from kvspec.engine.traces import read_trace

    max_prompt_tokens = _layout(point).max_model_len
    requests = list(read_trace(point.trace, limit=point.limit, max_prompt_tokens=max_prompt_tokens))
    if not requests:  # as kvspec simulate: a report of zeros would read as a result
        raise TraceFormatError(f"trace {point.trace!r} holds no requests (an empty file or blank lines only)")
    cap = point.max_output_tokens
    if cap is not None:
        requests = [
            r if r.output_length <= cap else dataclasses.replace(r, output_length=cap) for r in requests
        ]
    return requests


def _layout(point: SweepPoint) -> Any:
    from kvspec.models import build_model_layout

    return build_model_layout(
        point.model, block_size=point.block_size, max_model_len=None, mamba_cache_mode="align"
    )


def fleet_settings(point: SweepPoint, max_num_batched_tokens: int | None = None) -> Any:
    """The point's :class:`~kvspec.fleet.fleet.FleetSettings` (checked: a bad value raises here)."""
    from kvspec.engine.step_time import parse_step_time
    from kvspec.fleet.fleet import FleetSettings

    return FleetSettings(
        num_instances=point.num_instances,
        router=point.router,
        router_options=dict(point.router_options),
        eviction_policy=point.eviction_policy,
        max_num_batched_tokens=max_num_batched_tokens or point.max_num_batched_tokens,
        max_num_seqs=point.max_num_seqs,
        step_time=parse_step_time(point.step_time),
        event_lag_ms=point.event_lag_ms,
        event_wire=point.event_wire,
        speedup=point.speedup,
        seed=point.seed,
        tiers=tier_settings(point),
        per_group=point.per_group,
    )


def check_point(point: SweepPoint) -> None:
    """Refuse what cannot run before any replay: the model, the settings."""
    _layout(point)
    fleet_settings(point)


def run_point(
    point: SweepPoint,
    trace: Sequence[TraceRequest] | None = None,
    on_request: Callable[[TraceRequest], None] | None = None,
) -> dict[str, Any]:
    """Run one point (``trace``: the requests already read, else read from ``point.trace``); its row:
    the point's settings, the fleet's totals, per-instance rows and the KV cache size. ``on_request`` is
    called as each request finishes or is refused (a progress bar)."""
    from kvspec.contracts.spec import SchedulerLimits
    from kvspec.fleet.fleet import run_fleet
    from kvspec.planning import get_kv_cache_config

    layout = _layout(point)
    limits = SchedulerLimits(
        max_model_len=layout.max_model_len,
        max_num_batched_tokens=min(point.max_num_batched_tokens, layout.max_model_len),
        max_num_encoder_input_tokens=layout.max_num_encoder_input_tokens,
        mamba_cache_mode="align",
    )
    config = get_kv_cache_config(layout.layer_specs, point.memory or (1 << 50), limits)
    bytes_per_block = sum(t.size for t in config.kv_cache_tensors) / config.num_blocks
    if point.num_blocks is not None:
        config = dataclasses.replace(config, num_blocks=point.num_blocks + 1)
    requests = trace if trace is not None else read_point_trace(point)
    settings = fleet_settings(point, limits.max_num_batched_tokens)
    report = run_fleet(requests, config, limits, settings, on_request=on_request)
    blocks = config.num_blocks - 1
    return {
        "point": dataclasses.asdict(point),
        "key": point.key(),
        "blocks_per_instance": blocks,
        "kv_cache_gib_per_instance": round(blocks * bytes_per_block / 2**30, 3),
        "total": report.total,
        "instances": report.instances,
        "wall_seconds": report.wall_seconds,
    }


def _describe(point: SweepPoint) -> str:
    size = f"{point.memory:,} bytes" if point.memory is not None else f"{point.num_blocks:,} blocks"
    return f"{point.model} x {point.num_instances}, {point.router}, {point.eviction_policy}, {size}"


def run_point_checked(point: SweepPoint, trace: Sequence[TraceRequest] | None = None) -> dict[str, Any]:
    """:func:`run_point`, a kvspec error naming the point in a note (``sweep point ...``); the error keeps its
    class and fields across processes and Ray (every KVSpecError pickles whole), so the command reports and
    exits on it as it would for one point."""
    try:
        return run_point(point, trace)
    except KVSpecError as exc:
        exc.add_note(f"sweep point {_describe(point)}")
        raise


def finished_keys(out: str | Path) -> set[str]:
    """The keys of the points a sweep file already holds (a missing file: none). A line that is not a
    point's row is a ``FleetConfigError`` naming the file and line (it is not a sweep file)."""
    path = Path(out)
    if not path.exists():
        return set()
    keys = set()
    with path.open() as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                keys.add(json.loads(line)["key"])
            except (ValueError, KeyError, TypeError):
                raise FleetConfigError(
                    f"{path} line {number} is not a sweep row; give --out a new file or a sweep's own"
                ) from None
    return keys


def _ray_run(point: SweepPoint, trace: Sequence[TraceRequest]) -> dict[str, Any]:
    return run_point_checked(point, trace)


def run_sweep(
    points: Iterable[SweepPoint],
    *,
    executor: str = "process",
    workers: int | None = None,
    ray_address: str | None = None,
    out: str | Path | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``points`` (skipping those ``out`` already holds) and return the new rows in the points' order."""
    if executor not in EXECUTORS:
        raise FleetConfigError(f"executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    todo = list(points)
    if out is not None:
        done = finished_keys(out)
        todo = [p for p in todo if p.key() not in done]
    rows: dict[str, dict[str, Any]] = {}

    def finish(row: dict[str, Any]) -> None:
        rows[row["key"]] = row
        if out is not None:
            with Path(out).open("a") as handle:
                handle.write(json.dumps(row) + "\n")
        if on_row is not None:
            on_row(row)

    if not todo:
        return []
    if executor == "inprocess" or (executor == "process" and (workers == 1 or len(todo) == 1)):
        for point in todo:
            finish(run_point_checked(point))
    elif executor == "process":
        count = workers or os.cpu_count() or 1
        with ProcessPoolExecutor(max_workers=min(count, len(todo))) as pool:
            futures = [pool.submit(run_point_checked, point) for point in todo]
            try:
                for future in as_completed(futures):
                    finish(future.result())
            except BaseException:
                for future in futures:
                    future.cancel()  # the finished points are in ``out``; a rerun resumes after the fix
                raise
    else:
        _run_on_ray(todo, ray_address, finish)
    return [rows[p.key()] for p in todo]


#: Seconds to wait for a named Ray cluster's port to answer before giving up.
RAY_CONNECT_TIMEOUT_S = 10.0


def check_ray_reachable(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """FleetConfigError unless ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``) accepts a TCP connection
    within ``timeout_s`` seconds: a bounded check in one line, where ``ray.init`` would retry for ever."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise FleetConfigError(f"--ray-address {address!r}: give auto, HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise FleetConfigError(
            f"no Ray cluster answers at {address} within {timeout_s:g} s ({exc.strerror or exc}); start one "
            "(ray start --head --port PORT --dashboard-host 127.0.0.1) or leave out --ray-address for a "
            "local Ray"
        ) from None


def _start_ray(ray: Any, ray_address: str | None) -> None:
    """``ray.init``; a cluster that answers but refuses this driver (Ray 2.5x's ``ray start`` turns on token
    authentication, which a driver sends only under ``RAY_AUTH_MODE=token``) is one FleetConfigError line
    naming the address, not Ray's traceback."""
    try:
        ray.init(address=ray_address, ignore_reinit_error=True, log_to_driver=False)
    except (ConnectionError, RuntimeError) as exc:
        hint = (
            ""
            if os.environ.get("RAY_AUTH_MODE") == "token"
            else "; a cluster started by `ray start` authenticates by token: run with RAY_AUTH_MODE=token"
        )
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FleetConfigError(
            f"the Ray cluster at {ray_address or 'a new local Ray'} refused this driver ({reason}){hint}"
        ) from None


def _run_on_ray(
    todo: Sequence[SweepPoint], ray_address: str | None, finish: Callable[[dict[str, Any]], None]
) -> None:
    try:
        ray: Any = importlib.import_module("ray")  # optional (kvspec[ray]); untyped for every checker
    except ImportError as exc:
        raise FleetConfigError("executor 'ray' needs Ray: pip install 'kvspec[ray]'") from exc
    started = not ray.is_initialized()
    if started:
        if ray_address is not None and ray_address not in ("auto", "local"):
            check_ray_reachable(ray_address)  # Ray itself retries an unreachable cluster without a word
        _start_ray(ray, ray_address)
    try:
        remote = ray.remote(_ray_run)
        # Points that share a trace file and limit share one object: the trace is shipped once.
        traces: dict[tuple[str, int | None, str, int], Any] = {}
        pending = []
        for point in todo:
            source = (point.trace, point.limit, point.model, point.block_size)
            if source not in traces:
                traces[source] = ray.put(read_point_trace(point))
            pending.append(remote.remote(point, traces[source]))
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            finish(ray.get(ready[0]))
    finally:
        if started:
            ray.shutdown()


def expand_points(base: Mapping[str, Any], axes: Mapping[str, Sequence[Any]]) -> list[SweepPoint]:
    """Every combination of ``axes`` (field name -> values, in order) over ``base``'s fields."""
    points = [dict(base)]
    for name, values in axes.items():
        points = [{**p, name: v} for p in points for v in values]
    return [SweepPoint(**p) for p in points]


__all__ = [
    "EXECUTORS",
    "SweepPoint",
    "check_point",
    "read_point_trace",
    "expand_points",
    "fleet_settings",
    "finished_keys",
    "run_point",
    "run_sweep",
]
