"""kvspec built the way README's "Using it in an engine" builds it, against vLLM planned and run with its own
defaults: a random differential of the library's own path (issue 35).

Each workload is drawn from a seed: a model of one to three attention families (full, sliding window,
chunked local, MLA, sliding-window MLA, sink, Mamba "align"; several layers each), a memory budget, a
max_model_len and a token budget, and a stream of requests (shared prefixes, exact repeats, fresh prompts,
outputs of 1-40 tokens). Both sides plan from the same layers and bytes:

- vLLM: its own planner (``kv_cache_planning`` in 0.34, ``kv_cache_utils`` in 0.23) with its defaults, the
  scheduler and hash block sizes its engine resolves (``resolve_kv_cache_block_sizes``), and its own
  ``KVCacheManager`` built as its Scheduler builds it;
- kvspec: ``kvspec.planning.get_kv_cache_configs`` + ``generate_scheduler_kv_cache_config`` and a
  ``KVCacheCoordinator`` of the plan, its profile the installed release's (``VLLM_0_34`` is the default, so
  against 0.34 nothing is passed; against 0.23 ``profile=VLLM_0_23`` for both the plan and the coordinator),
  kvspec's own ``Request`` objects hashed by the coordinator's hasher. No adapter is involved.

The driver is a small engine loop run identically on both sides: running requests first (preempting the
newest on a refusal), then waiting ones with their prefix hit (the first chunk ending at the pinned
shared-prefix junction, as vLLM 0.34's Scheduler ends it), chunked prefill under a token budget (Mamba
"align" chunks cut to whole scheduler blocks), one sampled token per finished chunk. Compared: the planned
block count and groups (or both refusing the budget), every hit (blocks and tokens), every allocation (block
ids or the refusal), each running request's block table after every step, the free-block count and usage.
The first difference ends the workload with its seed; ``--seed S --workloads 1 -v`` replays it.

Run in the ``vllm034`` (or ``vllm``) nox session: ``python -m tests.vllm.readme_differential --workloads
1000``; ``tests/vllm/test_readme_differential.py`` runs a seeded subset and the full count.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

FAMILIES = ("full", "sliding_window", "chunked_local", "mla", "sliding_window_mla", "sink", "mamba_align")


def _release_0_23() -> bool:
    from kvspec.contracts.release import VLLM_0_23, profile_for_vllm_version

    return profile_for_vllm_version(str(importlib.import_module("vllm").__version__)) is VLLM_0_23


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    seed: int
    families: tuple[str, ...]
    layers: dict[str, Any]  # layer name -> vLLM spec
    block_size: int
    max_model_len: int
    budget_factor: float  # the memory both planners get, in max-length requests' blocks
    token_budget: int
    max_num_seqs: int
    enable_caching: bool
    requests: tuple[tuple[tuple[int, ...], int, int], ...]  # (prompt, max_tokens, arrival step)


@dataclasses.dataclass
class Outcome:
    seed: int
    families: tuple[str, ...]
    steps: int = 0
    hit_tokens: int = 0
    preemptions: int = 0
    divergence: str | None = None
    refused_budget: bool = False
    expected: str | None = None
    vllm_cannot_run: str | None = None
    stalled: bool = False


class Divergence(Exception):
    pass


class _PlannerAsserted:
    def __init__(self, message: str) -> None:
        self.message = message


class Expected(Exception):
    pass


def _vllm_spec(family: str, block_size: int, rng: random.Random, release_0_23: bool) -> Any:
    import torch
    from vllm.v1 import kv_cache_interface as iface

    heads = rng.choice((1, 2, 4))
    attn = dict(block_size=block_size, num_kv_heads=heads, head_size=64, dtype=torch.float16)
    # DeepSeek's 576-wide latent against 0.34 (whose planner pads the other pages to it); 512 against 0.23,
    # whose planner only scales block sizes (a 576-wide page divides no attention page there: refused).
    latent = 512 if release_0_23 else 576
    mla = dict(block_size=block_size, num_kv_heads=1, head_size=latent, dtype=torch.bfloat16)
    if family == "full":
        return iface.FullAttentionSpec(**attn)
    if family == "sliding_window":
        return iface.SlidingWindowSpec(**attn, sliding_window=rng.choice((32, 64, 100, 128, 256)))
    if family == "chunked_local":
        return iface.ChunkedLocalAttentionSpec(
            **attn, attention_chunk_size=block_size * rng.choice((1, 2, 4))
        )
    if family == "mla":
        return iface.MLAAttentionSpec(**mla)
    if family == "sliding_window_mla":
        return iface.SlidingWindowMLASpec(**mla, sliding_window=rng.choice((64, 128)))
    if family == "sink":
        return iface.SinkFullAttentionSpec(**attn, sink_len=block_size * 8)
    # A Mamba state of the attention page (vLLM's model config pads it so; 0.34's planner also pads a
    # smaller one, drawn only there).
    page = block_size * 2 * 2 * 64 * 2  # full attention at 2 KV heads, K and V, fp16
    elements = page // 2 if release_0_23 or rng.random() < 0.6 else page // 4
    return iface.MambaSpec(
        block_size=block_size, shapes=((elements,),), dtypes=(torch.float16,), mamba_cache_mode="align"
    )


def draw_workload(seed: int) -> Workload:
    release_0_23 = _release_0_23()
    rng = random.Random(seed)
    families = tuple(rng.sample(FAMILIES, rng.choice((1, 2, 2, 3))))
    if release_0_23 and "sliding_window_mla" in families:
        # vLLM 0.23 plans every model with a sliding-window MLA layer by its DeepSeek V4 grouping
        # (kv_cache_utils.py: group_and_unify_kv_cache_specs), which kvspec does not reproduce yet
        # (docs/VLLM.md): such layouts are drawn against 0.34 only.
        families = tuple("mla" if f == "sliding_window_mla" else f for f in dict.fromkeys(families))
        families = tuple(dict.fromkeys(families))
    if "chunked_local" in families and "mamba_align" in families:
        families = tuple(f for f in families if f != "chunked_local")
    if "mamba_align" in families and len(families) == 1:
        families = ("full", "mamba_align")
    block_size = 16 if release_0_23 else 64  # each release's default block size
    layers: dict[str, Any] = {}
    for family in families:
        spec = _vllm_spec(family, block_size, rng, release_0_23)
        for i in range(rng.randint(1, 3)):
            layers[f"model.layers.{len(layers)}.{family}.{i}"] = spec
    if "mamba_align" in families:
        # The state page is sized to 2 KV heads' full-attention page: keep the attention layers at 2 heads.
        layers = {
            name: (
                dataclasses.replace(spec, num_kv_heads=2) if getattr(spec, "num_kv_heads", 1) > 1 else spec
            )
            for name, spec in layers.items()
        }
    max_model_len = rng.choice((512, 1024, 2048))
    requests: list[tuple[tuple[int, ...], int, int]] = []
    prefixes = [
        [rng.randrange(1, 30000) for _ in range(rng.randint(1, 400))] for _ in range(rng.randint(1, 3))
    ]
    for _ in range(rng.randint(2, 14)):
        kind = rng.random()
        if kind < 0.5:
            prompt = list(rng.choice(prefixes)) + [
                rng.randrange(1, 30000) for _ in range(rng.randint(0, 120))
            ]
        elif kind < 0.65 and requests:
            prompt = list(rng.choice(requests)[0])
        else:
            prompt = [rng.randrange(1, 30000) for _ in range(rng.randint(1, 500))]
        prompt = prompt[: max_model_len - 48]
        requests.append((tuple(prompt), rng.randint(1, 40), rng.choice((0, 0, rng.randint(0, 30)))))
    return Workload(
        seed=seed,
        families=families,
        layers=layers,
        block_size=block_size,
        max_model_len=max_model_len,
        budget_factor=rng.choice((0.9, 1.0, 1.3, 2.0, 3.0, 6.0, 20.0)),
        # A Mamba "align" chunk is whole scheduler blocks: a budget under one block would schedule nothing.
        token_budget=rng.choice(
            (512, 1024, 2048) if "mamba_align" in families else (64, 128, 256, 512, 2048)
        ),
        max_num_seqs=rng.randint(1, 8),
        enable_caching=rng.random() < 0.9,
        requests=tuple(requests),
    )


# -- the two sides --------------------------------------------------------------------------------------------


def prepare_vllm() -> None:
    """vLLM's CPU platform as the suite's runs set it (no device here)."""
    sys.path.insert(0, str(ROOT / "tests" / "vllm_suite"))
    import stock_conftest  # type: ignore[import-not-found]  # noqa: F401


def _vllm_config(w: Workload, release_0_23: bool) -> Any:
    prepare_vllm()
    from vllm.config import ModelConfig, VllmConfig

    config = VllmConfig(model_config=ModelConfig(max_model_len=w.max_model_len))
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    config.scheduler_config.max_num_batched_tokens = w.token_budget
    # One batch in flight (synchronous scheduling, as the driver runs): vLLM 0.34 sizes window and chunk
    # admission caps by max_in_flight_tokens, which doubles with asynchronous scheduling, and VllmConfig picks
    # that by the platform state it finds (it differs between the first configuration of a process and later
    # ones).
    if hasattr(config.scheduler_config, "async_scheduling"):
        config.scheduler_config.async_scheduling = False
    config.scheduler_config.max_num_seqs = w.max_num_seqs
    config.cache_config.block_size = w.block_size
    config.cache_config.enable_prefix_caching = w.enable_caching
    if any(f.startswith("mamba") for f in w.families):
        config.cache_config.mamba_cache_mode = "align"
    if not release_0_23:
        config.cache_config.kv_cache_layout = "LBNHC"
    return config


def _vllm_plan(w: Workload, memory: int, release_0_23: bool) -> tuple[Any, Any]:
    """vLLM's planned scheduler config (or the exception its planner raised) and its vllm_config."""
    config = _vllm_config(w, release_0_23)
    try:
        if release_0_23:
            utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
            configs = utils.get_kv_cache_configs(config, [dict(w.layers)], [memory])
            return utils.generate_scheduler_kv_cache_config(configs), config
        planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
        groups = planning.get_global_kv_cache_groups(config, [dict(w.layers)])
        configs = planning.get_kv_cache_configs(config, [dict(w.layers)], [memory], groups)
        generate = (
            getattr(planning, "generate_scheduler_kv_cache_config", None)
            or importlib.import_module("vllm.v1.core.kv_cache_utils").generate_scheduler_kv_cache_config
        )
        return generate(configs), config
    except (ValueError, NotImplementedError) as exc:
        return exc, config
    except AssertionError as exc:  # its planner's own asserts: a layout it cannot plan (counted apart)
        return _PlannerAsserted(str(exc) or "AssertionError"), config


