"""The ``kvspec`` command: ``plan`` a KV cache layout, ``inspect`` the registry, ``simulate`` a workload.

Exit codes: 0 success; 1 the model does not fit (the reason and a max_model_len that would fit are
printed); 2 bad arguments (unknown model, malformed config, bad sizes).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

# Only light modules at import time: `kvspec --help` must not load torch. The commands import the
# library when they run.
from kvspec.cli.args import (
    block_size,
    capacity_message,
    check_layout_options,
    check_plot_path,
    human_bytes,
    parse_bytes,
    refuse,
)
from kvspec.cli.args import positive_int as _positive
from kvspec.cli.plots import pyplot, save_figure
from kvspec.cli.plugins import add_plugin_options, load_installed_plugins
from kvspec.cli.terminal import print_line, print_table
from kvspec.errors import (
    InsufficientKVCacheMemoryError,
    KVSpecError,
    OptionError,
    PluginError,
)
from kvspec.presets import DEFAULT_MODEL, KV_CACHE_DTYPES, preset_names

if TYPE_CHECKING:
    from kvspec.contracts.spec import KVCacheSpec, SchedulerLimits
    from kvspec.planning.config import KVCacheConfig, KVCacheTensor


def _fail(message: str, code: int) -> NoReturn:
    print(f"kvspec: error: {message}", file=sys.stderr)
    raise SystemExit(code)


# -- plan ---------------------------------------------------------------------------------------


def _group_rows(config: KVCacheConfig, limits: SchedulerLimits) -> list[dict[str, Any]]:
    from kvspec.planning import group_bytes_per_request
    from kvspec.specs.kinds import get_kv_cache_spec_kind_name, get_kv_cache_spec_sliding_window
    from kvspec.specs.uniform import UniformTypeKVCacheSpecs

    rows = []
    for gid, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        inner = list(spec.kv_cache_specs.values()) if isinstance(spec, UniformTypeKVCacheSpecs) else [spec]
        rows.append(
            {
                "group": gid,
                "layer_names": list(group.layer_names),
                "kind": get_kv_cache_spec_kind_name(spec),
                "spec": type(spec).__name__,
                "layers": len(group.layer_names),
                "block_size": spec.block_size,
                "tokens_per_block": _block_tokens(spec),
                "page_size_bytes": spec.page_size_bytes,
                "sliding_window": get_kv_cache_spec_sliding_window(spec),
                "bytes_per_request": group_bytes_per_request(group, limits),
                # A state (Mamba, ring) is per request, not per token: it has no bytes per token.
                "bytes_per_token": sum(_token_bytes(s) for s in inner)
                * (1 if isinstance(spec, UniformTypeKVCacheSpecs) else len(group.layer_names)),
            }
        )
    return rows


#: --vllm-release values, newest first: release -> kvspec.contracts.release profile name.
RELEASE_CHOICES = ("0.34", "0.23")


def _profile(release: str) -> Any:
    from kvspec.contracts.release import PROFILES

    return PROFILES[f"vllm-{release}"]


def build_plan(args: argparse.Namespace) -> dict[str, Any]:
    """The plan under ``args.vllm_release``'s defaults; with the default block size, also the figures under
    the other release where they differ (``plan["other_release"]``)."""
    release = getattr(args, "vllm_release", RELEASE_CHOICES[0])
    profile = _profile(release)
    explicit_block = args.block_size is not None
    plan = _build_plan(args, args.block_size or profile.default_block_size, profile)
    plan["vllm_release"] = release
    plan["block_size_default"] = not explicit_block
    plan["requested_block_size"] = args.block_size or profile.default_block_size
    layered = plan.get("fits") and any(
        row["sliding_window"] or row["kind"] == "mamba" for stage in plan["stages"] for row in stage["groups"]
    )
    plan["prefix_cache_retention_interval"] = (
        profile.planning.prefix_cache_retention_interval if layered else None
    )
    other = next(r for r in RELEASE_CHOICES if r != release)
    if not explicit_block and _profile(other).default_block_size != profile.default_block_size:
        alt = _build_plan(args, _profile(other).default_block_size, _profile(other))
        plan["other_release"] = {
            "vllm_release": other,
            "default_block_size": _profile(other).default_block_size,
            "block_size": alt.get("block_size"),
            "fits": alt["fits"],
            "num_blocks": alt.get("num_blocks"),
            "groups": len(alt["stages"][0]["groups"]) if alt.get("fits") else None,
            "token_slots": alt.get("token_slots"),
            "max_concurrency": alt.get("max_concurrency"),
        }
    return plan


def _build_plan(args: argparse.Namespace, block_size: int, profile: Any) -> dict[str, Any]:
    """``kvspec plan``'s report for one block size under ``profile``: the model's layout checked against the
    options given, planned per worker, and the figures of what fits (or why nothing does)."""
    from kvspec.contracts.spec import SchedulerLimits
    from kvspec.contracts.traits import traits_of
    from kvspec.models import build_model_layout
    from kvspec.planning import get_kv_cache_configs

    layout = build_model_layout(
        args.model,
        block_size=block_size,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        tensor_parallel_size=args.tp,
        pipeline_parallel_size=args.pp,
        max_model_len=args.max_model_len,
        mamba_cache_mode=args.mamba_cache_mode,
        assume_dense=args.assume_dense,
        align_to_block_size=profile.default_block_size > 16,
    )
    limits = SchedulerLimits(
        max_model_len=layout.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens or min(8192, layout.max_model_len),
        max_num_encoder_input_tokens=layout.max_num_encoder_input_tokens,
        mamba_cache_mode=args.mamba_cache_mode,
    )
    check_layout_options(
        layout,
        {
            "--dtype": args.dtype is not None,
            "--kv-cache-dtype": args.kv_cache_dtype != "auto",
            "--block-size": args.block_size is not None,
            "--tp": args.tp != 1,
            "--assume-dense": args.assume_dense,
        },
    )
    if args.mamba_cache_mode != "none" and not any(
        traits_of(spec).kind == "mamba" for spec in layout.layer_specs.values()
    ):
        raise OptionError(f"--mamba-cache-mode applies to models with Mamba layers; {layout.name} has none")
    workers = layout.per_worker_specs(args.tp)
    plan: dict[str, Any] = {
        "model": layout.name,
        "model_type": layout.model_type,
        "memory_per_worker_bytes": args.memory,
        "tensor_parallel_size": args.tp,
        "pipeline_parallel_size": args.pp,
        "max_model_len": limits.max_model_len,
        "max_num_batched_tokens": limits.batched_tokens,
        "hybrid": args.hybrid,
        "family": layout.family or None,
        "layout_file": layout.model_type == "kvspec_layout",
        "notes": list(layout.notes),
    }
    try:
        configs = get_kv_cache_configs(
            workers,
            [args.memory] * len(workers),
            limits,
            hybrid=args.hybrid,
            profile=profile,
            pack_pages=args.packed_layout,
        )
    except InsufficientKVCacheMemoryError as exc:
        plan.update(
            fits=False,
            reason=capacity_message(exc, "--memory", args.memory),
            needed_bytes=exc.needed_bytes,
            available_bytes=exc.available_bytes,
            max_model_len_that_fits=exc.estimated_max_model_len,
        )
        return plan
    plan.update(fits=True, **_fit_figures(args, layout, configs, limits))
    return plan


def _fit_figures(args: argparse.Namespace, layout: Any, configs: list[Any], limits: Any) -> dict[str, Any]:
    """What a plan that fits holds: per pipeline stage its blocks, groups and tensors; the concurrency and token
    slots of the stage that fits the fewest; bytes per token and per request's fixed state, per rank and in
    all."""
    from kvspec.planning import get_max_concurrency, max_memory_usage_bytes_from_groups
    from kvspec.planning.config import KVCacheConfig

    stages = []
    for stage in range(args.pp):
        config = configs[stage * args.tp]
        live = [g for g in config.kv_cache_groups if g.layer_names]
        stages.append(
            {
                "stage": stage,
                "layers": sum(len(g.layer_names) for g in live),
                "num_blocks": config.num_blocks,
                "kv_cache_bytes": config.total_bytes,
                "groups": _group_rows(config, limits),
                "tensors": [_tensor_row(t) for t in config.kv_cache_tensors],
                "bytes_per_request": max_memory_usage_bytes_from_groups(live, limits),
            }
        )
    # Capacity is bounded by the stage that fits the fewest requests.
    concurrency = min(
        get_max_concurrency(
            KVCacheConfig(
                num_blocks=configs[s * args.tp].num_blocks,
                kv_cache_tensors=(),
                kv_cache_groups=tuple(g for g in configs[s * args.tp].kv_cache_groups if g.layer_names),
            ),
            limits,
        )
        for s in range(args.pp)
    )
    # Per worker (one TP rank of one PP stage): each rank's specs already hold its share of KV heads, and each
    # stage its share of layers; the busiest stage bounds a worker. Fixed states are per request.
    stage_token_bytes = [sum(_token_bytes(spec) for spec in stage.values()) for stage in layout.stage_specs]
    stage_state_bytes = [
        sum(_state_bytes(spec, limits) for spec in stage.values()) for stage in layout.stage_specs
    ]
    # Token slots: blocks are shared by every group of a stage, and a token takes a slot in each group,
    # so a stage holds num_blocks // groups blocks' worth of tokens (more where windows free blocks).
    token_slots = min(_token_slots(configs[s * args.tp]) for s in range(args.pp))
    return dict(
        num_blocks=configs[0].num_blocks,
        block_size=_smallest_block(configs[0]),
        token_slots=token_slots,
        max_concurrency=concurrency,
        tokens_at_max_concurrency=int(concurrency * limits.max_model_len),
        bytes_per_token_per_rank=max(stage_token_bytes),
        bytes_per_token_all_ranks=sum(stage_token_bytes) * args.tp,
        state_bytes_per_request_per_rank=max(stage_state_bytes),
        state_bytes_per_request_all_ranks=sum(stage_state_bytes) * args.tp,
        stages=stages,
        prefix_caching=_prefix_caching([configs[s * args.tp] for s in range(args.pp)], limits),
    )


def _prefix_caching(configs: list[Any], limits: Any) -> list[dict[str, Any]]:
    """Why prefix hits would be impossible or limited under the plan (each stage's findings, once)."""
    import dataclasses

    from kvspec.coordinator.prefix_diagnosis import diagnose_prefix_caching

    seen: dict[str, dict[str, Any]] = {}
    for config in configs:
        for finding in diagnose_prefix_caching(config, limits):
            seen.setdefault(finding.line(), dataclasses.asdict(finding))
    return list(seen.values())


def _block_tokens(spec: KVCacheSpec) -> int:
    from kvspec.contracts.traits import block_tokens_of  # imported late: `kvspec --help` stays torch-free

    return block_tokens_of(spec)


def _token_bytes(spec: KVCacheSpec) -> int:
    """Bytes one token takes in a layer of ``spec`` (one page over the tokens it holds); 0 for a layer that
    keeps a fixed state per request (Mamba, rings), whose bytes do not grow with tokens."""
    from kvspec.contracts.traits import traits_of

    if traits_of(spec).fixed_state_per_request:
        return 0
    return spec.page_size_bytes // _block_tokens(spec)


def _state_bytes(spec: KVCacheSpec, limits: SchedulerLimits) -> int:
    """Bytes a request's fixed state takes in a layer of ``spec`` (0 for a per-token layer)."""
    from kvspec.contracts.traits import traits_of

    return spec.max_memory_usage_bytes(limits) if traits_of(spec).fixed_state_per_request else 0


def _smallest_block(config: KVCacheConfig) -> int:
    """The smallest block (tokens) among one worker's live groups (0 with none)."""
    return min((_block_tokens(g.kv_cache_spec) for g in config.kv_cache_groups if g.layer_names), default=0)


def _token_slots(config: KVCacheConfig) -> int:
    """Tokens one worker's blocks hold when every live group keeps every token (each takes a slot in each)."""
    groups = sum(1 for g in config.kv_cache_groups if g.layer_names)
    return config.num_blocks // max(1, groups) * _smallest_block(config)


def print_plan(plan: dict[str, Any]) -> None:
    print_line(
        f"[bold]{plan['model']}[/bold] ({plan['model_type']}), max_model_len {plan['max_model_len']:,}, "
        f"TP {plan['tensor_parallel_size']} x PP {plan['pipeline_parallel_size']}, "
        f"{human_bytes(plan['memory_per_worker_bytes'])} of KV cache per worker"
    )
    if plan.get("family"):
        print_line(f"  family: {plan['family']}")
    for note in plan["notes"]:
        print_line(f"  note: {note}")
    if not plan["fits"]:
        print_line(f"[red]Does not fit.[/red] {plan['reason']}")
        print_line(f"max_model_len that would fit: [bold]{plan['max_model_len_that_fits']:,}[/bold]")
        return
    columns = ("group", "kind", "layers", "block size", "page size", "window", "per request @ max len")
    for stage in plan["stages"]:
        rows = [
            (
                str(row["group"]),
                row["kind"],
                str(row["layers"]),
                str(row["block_size"]),
                human_bytes(row["page_size_bytes"]),
                str(row["sliding_window"] or "-"),
                human_bytes(row["bytes_per_request"]),
            )
            for row in stage["groups"]
        ]
        title = f"stage {stage['stage']}: {stage['layers']} layers, {stage['num_blocks']:,} blocks"
        print_table(title, columns, rows, left=("kind",))
        print_line(
            f"  {len(stage['tensors'])} tensors, {human_bytes(stage['kv_cache_bytes'])} in use; one max-length request "
            f"needs {human_bytes(stage['bytes_per_request'])}"
        )
    print_line(f"blocks: [bold]{plan['num_blocks']:,}[/bold] (every worker)")
    release = plan.get("vllm_release", RELEASE_CHOICES[0])
    if plan.get("layout_file"):
        origin = " (the layout file's)"
    elif plan.get("block_size_default"):
        origin = (
            f" (vLLM {release}'s default {plan['requested_block_size']}, raised to hold a state)"
            if plan["block_size"] != plan["requested_block_size"]
            else " (its default)"
        )
    else:
        origin = (
            " (--block-size)"
            if plan["block_size"] == plan["requested_block_size"]
            else (f" (--block-size {plan['requested_block_size']}, raised to hold a state)")
        )
    retention = plan.get("prefix_cache_retention_interval")
    print_line(
        f"vLLM {release} rules: attention block size {plan['block_size']}{origin}"
        + (f", sparse prefix-cache retention (interval {retention})" if retention is not None else "")
    )
    other = plan.get("other_release")
    if other is not None and other["fits"]:
        print_line(
            f"  under vLLM {other['vllm_release']} (default block size {other['default_block_size']}, attention "
            f"block {other['block_size']}): {other['num_blocks']:,} blocks, {other['groups']} group(s), "
            f"{other['token_slots']:,} token slots, max concurrency {other['max_concurrency']:.2f}"
        )
    elif other is not None:
        print_line(f"  under vLLM {other['vllm_release']}: does not fit")
    for finding in plan["prefix_caching"]:
        colour = "red" if finding["severity"] == "impossible" else "yellow"
        print_line(
            f"prefix caching [{colour}]{finding['severity']}[/{colour}]: {finding['message']}; {finding['remedy']}"
        )
    print_line(
        f"token slots: [bold]{plan['token_slots']:,}[/bold] (tokens whose KV the blocks hold when every group "
        "keeps every token; windows and Mamba states keep fewer, so more fit)"
    )
    print_line(
        f"max concurrency: [bold]{plan['max_concurrency']:.2f}[/bold] requests of {plan['max_model_len']:,} tokens"
    )
    workers = plan["tensor_parallel_size"] * plan["pipeline_parallel_size"]
    print_line(
        f"bytes per token: {plan['bytes_per_token_per_rank']:,} on each worker, "
        f"{plan['bytes_per_token_all_ranks']:,} over all {workers} (attention layers, before windows)"
    )
    if plan["state_bytes_per_request_per_rank"]:
        print_line(
            f"state bytes per request: {plan['state_bytes_per_request_per_rank']:,} on each worker, "
            f"{plan['state_bytes_per_request_all_ranks']:,} over all {workers} (Mamba / ring layers, whatever the "
            "length)"
        )


def plot_plan(plan: dict[str, Any], path: str) -> None:
    """Draw the memory layout: each tensor with the layers (by group) that alias it, and what each
    group needs for one max-length request."""
    plt = pyplot()
    stage = plan["stages"][0]
    groups = stage["groups"]
    fig, (ax_t, ax_g) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    cmap = plt.get_cmap("tab10")
    name_to_group = {name: row["group"] for row in groups for name in row["layer_names"]}
    for i, tensor in enumerate(stage["tensors"]):
        size_gib = tensor["size_bytes"] / 2**30
        sharers = tensor["shared_by"] or ["(none)"]
        part = size_gib / len(sharers)
        bottom = 0.0
        for name in sharers:
            gid = name_to_group.get(name, 0)
            ax_t.bar(i, part, bottom=bottom, color=cmap(gid % 10), edgecolor="white", linewidth=0.3)
            bottom += part
    ax_t.set_xticks(range(len(stage["tensors"])))
    ax_t.set_xlabel("KV cache tensor (one per layer slot; layers of different groups alias it)")
    ax_t.set_ylabel("GiB")
    ax_t.set_title(f"{plan['model']}: {len(stage['tensors'])} tensors, {stage['num_blocks']:,} blocks each")
    labels = [f"g{r['group']} {r['kind']} x{r['layers']}" for r in groups]
    needs = [max(r["bytes_per_request"], 1) for r in groups]
    ax_g.barh(range(len(groups)), needs, color=[cmap(r["group"] % 10) for r in groups])
    # Log scale: a Mamba state (KiB) beside full attention (GiB) would otherwise be an invisible sliver.
    ax_g.set_xscale("log")
    for y, need in enumerate(needs):
        ax_g.annotate(
            human_bytes(need), (need, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
        )
    ax_g.set_yticks(range(len(groups)), labels)
    ax_g.set_xlabel("bytes per request at max_model_len (log scale)")
    ax_g.set_title("what each group needs for one request")
    if len(plan["stages"]) > 1:
        fig.suptitle(f"pipeline stage 0 of {len(plan['stages'])} (the other stages have the same shape)")
    fig.tight_layout()
    save_figure(fig, path)


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        check_plot_path(args.plot)
        load_installed_plugins(args)
        plan = build_plan(args)
    except KVSpecError as exc:
        raise SystemExit(refuse(exc)) from None
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        print_plan(plan)
    if args.plot and plan["fits"]:
        plot_plan(plan, args.plot)
        if not args.json:
            stages = len(plan["stages"])
            which = f" (stage 0 of {stages})" if stages > 1 else ""
            print(f"layout plot written to {args.plot}{which}")
    elif args.plot:
        print(f"kvspec: no plot written to {args.plot}: the model does not fit.", file=sys.stderr)
    return 0 if plan["fits"] else 1


# -- inspect ------------------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    from kvspec.build_info import build_info
    from kvspec.errors import VllmPluginSettingsError
    from kvspec.integrations.vllm_plugin import active_settings, ignored_settings
    from kvspec.registry.builtins import default_registry

    try:
        loaded = load_installed_plugins(args)
    except PluginError as exc:
        _fail(str(exc), 2)
    try:
        vllm_plugin = active_settings()
    except VllmPluginSettingsError as exc:
        _fail(f"the vLLM plugin's settings: {exc}", 2)
    ignored = ignored_settings()
    plugin_row: dict[str, Any] = {"enabled": vllm_plugin is not None, "ignored_settings": list(ignored)}
    if vllm_plugin is not None:
        plugin_row.update(
            eviction_policy=vllm_plugin.eviction_policy,
            default_retention_seconds=vllm_plugin.default_retention_seconds,
            strict_release=vllm_plugin.strict_release,
            imports=list(vllm_plugin.imports),
        )
    rows: list[dict[str, Any]] = []
    for entry in default_registry.registrations():
        caps = entry.capabilities
        rows.append(
            {
                "spec": f"{entry.spec_cls.__module__}.{entry.spec_cls.__qualname__}",
                "manager": f"{entry.manager_cls.__module__}.{entry.manager_cls.__qualname__}",
                "uniform_base": entry.uniform_type_base_spec.__qualname__,
                "identifier": caps.identifier if caps else None,
                "storage_layout": caps.storage_layout if caps else None,
                "devices": sorted(caps.devices) if caps else None,
                "source": entry.source,
            }
        )
    build = build_info()
    if args.json:
        print(
            json.dumps(
                {
                    "build": build.build,
                    "compiled_modules": list(build.compiled),
                    "strict": default_registry.strict,
                    "plugins_loaded": loaded,
                    "vllm_plugin": plugin_row,
                    "registrations": rows,
                },
                indent=2,
            )
        )
        return 0
    columns = ("spec", "manager", "uniform base", "identifier", "layout", "devices", "source")
    table_rows = [
        (
            row["spec"].rsplit(".", 1)[-1],
            row["manager"].rsplit(".", 1)[-1],
            row["uniform_base"],
            row["identifier"] or "-",
            row["storage_layout"] or "-",
            ",".join(row["devices"] or []) or "-",
            row["source"],
        )
        for row in rows
    ]
    title = f"kvspec registry ({len(rows)} spec types; plugins loaded: {', '.join(loaded) or 'none'})"
    print_table(title, columns, table_rows, left=columns)
    compiled = f" (mypyc: {', '.join(build.compiled)})" if build.compiled else ""
    print(f"build: {build.build}{compiled}")
    if vllm_plugin is None:
        print("vLLM plugin: off (KVSPEC_VLLM unset or 0: a vLLM started here runs its own KV cache manager)")
        if ignored:
            print(f"  ignored while off: {', '.join(ignored)} (set KVSPEC_VLLM=1 for them to apply)")
    else:
        retention = vllm_plugin.default_retention_seconds
        print(
            "vLLM plugin: on (a vLLM started here runs on kvspec): eviction policy "
            f"{vllm_plugin.eviction_policy!r}, default retention {'none' if retention is None else f'{retention:g} s'}"
            f", strict release check {'on' if vllm_plugin.strict_release else 'off'}"
        )
    return 0


# -- parser -------------------------------------------------------------------------------------


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        nargs="?",
        default=DEFAULT_MODEL,
        help=f"preset name or path to a Hugging Face config.json (default {DEFAULT_MODEL}); presets: "
        + ", ".join(preset_names()),
    )
    p.add_argument(
        "--max-model-len", type=_positive, default=None, help="tokens per request (default: the model's)"
    )
    p.add_argument(
        "--block-size",
        type=block_size,
        default=None,
        help="tokens per block (default: the release's, 64 for vLLM 0.34, 16 for 0.23)",
    )
    p.add_argument(
        "--vllm-release",
        choices=RELEASE_CHOICES,
        default=RELEASE_CHOICES[0],
        help="the vLLM release whose defaults to plan with (default 0.34: block size 64, sparse prefix-cache "
        "retention for windowed and Mamba groups)",
    )
    p.add_argument("--dtype", default=None, help="model dtype: bf16, fp16, fp32 (default: the config's)")
    p.add_argument(
        "--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES, help="KV cache dtype (default auto)"
    )
    p.add_argument("--tp", type=_positive, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=_positive, default=1, help="pipeline-parallel size")
    p.add_argument("--mamba-cache-mode", default="none", choices=("none", "align", "all"))
    p.add_argument(
        "--assume-dense",
        action="store_true",
        help="plan a config.json of a model_type kvspec does not know as a dense decoder (full attention in "
        "every layer); without it such a config is refused",
    )
    p.add_argument(
        "--hybrid",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hybrid KV cache management (one group per layer type); --no-hybrid sizes every layer as full",
    )


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvspec", description="Plan and inspect LLM KV caches.")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="plan the KV cache layout of a model in a memory budget")
    _add_model_args(plan)
    plan.add_argument(
        "--memory",
        type=parse_bytes,
        default=parse_bytes("40GiB"),
        help="KV cache memory per worker (default 40GiB)",
    )
    plan.add_argument(
        "--max-num-batched-tokens",
        type=_positive,
        default=None,
        help="tokens per scheduler step (default min(8192, max_model_len))",
    )
    plan.add_argument(
        "--packed-layout",
        action="store_true",
        help="a block-outermost layout: a block holds a page of every layer of its group side by side, so "
        "pages of several sizes pack into one block (vLLM's BLHNC layouts, e.g. sparse MLA's indexer)",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--plot", metavar="PNG", default=None, help="draw the memory layout to a PNG file")
    add_plugin_options(plan)
    plan.set_defaults(func=cmd_plan)
    inspect = sub.add_parser("inspect", help="list registered spec types, their managers and capabilities")
    inspect.add_argument("--json", action="store_true", help="print as JSON")
    inspect.add_argument(
        "--plugins", action="store_true", help="load kvspec.plugins entry points (the default)"
    )
    add_plugin_options(inspect)
    inspect.set_defaults(func=cmd_inspect)
    from kvspec.cli.events import add_events_parser

    add_events_parser(sub)
    from kvspec.cli.fleet import add_fleet_parser

    add_fleet_parser(sub)
    try:
        from kvspec.cli.simulate_args import add_simulate_parser
    except ImportError:  # pragma: no cover - the engine ships with kvspec
        pass
    else:
        add_simulate_parser(sub)
    return parser


def _tensor_row(tensor: KVCacheTensor) -> dict[str, Any]:
    row: dict[str, Any] = {"size_bytes": tensor.size, "shared_by": list(tensor.shared_by)}
    if tensor.block_stride is not None:  # packed: each block's pages side by side at these offsets
        row.update(block_stride_bytes=tensor.block_stride, offsets_bytes=list(tensor.offsets))
    return row


class _OncePerMessage(logging.Filter):
    """Lets each distinct warning through once: a command that plans twice (both releases, a sweep's sizes)
    says a thing once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a record comes (tests and callers swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr)


def _configure_logging() -> None:
    """kvspec's warnings to stderr, each once, prefixed ``kvspec:`` (the one place that decides)."""
    logger = logging.getLogger("kvspec")
    for installed in logger.handlers:
        for once in installed.filters:
            if isinstance(once, _OncePerMessage):  # a second run in one process: warn anew
                once.seen.clear()
                return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("kvspec: %(message)s"))
    handler.addFilter(_OncePerMessage())
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    _configure_logging()
    args = make_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except BrokenPipeError:
        # `kvspec plan --json | head`: the reader left; that is not an error of ours.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    raise SystemExit(main())
