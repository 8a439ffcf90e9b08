"""``kvspec fleet``: N engine instances behind a router, fed a trace; one run or a sweep."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvspec.cli.args import block_size, capacity_message, comma_list, event_release, parse_bytes, refuse
from kvspec.cli.args import positive_int as _positive
from kvspec.cli.plots import pyplot, save_figure, write_plot
from kvspec.cli.plugins import add_plugin_options, load_installed_plugins
from kvspec.cli.terminal import print_report, shows_progress
from kvspec.cli.tiers import add_tier_options, check_tier_options
from kvspec.contracts.release import DEFAULT_BLOCK_SIZE
from kvspec.errors import InsufficientKVCacheMemoryError, KVSpecError, OptionError

#: Per-instance KV blocks when neither --memory nor --num-blocks is given: DynoSim's default.
DEFAULT_BLOCKS = 16384


def _list(kind: Any) -> Any:
    def parse(text: str) -> list[Any]:
        return [kind(item) for item in comma_list(text)]

    return parse


def _router_option(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--router-option {text!r}: give NAME=NUMBER, e.g. cache_threshold=0.5"
        ) from None


def add_fleet_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "fleet",
        help="replay a trace on N engine instances behind a router (KV-aware routing, sweeps)",
        description="Replay a trace on a fleet: N exact kvspec engines of MODEL behind a router. Comma-"
        "separated lists of instances, routers, memories or policies run a sweep (one fleet per combination).",
    )
    p.add_argument("model", help="a preset (e.g. llama-3.1-8b, gemma-3-27b, jamba-1.5-mini) or a config.json")
    p.add_argument("--trace", required=True, metavar="FILE", help="Mooncake or kvspec JSONL trace")
    p.add_argument("--instances", type=_list(_positive), default=[4], metavar="N[,N...]", help="default 4")
    p.add_argument(
        "--router",
        type=_list(str),
        default=["round_robin"],
        metavar="NAME[,NAME...]",
        help="default round_robin",
    )
    p.add_argument("--router-option", type=_router_option, action="append", default=[], metavar="NAME=VALUE")
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--memory",
        type=_list(parse_bytes),
        default=None,
        metavar="BYTES[,...]",
        help="KV cache memory per instance (planned for the model)",
    )
    size.add_argument(
        "--num-blocks",
        type=_list(_positive),
        default=None,
        metavar="N[,...]",
        help=f"KV cache blocks per instance (default {DEFAULT_BLOCKS}, DynoSim's)",
    )
    p.add_argument("--eviction", type=_list(str), default=["lru"], metavar="POLICY[,...]", help="default lru")
    p.add_argument(
        "--block-size",
        type=block_size,
        default=DEFAULT_BLOCK_SIZE,
        help=f"tokens per block (default {DEFAULT_BLOCK_SIZE}, vLLM 0.34's)",
    )
    p.add_argument(
        "--step-time",
        default="default",
        metavar="dynosim|BASE,PER_TOKEN,PER_REQUEST",
        help="step-time model (default 6,0.06,0.01 ms; 'dynosim': Dynamo's polynomial)",
    )
    p.add_argument("--max-num-batched-tokens", type=_positive, default=8192)
    p.add_argument("--max-num-seqs", type=_positive, default=256)
    p.add_argument("--speedup", type=float, default=1.0, help="arrival times divided by this (default 1)")
    p.add_argument("--event-lag-ms", type=float, default=0.0, help="KV events reach the router this late")
    p.add_argument(
        "--event-wire",
        type=event_release,
        default=None,
        metavar="RELEASE",
        help="the vLLM release whose KV event wire format events travel in (default: the current release)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--per-group",
        action="store_true",
        help="a hybrid: each KV-cache group's own reuse and the groups that limited the hits (one more "
        "search per admission)",
    )
    p.add_argument("--limit", type=_positive, default=None, help="only the trace's first N requests")
    p.add_argument(
        "--max-output-tokens",
        type=_positive,
        default=None,
        metavar="N",
        help="cap every request's output at N tokens (Mooncake's Fig. 10 setup: 1)",
    )
    p.add_argument(
        "--executor",
        choices=("inprocess", "process", "ray"),
        default=None,
        help="how a sweep runs its points (default: a process pool); given for one fleet, that fleet runs "
        "through it too",
    )
    p.add_argument(
        "--workers", type=_positive, default=None, help="process pool size (default: one per core)"
    )
    p.add_argument("--ray-address", default=None, help="auto or HOST:PORT (default: a local Ray)")
    p.add_argument(
        "--out",
        default=None,
        metavar="FILE.jsonl",
        help="append each finished point; a rerun skips the points already there (resume)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", metavar="PNG", default=None, help="draw reuse and TTFT per router")
    add_tier_options(p, sweep=True)
    add_plugin_options(p)
    p.set_defaults(func=cmd_fleet)


def _points(args: argparse.Namespace) -> list[Any]:
    from kvspec.fleet.sweep import expand_points

    sizes: dict[str, list[Any]]
    if args.memory is not None:
        sizes = {"memory": args.memory}
    else:
        sizes = {"num_blocks": args.num_blocks or [DEFAULT_BLOCKS]}
    base = {
        "model": args.model,
        "trace": args.trace,
        "limit": args.limit,
        "block_size": args.block_size,
        "step_time": args.step_time,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs,
        "speedup": args.speedup,
        "event_lag_ms": args.event_lag_ms,
        "seed": args.seed,
        "router_options": tuple(args.router_option),
        "per_group": args.per_group,
    }
    for name in (
        "event_wire",
        "max_output_tokens",
        "host_policy",
        "store_threshold",
        "offload",
        "host_link",
        "pool_link",
    ):
        value = getattr(args, name)
        if value is not None:
            base[name] = tuple(value) if isinstance(value, tuple) else value
    tiers: dict[str, list[Any]] = {}
    if args.host_memory is not None:
        tiers["host_memory"] = args.host_memory
    if args.shared_pool is not None:
        tiers["shared_pool"] = args.shared_pool
    return expand_points(
        base,
        {
            "num_instances": args.instances,
            **sizes,
            **tiers,
            "router": args.router,
            "eviction_policy": args.eviction,
        },
    )


def _check(args: argparse.Namespace, points: list[Any]) -> None:
    """Everything that can be refused before any replay: names, options, the step-time model, the trace."""
    from kvspec.engine.step_time import parse_step_time
    from kvspec.eviction import resolve_eviction_policy
    from kvspec.fleet import resolve_router
    from kvspec.fleet.registry import build_router
    from kvspec.fleet.routing import RouterContext
    from kvspec.fleet.sweep import check_point

    if args.workers is not None and args.executor not in (None, "process"):
        raise OptionError(
            f"--workers sizes the process pool; it does not apply with --executor {args.executor}"
        )
    if args.ray_address is not None and args.executor != "ray":
        raise OptionError("--ray-address names a Ray cluster; it needs --executor ray")
    check_tier_options(args)
    parse_step_time(args.step_time)
    for name in args.eviction:
        resolve_eviction_policy(name)
    for name in args.router:
        build_router(
            resolve_router(name),
            RouterContext(num_instances=2, block_size=args.block_size, options=dict(args.router_option)),
        )
    check_point(points[0])


def _has_tiers(rows: list[dict[str, Any]]) -> bool:
    return any(r["point"].get("host_memory") or r["point"].get("shared_pool") for r in rows)


def _row(row: dict[str, Any], tiers: bool = False) -> dict[str, Any]:
    point, total = row["point"], row["total"]
    return {
        "instances": point["num_instances"],
        "router": point["router"],
        "eviction": point["eviction_policy"],
        "blocks": row["blocks_per_instance"],
        "kv_gib": row["kv_cache_gib_per_instance"],
        **(
            {
                "host_gib": round(point.get("host_memory", 0) / 2**30, 1),
                "pool_gib": round(point.get("shared_pool", 0) / 2**30, 1),
                "gpu_reuse": total.get("gpu_reuse_ratio", total["reuse_ratio"]),
                "host_reuse": total.get("host_reuse_ratio", 0.0),
                "pool_reuse": total.get("pool_reuse_ratio", 0.0),
            }
            if tiers
            else {}
        ),
        "reuse": total["reuse_ratio"],
        "ttft_mean": total["ttft_ms_mean"],
        "ttft_p90": total["ttft_ms_p90"],
        "e2e_mean": total["e2e_ms_mean"],
        "preempt": total["preemptions"],
        "imbalance": total["load_imbalance"],
        "wall_s": row["wall_seconds"],
    }


def print_sweep(rows: list[dict[str, Any]]) -> None:
    table = [_row(r, _has_tiers(rows)) for r in rows]
    if not table:
        print("nothing to run: every point is already in --out")
        return
    widths = {k: max(len(k), *(len(str(t[k])) for t in table)) for k in table[0]}
    print("  ".join(k.rjust(w) for k, w in widths.items()))
    for t in table:
        print("  ".join(str(t[k]).rjust(w) for k, w in widths.items()))


#: The point settings a bar's label names when they vary across a sweep, in this order, and how.
_LABELLED: tuple[tuple[str, str], ...] = (
    ("router", "{}"),
    ("num_instances", "{} instances"),
    ("memory", "{} KV"),
    ("num_blocks", "{} blocks"),
    ("eviction_policy", "evict {}"),
    ("host_memory", "host {}"),
    ("shared_pool", "pool {}"),
    ("host_policy", "host policy {}"),
    ("store_threshold", "store after {}"),
    ("offload", "offload {}"),
    ("host_link", "host link {}"),
    ("pool_link", "pool link {}"),
    ("step_time", "step {}"),
    ("event_lag_ms", "lag {} ms"),
    ("speedup", "x{}"),
    ("router_options", "{}"),
)


def size_as_typed(num_bytes: int) -> str:
    """Bytes as a user types them: the largest unit in which they are a number of at most two decimals
    (64GiB, 1.5TiB, 80GB), else GiB with two decimals; 0 is "none"."""
    if num_bytes == 0:
        return "none"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("TB", 10**12), ("GB", 10**9)):
        if num_bytes >= scale and (num_bytes * 100) % scale == 0:
            return f"{num_bytes / scale:g}{unit}"
    return f"{num_bytes / 2**30:.2f}GiB"


def bar_labels(rows: list[dict[str, Any]]) -> list[str]:
    """One label per row, one line per point setting that varies across the rows (router, instances, memory
    as typed, tiers, policies, ...), so no two bars of different settings read alike."""
    points = [row["point"] for row in rows]
    varying = [
        (key, form)
        for key, form in _LABELLED
        if len({json.dumps(p.get(key), sort_keys=True) for p in points}) > 1 or (key == "router" and points)
    ]

    def shown(key: str, value: Any) -> str:
        if key in ("memory", "host_memory", "shared_pool"):
            return "-" if value is None else size_as_typed(int(value))
        if key == "offload":
            return ",".join(value)
        if key == "router_options":
            return ",".join(f"{k}={v:g}" for k, v in value) or "defaults"
        return str(value)

    return ["\n".join(form.format(shown(key, p.get(key))) for key, form in varying) for p in points]


def plot_fleet(rows: list[dict[str, Any]], path: str, title: str) -> None:
    """Draw :func:`fleet_figure` to ``path``."""
    save_figure(fleet_figure(rows, title), path)


def fleet_figure(rows: list[dict[str, Any]], title: str) -> Any:
    """Reuse and mean TTFT per point as horizontal bars, labelled with every setting that varies (one line
    each): the labels stack down the page, so none overlaps however many points, and each axis starts at 0
    and ends just past its largest bar. The caller saves and closes it."""
    plt = pyplot()
    table = [_row(r) for r in rows]
    labels = bar_labels(rows)
    lines = max(label.count("\n") + 1 for label in labels)
    height = max(3.0, len(table) * (0.22 * lines + 0.25) + 1.2)
    fig, axes = plt.subplots(1, 2, figsize=(11, height), sharey=True)
    positions = list(range(len(table)))
    for ax, key, name, colour in (
        (axes[0], "reuse", "prompt tokens reused", "C0"),
        (axes[1], "ttft_mean", "mean TTFT (ms)", "C1"),
    ):
        values = [t[key] for t in table]
        ax.barh(positions, values, color=colour)
        ax.set_xlabel(name)
        ax.set_xlim(0, max(values) * 1.1 if max(values) > 0 else 1)
    axes[0].invert_yaxis()  # the first point on top, as the table prints it (the axes share y)
    axes[0].set_yticks(positions)
    axes[0].set_yticklabels(labels, fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def cmd_fleet(args: argparse.Namespace) -> int:
    from kvspec.cli.args import check_output_path, check_plot_path
    from kvspec.fleet.sweep import read_point_trace, run_point, run_sweep

    try:
        check_plot_path(args.plot)
        check_output_path("--out", args.out)
        load_installed_plugins(args)
        points = _points(args)
        _check(args, points)
        # Every line read before any replay (a bad one, or none, fails here); one fleet here reuses them.
        trace = read_point_trace(points[0])
        one_here = len(points) == 1 and args.out is None and args.executor is None and args.workers is None
        if one_here:
            from kvspec.cli.simulate import _progress

            label = f"{points[0].num_instances} instances, {points[0].router}: {len(trace)} requests"
            with _progress(label, len(trace), quiet=args.json) as advance:
                rows = [run_point(points[0], trace, on_request=lambda _item: advance())]
        else:
            progress = shows_progress() and not args.json

            def note(row: dict[str, Any]) -> None:
                if progress:
                    t = _row(row)
                    print(
                        f"  done: {t['instances']} x {t['router']} {t['eviction']} {t['blocks']} blocks: "
                        f"reuse {t['reuse']}",
                        file=sys.stderr,
                    )

            rows = run_sweep(
                points,
                executor=args.executor or "process",
                workers=args.workers,
                ray_address=args.ray_address,
                out=args.out,
                on_row=note,
            )
    except InsufficientKVCacheMemoryError as exc:  # in the command's words, as kvspec simulate says it
        return refuse(exc, capacity_message(exc, "--memory"))
    except KVSpecError as exc:  # a bad trace exits 1, as in kvspec simulate (docs/TRACES.md)
        return refuse(exc)
    if args.json:
        print(json.dumps(rows if len(rows) != 1 else rows[0], indent=2))
    elif one_here:
        row = rows[0]
        print_report({**{k: v for k, v in row["point"].items() if v not in (None, ())}, **row["total"]})
        print()
        print_sweep(rows)
        print()
        keys = [
            "instance",
            "requests",
            "reuse_ratio",
            "ttft_ms_mean",
            "ttft_ms_p90",
            "queue_ms_mean",
            "preemptions",
        ]
        print("  ".join(k.rjust(12) for k in keys))
        for inst in row["instances"]:
            print("  ".join(str(inst[k]).rjust(12) for k in keys))
    else:
        print_sweep(rows)
    write_plot(args, lambda path: plot_fleet(rows, path, f"{args.model}, {args.trace.rsplit('/', 1)[-1]}"))
    return 0