def _vllm_manager(w: Workload, plan: Any, vllm_config: Any, release_0_23: bool) -> Any:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    from tests.vllm.differential import _constructible_sink_manager

    _constructible_sink_manager()
    scheduler_block, hash_block = resolve_kv_cache_block_sizes(plan, vllm_config)
    kwargs: dict[str, Any] = dict(
        kv_cache_config=plan,
        max_model_len=w.max_model_len,
        scheduler_block_size=scheduler_block,
        hash_block_size=hash_block,
        enable_caching=w.enable_caching,
        log_stats=True,
    )
    if release_0_23:
        kwargs["max_num_batched_tokens"] = w.token_budget
    else:
        kwargs["max_in_flight_tokens"] = w.token_budget
    return KVCacheManager(**kwargs), scheduler_block, hash_block


def _kvspec_side(w: Workload, memory: int, release_0_23: bool) -> Any:
    """kvspec as README builds it: plan, scheduler config, coordinator (the profile only against 0.23)."""
    from kvspec import KVCacheCoordinator, SchedulerLimits
    from kvspec.contracts.release import VLLM_0_23
    from kvspec.errors import InsufficientKVCacheMemoryError, PageSizeUnificationError
    from kvspec.integrations.vllm import as_kvspec
    from kvspec.planning import generate_scheduler_kv_cache_config, get_kv_cache_configs

    layers = {name: as_kvspec(spec) for name, spec in w.layers.items()}
    limits = SchedulerLimits(
        max_model_len=w.max_model_len,
        max_num_batched_tokens=w.token_budget,
        mamba_cache_mode="align" if "mamba_align" in w.families else "none",
    )
    try:
        if release_0_23:
            (config,) = get_kv_cache_configs([layers], [memory], limits, profile=VLLM_0_23)
        else:
            (config,) = get_kv_cache_configs([layers], [memory], limits)
    except (InsufficientKVCacheMemoryError, PageSizeUnificationError) as exc:
        return exc, None
    plan = generate_scheduler_kv_cache_config([config])
    if release_0_23:
        return plan, lambda: KVCacheCoordinator(
            plan, limits, profile=VLLM_0_23, enable_caching=w.enable_caching, log_stats=True
        )
    return plan, lambda: KVCacheCoordinator(plan, limits, enable_caching=w.enable_caching, log_stats=True)


