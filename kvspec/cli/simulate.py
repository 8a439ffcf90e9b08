"""``kvspec simulate``: run a synthetic workload through the real coordinator."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvspec.cli.args import (
    capacity_message,
    check_layout_options,
    check_plot_path,
    human_bytes,
    parse_bytes,
    refuse,
)
from kvspec.cli.plots import pyplot, save_figure, write_plot
from kvspec.cli.plugins import load_installed_plugins
from kvspec.cli.terminal import print_report, shows_progress
from kvspec.cli.tiers import check_tier_options, given_tier_options, tier_settings

# Only light modules at import time (the parser is built for `kvspec --help`); the command imports
# the engine, torch and the library when it runs.
from kvspec.contracts.release import DEFAULT_BLOCK_SIZE
from kvspec.engine.workloads import make_workload
from kvspec.errors import (
    InsufficientKVCacheMemoryError,
    KVSpecError,
    ModelConfigError,
    OptionError,
    TraceFormatError,
    UnknownEvictionPolicyError,
)

if TYPE_CHECKING:
    from kvspec.contracts.spec import MambaCacheMode
    from kvspec.engine.engine import Engine, EngineStats

#: The tiny paged-attention models `simulate` runs for real (kvspec.engine.model).
TINY_MODEL_NAMES = ("tiny-full", "tiny-hybrid")
#: KV cache memory for a preset when --memory is not given (a synthetic workload).
DEFAULT_MEMORY = parse_bytes("8GiB")
#: The planning budget of a trace replay without --memory (1 PiB): the block count is then set from the trace.
UNLIMITED_MEMORY = 1 << 50
#: The token budget a trace replay computes prompts in when --max-num-batched-tokens is not given.
DEFAULT_TRACE_CHUNK = 8192
#: Running requests at most in a timed replay (vLLM's default max_num_seqs on GPUs).
DEFAULT_TRACE_SEQS = 256
#: Simulations are bounded: past this many requests a run takes minutes and says nothing new.
MAX_REQUESTS = 100_000


#: Options only a --trace replay reads: (flag, dest).
TRACE_ONLY_OPTIONS = (
    ("--workers", "workers"),
    ("--timed", "timed"),
    ("--sweep", "sweep"),
    ("--policy", "policy"),
    ("--limit", "limit"),
    ("--retention-interval", "retention_interval"),
    ("--per-group", "per_group"),
)
#: Options of the synthetic workload, which a --trace replay takes from the trace instead.
SYNTHETIC_ONLY_OPTIONS = (
    ("--requests", "requests"),
    ("--workload", "workload"),
    ("--prompt-len", "prompt_len"),
    ("--max-tokens", "max_tokens"),
    ("--seed", "seed"),
)


def check_options(args: argparse.Namespace) -> None:
    """Every option given must apply to what is asked (raises OptionError naming it and what it needs); then
    fills in the defaults of those left out. Runs before any work."""
    trace = args.trace is not None
    tiny = args.model in TINY_MODEL_NAMES

    def given(dest: str) -> bool:
        value = getattr(args, dest)
        return value is not None and value is not False

    def refuse(option: str, needs: str) -> None:
        raise OptionError(f"{option} {needs}")

    if not trace:
        for flag, dest in TRACE_ONLY_OPTIONS:
            if given(dest):
                refuse(flag, "applies to a trace replay: add --trace FILE (with a preset or a config.json)")
    if args.step_time is not None and not args.timed:
        refuse("--step-time", "is the timed replay's step-time model: add --timed (with --trace FILE)")
    tier_flags = given_tier_options(args)
    if tier_flags and not args.timed:
        refuse(
            tier_flags[0], "sets offload tiers, which the timed replay runs: add --timed (with --trace FILE)"
        )
    check_tier_options(args)
    if trace:
        for flag, dest in SYNTHETIC_ONLY_OPTIONS:
            if given(dest):
                refuse(
                    flag, "sets the synthetic workload; a --trace replay takes its requests from the trace"
                )
        if args.no_prefix_caching:
            refuse("--no-prefix-caching", "cannot apply to a --trace replay, which measures the prefix cache")
        if args.per_group and args.timed:
            refuse("--per-group", "counts each group's hits in the pure replay: drop --timed")
        if args.max_num_seqs is not None and not args.timed:
            refuse("--max-num-seqs", "applies to --timed replays; the pure replay runs one request at a time")
        if args.device is not None:
            refuse("--device", "runs the tiny models' tensors; a --trace replay is bookkeeping only")
        if args.num_blocks is not None and args.memory is not None:
            refuse("--num-blocks", "and --memory both size the cache: give one")
        if args.sweep is not None and (args.num_blocks is not None or args.memory is not None):
            refuse("--sweep", "picks the cache sizes itself: drop --num-blocks / --memory")
        if args.plot is not None and (args.sweep or 0) < 2:
            refuse("--plot", "with --trace draws the hit rate against KV memory: add --sweep N (N >= 2)")
    elif tiny:
        if args.memory is not None:
            refuse("--memory", f"sizes a preset's cache; the tiny model {args.model!r} takes --num-blocks")
        if args.max_model_len is not None:
            refuse("--max-model-len", f"applies to presets; the tiny model {args.model!r} has its own")
        if args.assume_dense:
            refuse(
                "--assume-dense", f"applies to a config.json; the tiny model {args.model!r} is kvspec's own"
            )
    else:
        if args.num_blocks is not None:
            refuse(
                "--num-blocks", "sizes the tiny models' and --trace replays' caches; a preset takes --memory"
            )
        if args.device is not None:
            refuse("--device", "runs the tiny models' tensors; a preset's simulation is bookkeeping only")
    defaults = {
        "requests": 32,
        "workload": "shared-prefix",
        "max_tokens": 16,
        "seed": 0,
        "device": "cpu",
        "policy": "lru",
        "retention_interval": "planned",
        "step_time": "6,0.06,0.01",
    }
    for dest, value in defaults.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)


def _build_engine(args: argparse.Namespace) -> tuple[Engine, int, list[str]]:
    from kvspec.contracts.spec import SchedulerLimits
    from kvspec.contracts.traits import traits_of
    from kvspec.engine.engine import Engine
    from kvspec.engine.model import TINY_FULL, TINY_HYBRID

    tiny_models = {"tiny-full": TINY_FULL, "tiny-hybrid": TINY_HYBRID}
    caching = not args.no_prefix_caching
    notes: list[str] = []
    if args.model in tiny_models:
        cfg = tiny_models[args.model]
        engine = Engine.tiny(
            cfg,
            num_blocks=args.num_blocks or 256,
            block_size=args.block_size or DEFAULT_BLOCK_SIZE,
            enable_caching=caching,
            max_num_batched_tokens=args.max_num_batched_tokens or 128,
            max_num_seqs=args.max_num_seqs or 8,
            device=args.device,
        )
        return engine, cfg.vocab_size, notes

    mode: MambaCacheMode = "align" if caching else "none"
    layout = _model_layout(args, args.max_model_len, mode)
    if args.max_model_len is None and layout.max_model_len > 8192:
        layout = _model_layout(args, 8192, mode)  # a synthetic workload's requests are short: 8192 tokens
    specs = layout.layer_specs
    traits = [traits_of(s) for s in specs.values()]
    if caching and not all(t.supports_prefix_caching for t in traits):
        caching = False
        notes.append("a layer type without prefix caching (e.g. cross attention): prefix caching turned off")
    if caching and any(t.hits_at_own_block_boundaries for t in traits):
        notes.append("Mamba layers run in 'align' cache mode")
    limits = SchedulerLimits(
        max_model_len=layout.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens or 2048,
        max_num_encoder_input_tokens=layout.max_num_encoder_input_tokens,
        mamba_cache_mode="align" if caching else "none",
    )
    engine = Engine.bookkeeping(
        specs,
        limits,
        memory_bytes=args.memory or DEFAULT_MEMORY,
        enable_caching=caching,
        max_num_seqs=args.max_num_seqs or 64,
        seed=args.seed,
    )
    return engine, 32_000, notes


def plot_run(stats: EngineStats, path: str, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    steps = range(1, len(stats.usage_timeline) + 1)
    ax.plot(steps, stats.usage_timeline, label="block usage")
    ax.plot(steps, stats.hit_rate_timeline, label="prefix-cache hit rate (cumulative)")
    ax.set_xlabel("scheduler step")
    ax.set_ylabel("fraction (0 to 1)")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    # Below the axes, so the legend never covers the curves.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)
    fig.tight_layout()
    save_figure(fig, path)


def cmd_simulate(args: argparse.Namespace) -> int:
    try:
        check_options(args)
    except OptionError as exc:
        return refuse(exc)
    if args.trace is not None:
        return cmd_replay_trace(args)
    try:
        check_plot_path(args.plot)
        if args.model in TINY_MODEL_NAMES:
            from kvspec.device.backends import get_backend

            get_backend(args.device)  # an unknown or absent device is bad input: say so before any work
        load_installed_plugins(args)
        engine, vocab, notes = _build_engine(args)
    except KVSpecError as exc:
        return refuse(exc)
    prompt_len = args.prompt_len or (96 if args.model in TINY_MODEL_NAMES else 2048)
    max_len = engine.limits.max_model_len
    if prompt_len + args.max_tokens > max_len:
        print(
            f"kvspec: error: prompt-len + max-tokens must stay within max_model_len={max_len}",
            file=sys.stderr,
        )
        return 2
    work = make_workload(
        args.workload,
        num_requests=args.requests,
        prompt_len=prompt_len,
        max_tokens=args.max_tokens,
        vocab_size=vocab,
        seed=args.seed,
    )
    for item in work:
        if len(item.prompt) + item.max_tokens > max_len:
            item = type(item)(prompt=item.prompt[: max_len - item.max_tokens], max_tokens=item.max_tokens)
        engine.add_request(item.prompt, item.max_tokens)
    start = time.perf_counter()
    try:
        if args.json or not shows_progress():
            engine.run()
        else:
            from rich.progress import Progress

            with Progress(transient=True) as progress:
                task = progress.add_task(f"simulating {args.requests} requests", total=args.requests)
                engine.run(lambda _rid: progress.advance(task))
    except KVSpecError as exc:
        return refuse(exc)
    stats = engine.stats
    # Full: at the peak, fewer blocks were free than one more request needs (a hybrid's pool never reaches
    # exactly 100%: its groups take blocks in steps of several).
    if _ran_full(engine, stats.peak_usage, prompt_len + args.max_tokens):
        more = "--num-blocks" if args.model in TINY_MODEL_NAMES else "--memory"
        notes.append(
            f"the block pool ran full (peak usage {stats.peak_usage:.2%}, {stats.preemptions} preemptions): "
            f"cached prefixes were evicted before they could be reused, which lowers the hit rate; give it more "
            f"{more}"
        )
    report: dict[str, Any] = {
        "model": args.model,
        "workload": args.workload,
        "prefix_caching": engine.coordinator.enable_caching,
        "num_blocks": engine.coordinator.block_pool.num_gpu_blocks,
        "wall_seconds": round(time.perf_counter() - start, 3),
        **engine.stats.summary(),
        "notes": notes,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    title = f"{args.model}, {args.workload}, {args.requests} requests"
    write_plot(args, lambda path: plot_run(engine.stats, path, title))
    return 0


def _ran_full(engine: Engine, peak_usage: float, request_tokens: int) -> bool:
    """Whether the pool ran full: at its peak usage, fewer blocks were free than one request of
    ``request_tokens`` tokens holds (so admitting it evicted cached prefixes, or had to wait)."""
    from kvspec.engine.replay import PromptAdmission

    coordinator = engine.coordinator
    admission = PromptAdmission(coordinator, chunk_tokens=None)
    free_at_peak = round((1.0 - peak_usage) * admission.usable)
    return free_at_peak < admission.blocks_needed(min(request_tokens, coordinator.limits.max_model_len))


@contextlib.contextmanager
def _progress(label: str, total: int, *, quiet: bool) -> Iterator[Callable[[], None]]:
    """A progress bar for ``total`` steps (rich, when installed and not ``quiet``); yields the advance call."""
    if quiet or not shows_progress():
        yield lambda: None
        return
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda: progress.advance(task)


def _model_layout(
    args: argparse.Namespace, max_model_len: int | None, mamba_cache_mode: MambaCacheMode
) -> Any:
    """The model's layout (``max_model_len`` None: its own context length), refusing the options that cannot
    apply to it."""
    from kvspec.models import build_model_layout

    layout = build_model_layout(
        args.model,
        block_size=args.block_size or DEFAULT_BLOCK_SIZE,
        max_model_len=max_model_len,
        mamba_cache_mode=mamba_cache_mode,
        assume_dense=args.assume_dense,
    )
    check_layout_options(
        layout, {"--block-size": args.block_size is not None, "--assume-dense": args.assume_dense}
    )
    return layout


def _trace_plan(
    args: argparse.Namespace, layout: Any, requests: Callable[[], Iterator[Any]]
) -> tuple[Any, Any, float]:
    """The plan a trace replays with: ``layout`` as a config of ``--num-blocks`` blocks, or what ``--memory``
    holds when given, else room for every distinct prompt block of the admissible requests; its scheduler
    limits; and the KV cache bytes one block of its pool takes (every group's page, one rank). No
    coordinator is built here: a sweep builds one per size."""
    from kvspec.contracts.spec import SchedulerLimits
    from kvspec.engine.replay import blocks_to_hold_every_prompt
    from kvspec.planning import get_kv_cache_config

    limits = SchedulerLimits(
        max_model_len=layout.max_model_len,
        max_num_batched_tokens=min(args.max_num_batched_tokens or DEFAULT_TRACE_CHUNK, layout.max_model_len),
        max_num_encoder_input_tokens=layout.max_num_encoder_input_tokens,
        mamba_cache_mode="align",
    )
    # Without a budget, plan in a memory no trace exhausts, then keep room for every prompt's blocks.
    config = get_kv_cache_config(layout.layer_specs, args.memory or UNLIMITED_MEMORY, limits)
    bytes_per_block = sum(t.size for t in config.kv_cache_tensors) / config.num_blocks
    if args.num_blocks is not None:
        config = dataclasses.replace(config, num_blocks=args.num_blocks + 1)  # + the null block
    elif args.memory is None:
        block_sizes = [group.kv_cache_spec.block_size for group in config.kv_cache_groups]
        config = dataclasses.replace(config, num_blocks=blocks_to_hold_every_prompt(requests(), block_sizes))
    return config, limits, bytes_per_block


def sweep_block_counts(every_prompt: int, points: int) -> list[int]:
    """``points`` cache sizes in blocks, log-spaced from a tenth of ``every_prompt`` to all of it."""
    if points == 1:
        return [every_prompt]
    low = every_prompt / 10
    return sorted({max(2, round(low * (10 ** (i / (points - 1))))) for i in range(points)})


def plot_sweep(rows: list[dict[str, Any]], path: str, title: str) -> None:
    """Draw :func:`sweep_figure` to ``path``."""
    save_figure(sweep_figure(rows, title), path)


def sweep_figure(rows: list[dict[str, Any]], title: str) -> Any:
    """Hit rate against KV memory: per policy, tokens (solid) and trace blocks (dashed) in one colour, on an
    axis that ends just past the highest rate. With LRU and other policies, a second panel shows each
    policy's token hit rate relative to LRU's at the same size (a 14% gain is a visible bar there, where the
    curves lie on top of each other). The caller saves and closes it."""
    plt = pyplot()
    policies = list(dict.fromkeys(row["policy"] for row in rows))
    baseline = {row["num_blocks"]: row["token_hit_rate"] for row in rows if row["policy"] == "lru"}
    gains = baseline and len(policies) > 1
    fig, axes = plt.subplots(1, 2 if gains else 1, figsize=(13 if gains else 8, 4), squeeze=False)
    ax = axes[0][0]
    for index, policy in enumerate(policies):
        mine = [row for row in rows if row["policy"] == policy]
        memory = [row["kv_cache_gib"] for row in mine]
        colour = f"C{index}"
        ax.plot(
            memory,
            [row["token_hit_rate"] for row in mine],
            marker="o",
            color=colour,
            label=f"{policy}: tokens",
        )
        if "block_hit_rate" not in mine[0]:
            continue  # a timed replay: hit rate in tokens only
        ax.plot(
            memory,
            [row["block_hit_rate"] for row in mine],
            marker="s",
            linestyle="--",
            color=colour,
            label=f"{policy}: trace blocks",
        )
    ax.set_xscale("log")
    ax.set_xlabel("KV cache memory (GiB, one rank)")
    ax.set_ylabel("prefix-cache hit rate")
    # The axis ends just past the highest rate (hit rates of a few percent would lie flat on a 0-1 axis).
    highest = max(max(row["token_hit_rate"], row.get("block_hit_rate", 0.0)) for row in rows)
    ax.set_ylim(0, min(1.0, highest * 1.15) if highest > 0 else 1.0)
    ax.set_title(title)
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        ncol=min(4, 2 * len(policies)),
        frameon=False,
        fontsize=8,
    )
    if gains:
        gain_ax = axes[0][1]
        for index, policy in enumerate(policies):
            if policy == "lru":
                continue
            mine = [row for row in rows if row["policy"] == policy and baseline.get(row["num_blocks"])]
            gain_ax.plot(
                [row["kv_cache_gib"] for row in mine],
                [100 * (row["token_hit_rate"] / baseline[row["num_blocks"]] - 1) for row in mine],
                marker="o",
                color=f"C{index}",
                label=policy,
            )
        gain_ax.axhline(0, color="grey", linewidth=0.8)
        gain_ax.set_xscale("log")
        gain_ax.set_xlabel("KV cache memory (GiB, one rank)")
        gain_ax.set_ylabel("token hit rate vs LRU (%)")
        gain_ax.set_title("gain over LRU at the same memory")
        gain_ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


#: How slow a replay under each built-in policy is, slowest 0 (docs/FLEET.md "Speed"): a pool starts those first.
_POLICY_COST = {"hybrid": 0, "lfu": 1, "slru": 2, "retention": 2, "lru": 3}


@dataclass(frozen=True, kw_only=True, slots=True)
class _ReplayRun:
    """One replay of a trace run (values only, so it crosses to a pool's process)."""

    trace: str
    limit: int | None
    max_prompt_tokens: int
    config: Any
    limits: Any
    policy: str
    retention: int | None
    chunk_tokens: int
    max_num_seqs: int
    step_time: Any
    bytes_per_block: float
    tiers: Any = None
    per_group: bool = False


def _replay_run(run: _ReplayRun, advance: Callable[[], None] | None = None) -> dict[str, Any]:
    """One run's row: the pure replay, or the timed one when the run has a step-time model."""
    from kvspec.engine.replay import TraceClock, replay_cache, replay_coordinator
    from kvspec.engine.timed_replay import replay_timed
    from kvspec.engine.traces import read_trace

    tick = advance if advance is not None else (lambda: None)
    requests = read_trace(run.trace, limit=run.limit, max_prompt_tokens=run.max_prompt_tokens)
    clock = TraceClock()
    coordinator = replay_coordinator(
        run.config, run.limits, eviction_policy=run.policy, clock=clock, retention_interval=run.retention
    )
    start = time.perf_counter()
    if run.step_time is not None:
        summary = replay_timed(
            requests,
            coordinator,
            max_num_batched_tokens=run.chunk_tokens,
            max_num_seqs=run.max_num_seqs,
            step_time=run.step_time,
            clock=clock,
            on_finish=lambda _request: tick(),
            tiers=run.tiers,
        ).summary()
    else:
        summary = replay_cache(
            requests,
            coordinator,
            chunk_tokens=run.chunk_tokens,
            on_request=lambda _r, _h: tick(),
            clock=clock,
            per_group=run.per_group,
        ).summary()
    seconds = time.perf_counter() - start
    num_blocks = run.config.num_blocks - 1
    row: dict[str, Any] = {
        "policy": run.policy,
        "num_blocks": num_blocks,
        "kv_cache_gib": round(num_blocks * run.bytes_per_block / 2**30, 3),
        **summary,
        "wall_seconds": round(seconds, 3),
    }
    if run.step_time is None:
        row["prompt_tokens_per_second"] = round(int(summary["prompt_tokens"]) / seconds) if seconds else 0
    return row


@dataclass(frozen=True, kw_only=True)
class _TraceJob:
    """What ``--trace`` replays, checked before any replay: the policies, the planned config and limits, the
    retention (tokens; None: dense), the optional step-time model and tiers, and the trace's counts."""

    policies: list[str]
    config: Any
    limits: Any
    bytes_per_block: float
    retention: int | None
    step_time: Any
    tiers: Any
    max_model_len: int
    scheduler_block: int
    num_requests: int
    longest: int


def _group_lines(config: Any, row: dict[str, Any]) -> dict[str, Any]:
    """--per-group's figures as a person reads them: each group's kind and own hit rate, and the groups that
    limited the most hits (with how many requests they limited)."""
    from kvspec.contracts.traits import traits_of
    from kvspec.coordinator.prefix_diagnosis import group_kind

    kinds = [group_kind(traits_of(g.kv_cache_spec)) for g in config.kv_cache_groups]
    rates = row.get("group_hit_rates", [])
    limiting: list[int] = row.get("limiting_groups", [])
    named = ", ".join(map(str, limiting))
    return {
        "group_hit_rates": [f"{g} {kind}: {rate:.4f}" for g, (kind, rate) in enumerate(zip(kinds, rates))],
        "limiting_groups": f"{named} ({', '.join(dict.fromkeys(kinds[g] for g in limiting))}), on "
        f"{row['group_limited_requests'][limiting[0]]:,} of {row['requests']:,} requests"
        if limiting
        else "none",
    }


def cmd_replay_trace(args: argparse.Namespace) -> int:
    """``kvspec simulate MODEL --trace FILE``: the pure cache replay (kvspec.engine.replay), once or at
    ``--sweep`` cache sizes."""
    try:
        job = _trace_job(args)
    except InsufficientKVCacheMemoryError as exc:
        return refuse(exc, capacity_message(exc, "--memory", args.memory))
    except KVSpecError as exc:
        return refuse(exc)
    # Prompts are computed in chunks of the scheduler's token budget (Mamba keeps states where chunks end).
    chunk_tokens = args.max_num_batched_tokens or DEFAULT_TRACE_CHUNK
    sizes = _sweep_sizes(args, job, chunk_tokens) if args.sweep else [job.config.num_blocks - 1]
    runs = [
        _ReplayRun(
            trace=args.trace,
            limit=args.limit,
            max_prompt_tokens=job.max_model_len,
            config=dataclasses.replace(job.config, num_blocks=num_blocks + 1),
            limits=job.limits,
            policy=policy,
            retention=job.retention,
            chunk_tokens=chunk_tokens,
            max_num_seqs=args.max_num_seqs or DEFAULT_TRACE_SEQS,
            step_time=job.step_time,
            bytes_per_block=job.bytes_per_block,
            tiers=job.tiers,
            per_group=args.per_group,
        )
        for policy in job.policies
        for num_blocks in sizes
    ]
    rows = _replay_runs(runs, args, job.num_requests)
    if not args.sweep and all(row["refused"] == row["requests"] for row in rows):
        # Nothing was replayed: a report of hit rate 0 would read as a result.
        more = "--num-blocks" if args.num_blocks is not None else "--memory"
        print(
            f"kvspec: error: every request was refused: none fits max_model_len {job.limits.max_model_len:,} "
            f"and {sizes[0]:,} blocks (the longest prompt is {job.longest:,} tokens); raise {more} or "
            "--max-model-len",
            file=sys.stderr,
        )
        return 1
    _print_trace_report(args, job, chunk_tokens, rows)
    return 0


def _trace_job(args: argparse.Namespace) -> _TraceJob:
    """Every check ``--trace`` makes before a replay: plugins, the policies, the step time, tiers, the
    retention, the model's layout, every trace line (read once and counted), the plan, and a probe
    coordinator (a retention or tier memory the layout cannot take fails here)."""
    from kvspec.engine.replay import PLANNED_RETENTION, replay_coordinator
    from kvspec.engine.step_time import parse_step_time
    from kvspec.eviction import resolve_eviction_policy

    check_plot_path(args.plot)
    load_installed_plugins(args)
    if args.model in TINY_MODEL_NAMES:
        raise ModelConfigError(
            f"--trace replays through a model's layout, not the tiny model {args.model!r}: name a preset "
            "or a config.json (e.g. llama-3.1-8b)"
        )
    policies = [name.strip() for name in args.policy.split(",") if name.strip()]
    if not policies:
        raise UnknownEvictionPolicyError("--policy names no eviction policy; give e.g. lru,lfu")
    for name in policies:
        resolve_eviction_policy(name)  # an unknown name fails before the trace is read
    step_time = parse_step_time(args.step_time) if args.timed else None
    tiers = tier_settings(args)
    retention: int | None = (
        PLANNED_RETENTION
        if args.retention_interval == "planned"
        else None
        if args.retention_interval == "dense"
        else args.retention_interval
    )
    # The model's own context length unless --max-model-len says otherwise (longer prompts are refused
    # as an engine refuses them); prefix caching on, Mamba "align".
    layout = _model_layout(args, args.max_model_len, "align")

    requests = functools.partial(_stream_trace, args, layout.max_model_len)

    # A first pass reads every line (a bad one fails here, before any replay) and counts.
    num_requests = longest = 0
    for item in requests():
        num_requests += 1
        longest = max(longest, item.input_length)
    if not num_requests:
        raise TraceFormatError(f"trace {args.trace!r} holds no requests (an empty file or blank lines only)")
    config, limits, bytes_per_block = _trace_plan(args, layout, requests)
    # A retention the layout cannot take (not a block multiple, or no windowed group) fails here.
    probe = replay_coordinator(
        dataclasses.replace(config, num_blocks=2), limits, retention_interval=retention
    )
    if tiers is not None:  # tier memory below one block of this model fails here, before any replay
        from kvspec.engine.offload import build_connector

        build_connector(probe, tiers)
    return _TraceJob(
        policies=policies,
        config=config,
        limits=limits,
        bytes_per_block=bytes_per_block,
        retention=retention,
        step_time=step_time,
        tiers=tiers,
        max_model_len=layout.max_model_len,
        # The layout's scheduler block may differ from --block-size (Mamba "align"): the coordinator's.
        scheduler_block=probe.scheduler_block_size,
        num_requests=num_requests,
        longest=longest,
    )


def _stream_trace(args: argparse.Namespace, max_prompt_tokens: int) -> Iterator[Any]:
    """The trace, streamed anew for each pass (memory: one line, and one request's tokens)."""
    from kvspec.engine.traces import read_trace

    return read_trace(args.trace, limit=args.limit, max_prompt_tokens=max_prompt_tokens)


def _sweep_sizes(args: argparse.Namespace, job: _TraceJob, chunk_tokens: int) -> list[int]:
    """The cache sizes (blocks) of ``--sweep``: up to what an unlimited LRU replay keeps (sparse retention
    keeps few windowed and Mamba blocks) plus room for the longest prompt; beyond it more memory changes
    nothing."""
    from kvspec.engine.replay import blocks_retained, blocks_to_hold_every_prompt

    requests = functools.partial(_stream_trace, args, job.max_model_len)
    block_sizes = [group.kv_cache_spec.block_size for group in job.config.kv_cache_groups]
    unlimited = dataclasses.replace(
        job.config, num_blocks=blocks_to_hold_every_prompt(requests(), block_sizes)
    )
    top = blocks_retained(
        requests(), unlimited, job.limits, chunk_tokens=chunk_tokens, retention_interval=job.retention
    )
    return sweep_block_counts(top, args.sweep)


def _replay_runs(runs: list[_ReplayRun], args: argparse.Namespace, num_requests: int) -> list[dict[str, Any]]:
    """Each run's row, in order: on a process pool when there are several runs and workers, else in turn
    with a progress bar per run."""
    workers = min(len(runs), args.workers or os.cpu_count() or 1)
    if workers <= 1:
        rows = []
        for index, run in enumerate(runs):
            label = (
                f"replaying {num_requests} requests ({index + 1}/{len(runs)}: {run.policy}, "
                f"{run.config.num_blocks - 1} blocks)"
            )
            with _progress(label, num_requests, quiet=args.json) as advance:
                rows.append(_replay_run(run, advance))
        return rows
    # Each run is independent and deterministic: a process pool gives the rows a loop would, in order.
    from concurrent.futures import ProcessPoolExecutor

    with (
        ProcessPoolExecutor(max_workers=workers) as pool,
        _progress(f"replaying {len(runs)} runs on {workers} processes", len(runs), quiet=args.json) as done,
    ):
        # The longest runs first (a policy object costs more than the pool's own LRU list, a small
        # cache more than a large one), so no process idles at the end waiting for one slow run.
        order = sorted(
            range(len(runs)),
            key=lambda i: (_POLICY_COST.get(runs[i].policy, 1), runs[i].config.num_blocks),
        )
        futures = {i: pool.submit(_replay_run, runs[i]) for i in order}
        for future in futures.values():
            future.add_done_callback(lambda _f: done())
        return [futures[i].result() for i in range(len(runs))]


def _print_trace_report(
    args: argparse.Namespace, job: _TraceJob, chunk_tokens: int, rows: list[dict[str, Any]]
) -> None:
    """The replay's report (JSON with ``--json``), a table per sweep row, and the plot."""
    report: dict[str, Any] = {
        "model": args.model,
        "max_model_len": job.limits.max_model_len,
        "trace": args.trace,
        "mode": (
            f"timed replay (arrival times, FCFS scheduler, step time {args.step_time} ms)"
            if job.step_time is not None
            else "pure cache replay (arrival order, one request at a time)"
        ),
        "chunk_tokens": chunk_tokens,
        "eviction": job.policies[0] if len(job.policies) == 1 else job.policies,
        "block_size": job.scheduler_block,
        "kv_cache_groups": len(job.config.kv_cache_groups),
        "prefix_cache_retention_interval": "dense" if job.retention is None else job.retention,
    }
    tiers = job.tiers
    if tiers is not None:
        report["host_memory"] = human_bytes(tiers.host_bytes) if tiers.host_bytes else "none"
        report["shared_pool"] = human_bytes(tiers.pool_bytes) if tiers.pool_bytes else "none"
        report["host_options"] = dict(tiers.host_options) or "lru"
        report["offload"] = ",".join(tiers.offload)
    if args.sweep or len(rows) > 1:
        report["sweep"] = rows
    else:
        report.update(rows[0])
        if args.per_group and not args.json:
            report.update(_group_lines(job.config, rows[0]))
    if args.json:
        print(json.dumps(report, indent=2))
    elif "sweep" in report:
        print_report(report, skip=("sweep",))
        second_name = "median TTFT ms" if job.step_time is not None else "block hit rate"
        print(
            f"{'policy':>10} {'blocks':>12} {'KV GiB':>9} {'token hit rate':>15} {second_name:>15} "
            f"{'refused':>8}"
        )
        for row in rows:
            second = row["block_hit_rate"] if "block_hit_rate" in row else row["ttft_ms_median"]
            print(
                f"{row['policy']:>10} {row['num_blocks']:>12} {row['kv_cache_gib']:>9} "
                f"{row['token_hit_rate']:>15.4f} {second:>15} {row['refused']:>8}"
            )
    else:
        print_report(report)
    write_plot(args, lambda path: plot_sweep(rows, path, f"{args.model}, {args.trace.rsplit('/', 1)[-1]}"))