def _memory(w: Workload, release_0_23: bool) -> int:
    """The bytes both planners get: ``budget_factor`` times the blocks one max-length request needs (kvspec's
    grouping of the layers), plus the null block; under 1.0 both planners must refuse."""
    from kvspec import SchedulerLimits
    from kvspec.contracts.release import VLLM_0_23, VLLM_0_34
    from kvspec.errors import PageSizeUnificationError
    from kvspec.integrations.vllm import as_kvspec
    from kvspec.planning import blocks_per_request, bytes_per_block, get_kv_cache_groups

    try:
        groups = get_kv_cache_groups(
            {name: as_kvspec(spec) for name, spec in w.layers.items()},
            profile=VLLM_0_23 if release_0_23 else VLLM_0_34,
        )
    except PageSizeUnificationError:
        return 64 << 20  # the layers cannot be grouped: both planners must refuse them, whatever the memory
    limits = SchedulerLimits(max_model_len=w.max_model_len, max_num_batched_tokens=w.token_budget)
    need = blocks_per_request(groups, limits)
    return bytes_per_block(groups) * (math.ceil(need * w.budget_factor) + 1)


# -- the lockstep -----------------------------------------------------------------------------------------


def _ids(blocks: Any) -> Any:
    return None if blocks is None else tuple(tuple(g) for g in blocks.get_block_ids())


def _same(what: str, stock: Any, ours: Any) -> None:
    if stock != ours:
        raise Divergence(f"{what}: vLLM {str(stock)[:500]} != kvspec {str(ours)[:500]}")


def _untrimmed_second_full_group(plan: Any, stock: Any, ours: Any) -> bool:
    """vLLM truncates only the first full-attention-derived group's hit to the hit length (MLA beside full
    attention: two such groups; tests/vllm/differential.py's EXPECTED_DIFFERENCES explains it): kvspec's
    answer is vLLM's with every group truncated."""
    blocks, length = stock
    sizes = [g.kv_cache_spec.block_size for g in plan.kv_cache_groups]
    trimmed = tuple(ids[: length // size] for ids, size in zip(blocks, sizes, strict=True))
    return bool((trimmed, length) == ours and trimmed != blocks)


def _sink_bucketed_with_full(w: Workload, release_0_23: bool) -> bool:
    """vLLM 0.34 merges a layer bucket into an earlier one whose spec class merges it
    (``vllm/v1/core/kv_cache_planning.py: _get_kv_cache_groups_uniform_page_size``); its
    ``FullAttentionSpec.merge`` takes a ``SinkFullAttentionSpec`` (a subclass) and returns plain full
    attention, so sink layers join full attention's bucket, which reorders the groups (and with several
    layers a group, mixes them). kvspec's specs do not merge across those classes."""
    return not release_0_23 and "sink" in w.families and "full" in w.families


def _sink_run_as_full(w: Workload, stock_plan: Any) -> bool:
    """One of vLLM's groups holds sink layers and other full-attention-family layers (a uniform-type group)."""
    return any(
        any(".sink." not in n for n in g.layer_names) and any(".sink." in n for n in g.layer_names)
        for g in stock_plan.kv_cache_groups
    )


def _window_uniform_by_order(w: Workload) -> bool:
    """vLLM makes plain and MLA sliding-window layers one uniform-type group when the first layer is a plain
    window and every window is the same (its ``is_uniform_type`` asks the first layer's spec, and a plain
    window accepts its MLA subclass); kvspec's answer does not depend on the order."""
    specs = list(w.layers.values())
    first = specs[0]
    return (
        type(first).__name__ == "SlidingWindowSpec"
        and any(type(s).__name__ == "SlidingWindowMLASpec" for s in specs)
        and all(getattr(s, "sliding_window", None) == first.sliding_window for s in specs)
    )


def run_workload(w: Workload, verbose: bool = False) -> Outcome:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request as VllmRequest

    from kvspec import Request

    release_0_23 = _release_0_23()
    outcome = Outcome(seed=w.seed, families=w.families)
    memory = _memory(w, release_0_23)
    stock_plan, vllm_config = _vllm_plan(w, memory, release_0_23)
    our_plan, coord = _kvspec_side(w, memory, release_0_23)
    if isinstance(stock_plan, _PlannerAsserted):
        outcome.vllm_cannot_run = f"vLLM's planner asserts: {stock_plan.message}"[:200]
        return outcome
    try:
        if _window_uniform_by_order(w):
            raise Expected(
                "vLLM makes sliding-window and sliding-window MLA layers of one window one uniform-type group "
                "when a plain window layer comes first, and not in the other order; kvspec's answer does not "
                "depend on the order (tests/unit/registry/test_registry.py)"
            )
        stock_refused, we_refused = isinstance(stock_plan, Exception), isinstance(our_plan, Exception)
        if stock_refused != we_refused:  # one planner refused: its message against the other's False
            raise Divergence(
                f"the plan refuses the budget: vLLM {str(stock_plan)[:500] if stock_refused else False} != "
                f"kvspec {str(our_plan)[:500] if we_refused else False}"
            )
        if stock_refused:
            outcome.refused_budget = True  # both planners refuse the layers or the budget
            return outcome
        stock_groups = [sorted(g.layer_names) for g in stock_plan.kv_cache_groups]
        our_groups = [sorted(g.layer_names) for g in our_plan.kv_cache_groups]
        if stock_groups != our_groups and _sink_bucketed_with_full(w, release_0_23):
            raise Expected(
                "vLLM 0.34 buckets sink layers with full attention (FullAttentionSpec.merge accepts its "
                "subclass and would drop sink_len in a shared group); kvspec keeps them apart"
            )
        if release_0_23 and _sink_run_as_full(w, stock_plan):
            raise Expected(
                "vLLM 0.23 runs a uniform-type group of full and sink layers by its first layer's spec (full "
                "attention: no sink blocks reserved); kvspec runs it by the most derived spec (sink), whatever "
                "the layer order (kvspec.specs.uniform: representative_spec)"
            )
        _same("planned blocks", stock_plan.num_blocks, our_plan.num_blocks)
        _same(
            "planned groups",
            [sorted(g.layer_names) for g in stock_plan.kv_cache_groups],
            [sorted(g.layer_names) for g in our_plan.kv_cache_groups],
        )
        _same(
            "planned retention",
            getattr(stock_plan, "prefix_cache_retention_interval", None),
            our_plan.prefix_cache_retention_interval,
        )
        built: list[Any] = []
        for build in (lambda: _vllm_manager(w, stock_plan, vllm_config, release_0_23), coord):
            try:
                built.append(build())
            except Exception as exc:  # a manager that refuses the plan: both must
                built.append(exc)
        _same("a manager refuses the plan", [isinstance(b, Exception) for b in built], [False, False])
        (stock, scheduler_block, hash_block), coord = built
        _same(
            "scheduler and hash block",
            (scheduler_block, hash_block),
            (coord.scheduler_block_size, coord.hash_block_size),
        )
        init_none_hash(sha256)
        hasher = get_request_block_hasher(hash_block, sha256)
        mamba = "mamba_align" in w.families
        theirs: dict[str, Any] = {}
        ours: dict[str, Any] = {}
        plans = {f"r{i}": r for i, r in enumerate(w.requests)}
        for rid, (prompt, max_tokens, _) in plans.items():
            theirs[rid] = VllmRequest(
                rid,
                list(prompt),
                SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                None,
                arrival_time=0.0,
                block_hasher=hasher if w.enable_caching else None,
            )
            ours[rid] = Request(
                rid, list(prompt), block_hasher=coord.make_block_hasher() if w.enable_caching else None
            )
        pending = sorted(plans, key=lambda r: (plans[r][2], int(r[1:])))
        waiting: list[str] = []
        running: list[str] = []
        rng = random.Random(w.seed * 7919 + 1)
        step = 0
        while pending or waiting or running:
            step += 1
            outcome.steps = step
            if step > 5000:
                # Both sides refused the same requests for 5000 steps (a pool that a manager's reserved blocks
                # leave too small for the longest request): they agree; counted apart.
                outcome.stalled = True
                break
            stock.new_step_starts()
            coord.new_step_starts()
            while pending and plans[pending[0]][2] <= step:
                waiting.append(pending.pop(0))
            budget = w.token_budget
            scheduled: dict[str, int] = {}
            preempted = False
            index = 0
            while index < len(running) and budget > 0:
                rid = running[index]
                mine = ours[rid]
                num_new = min(mine.num_tokens - mine.num_computed_tokens, budget)
                num_new = min(num_new, w.max_model_len - 1 - mine.num_computed_tokens)
                if mamba:
                    num_new = _aligned(
                        num_new, mine.num_computed_tokens, mine.num_prompt_tokens, scheduler_block
                    )
                if num_new <= 0:
                    index += 1
                    continue
                while True:
                    a = stock.allocate_slots(theirs[rid], num_new)
                    b = coord.allocate_slots(mine, num_new)
                    _same(f"step {step}: allocate_slots({rid}, {num_new}) [running]", _ids(a), _ids(b))
                    if a is not None:
                        break
                    victim = running.pop()
                    scheduled.pop(victim, None)
                    stock.free(theirs[victim])
                    coord.free(ours[victim])
                    for request in (theirs[victim], ours[victim]):
                        request.num_computed_tokens = 0
                        request.num_preemptions += 1
                    waiting.insert(0, victim)
                    outcome.preemptions += 1
                    preempted = True
                    if victim == rid:
                        break
                if a is None:
                    break
                scheduled[rid] = num_new
                budget -= num_new
                index += 1
            while not preempted and waiting and budget > 0 and len(running) < w.max_num_seqs:
                rid = waiting[0]
                stock_hit = stock.get_computed_blocks(theirs[rid])
                blocks, hit = coord.get_computed_blocks(ours[rid])
                stock_answer = (_ids(stock_hit[0]), stock_hit[1])
                our_answer = (_ids(blocks), hit)
                if stock_answer != our_answer and _untrimmed_second_full_group(
                    our_plan, stock_answer, our_answer
                ):
                    raise Expected(
                        "second full-attention group's hit left untrimmed (a vLLM bug kvspec fixes)"
                    )
                _same(f"step {step}: get_computed_blocks({rid})", stock_answer, our_answer)
                junction = stock_hit[2] if len(stock_hit) > 2 else 0
                if not release_0_23:
                    theirs[rid].shared_prefix_boundary = junction
                    _same(
                        f"step {step}: shared-prefix junction of {rid}",
                        junction,
                        ours[rid].shared_prefix_boundary,
                    )
                mine = ours[rid]
                num_new = min(mine.num_tokens - mine.num_computed_tokens - hit, budget)
                if junction > hit:
                    num_new = min(num_new, junction - hit)
                if mamba:
                    num_new = _aligned(
                        num_new, mine.num_computed_tokens + hit, mine.num_prompt_tokens, scheduler_block
                    )
                if num_new <= 0:
                    break
                a = stock.allocate_slots(theirs[rid], num_new, hit, stock_hit[0])
                b = coord.allocate_slots(mine, num_new, hit, blocks)
                _same(f"step {step}: allocate_slots({rid}, {num_new}, hit {hit}) [waiting]", _ids(a), _ids(b))
                _same(
                    f"step {step}: free blocks after admitting {rid}",
                    stock.block_pool.get_num_free_blocks(),
                    coord.num_free_blocks,
                )
                if a is None:
                    break
                outcome.hit_tokens += hit
                if not release_0_23 and theirs[rid].num_computed_tokens == 0:
                    stock.record_prefix_cache_stats(theirs[rid], hit)
                for request in (theirs[rid], mine):
                    request.num_computed_tokens += hit
                waiting.pop(0)
                running.append(rid)
                scheduled[rid] = num_new
                budget -= num_new
            for rid in running:
                _same(
                    f"step {step}: block table of {rid}",
                    tuple(stock.get_block_ids(rid)),
                    tuple(coord.get_block_ids(rid)),
                )
            _same(f"step {step}: usage", round(stock.usage, 9), round(coord.usage, 9))
            for rid, n in scheduled.items():
                finished = False
                for request in (theirs[rid], ours[rid]):
                    request.num_computed_tokens += n
                token = rng.randrange(1, 30000)
                if ours[rid].num_computed_tokens >= ours[rid].num_tokens:
                    for request in (theirs[rid], ours[rid]):
                        request.append_output_token_ids(token)
                    finished = (
                        ours[rid].num_output_tokens >= plans[rid][1]
                        or ours[rid].num_tokens >= w.max_model_len - 1
                    )
                if finished:
                    running.remove(rid)
                    stock.free(theirs[rid])
                    coord.free(ours[rid])
            _same(f"step {step}: free blocks", stock.block_pool.get_num_free_blocks(), coord.num_free_blocks)
        coord.check_invariants()
    except Divergence as exc:
        outcome.divergence = str(exc)
    except Expected as exc:
        outcome.expected = str(exc)
    except AssertionError as exc:  # vLLM's own asserts: a layout its managers cannot run (counted apart)
        outcome.vllm_cannot_run = f"{exc}"[:200]
    if verbose:
        print(outcome, file=sys.stderr)
    return outcome


def _aligned(num_new: int, computed: int, prompt: int, block: int) -> int:
    """A Mamba "align" prefill chunk: whole scheduler blocks unless it finishes the prompt (vLLM's Scheduler
    ``_mamba_block_aligned_split``); decode steps are not cut."""
    if computed >= prompt or computed + num_new >= prompt:
        return num_new
    return num_new // block * block


def run_many(first_seed: int, count: int, verbose: bool = False) -> list[Outcome]:
    return [run_workload(draw_workload(seed), verbose) for seed in range(first_seed, first_seed + count)]


def summary(outcomes: list[Outcome]) -> str:
    diverged = [o for o in outcomes if o.divergence]
    families = Counter(f for o in outcomes for f in set(o.families))
    lines = [
        f"{len(outcomes)} workloads against vLLM {importlib.import_module('vllm').__version__}, kvspec built as "
        f"README builds it: {len(diverged)} diverged, {sum(1 for o in outcomes if o.refused_budget)} budgets "
        f"refused by both planners, {sum(1 for o in outcomes if o.expected)} ended on an expected difference, "
        f"{sum(1 for o in outcomes if o.vllm_cannot_run)} that vLLM cannot plan or run (it asserts), "
        f"{sum(1 for o in outcomes if o.stalled)} where both refused the same requests for 5000 steps; "
        f"{sum(o.steps for o in outcomes)} steps, {sum(o.preemptions for o in outcomes)} preemptions, "
        f"{sum(o.hit_tokens for o in outcomes)} hit tokens",
        "workloads per family: " + ", ".join(f"{f} {families[f]}" for f in FAMILIES),
    ]
    driven = [o for o in outcomes if o.steps]
    lines.append(
        f"driven to the end: {len(driven)} workloads; per family: "
        + ", ".join(f"{f} {sum(1 for o in driven if f in o.families)}" for f in FAMILIES)
    )
    lines += [f"  seed {o.seed} {o.families}: {o.divergence}" for o in diverged[:10]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    from benchmarks.vllm_scheduler_loop import _setup_offline_hub

    _setup_offline_hub()
    prepare_vllm()
    import logging

    logging.disable(logging.WARNING)
    outcomes = run_many(args.seed, args.workloads, args.verbose)
    print(summary(outcomes))
    return 1 if any(o.divergence for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
