"""Why a plan's prefix hits would be impossible or limited, and which setting changes it.

A hybrid model's prefix hit is the shortest hit over its KV-cache groups, taken where every group can resume:
one group that caches nothing makes every hit 0 tokens, and the groups' block sizes set where hits can end.
Engines say nothing of this (a hybrid served with prefix caching on can run at 0% hits without a word); this
module reads a :class:`~kvspec.planning.config.KVCacheConfig` and names the cause, the groups, and the
setting. ``kvspec plan`` prints it, and the vLLM plugin's start line carries it.

Invariants: a finding names at least one group (by its index in ``config.kv_cache_groups``); ``impossible``
findings come first; no finding means a hit can end on any block boundary of every group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvspec.contracts.spec import SchedulerLimits
from kvspec.contracts.traits import SpecTraits, traits_of
from kvspec.coordinator.layout import resolve_block_sizes
from kvspec.planning.config import KVCacheConfig, scheduler_spec

Severity = Literal["impossible", "limited"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PrefixCachingFinding:
    """One reason prefix hits are impossible (``impossible``: every hit is 0 tokens) or limited
    (``limited``: hits end only at some points). ``code`` is stable for tools; ``message`` says what and why
    in tokens; ``remedy`` names the setting that changes it."""

    code: str
    severity: Severity
    group_ids: tuple[int, ...]
    message: str
    remedy: str

    def line(self) -> str:
        """The finding as one line: severity, message, remedy."""
        return f"{self.severity}: {self.message}; {self.remedy}"


def _groups(ids: tuple[int, ...]) -> str:
    return f"group {ids[0]}" if len(ids) == 1 else "groups " + ", ".join(map(str, ids))


def _kinds(traits: list[SpecTraits], ids: tuple[int, ...]) -> str:
    return ", ".join(dict.fromkeys(group_kind(traits[i]) for i in ids))


def group_kind(traits: SpecTraits) -> str:
    """A group's cache in a few words: "Mamba state", "sliding window 1024", or the declared kind."""
    if traits.kind == "mamba":
        return "Mamba state"
    if traits.sliding_window is not None:
        return f"sliding window {traits.sliding_window}"
    if traits.attention_chunk_size is not None:
        return f"chunked local attention {traits.attention_chunk_size}"
    return traits.kind or "attention"


def diagnose_prefix_caching(
    config: KVCacheConfig,
    limits: SchedulerLimits,
    *,
    enable_caching: bool = True,
    retention_interval: int | Literal["planned"] | None = "planned",
) -> tuple[PrefixCachingFinding, ...]:
    """The findings for ``config`` run with ``limits``: prefix caching switched off, a group that never
    caches (Mamba in cache mode ``none``; cross attention), hits that land only on a coarse block (a hybrid's
    scheduler block, the LCM of its groups' block sizes), and window or state groups that keep cached blocks
    only at replay boundaries and shared-prefix junctions (vLLM 0.34's sparse retention, interval 0) or
    every ``N`` tokens. ``retention_interval``: tokens (None: dense, every block kept), or ``"planned"``:
    the config's own (``KVCacheConfig.prefix_cache_retention_interval``)."""
    groups = config.kv_cache_groups
    if not groups:
        return ()
    if not enable_caching:
        return (
            PrefixCachingFinding(
                code="caching_off",
                severity="impossible",
                group_ids=tuple(range(len(groups))),
                message="prefix caching is off: no request reuses another's KV cache",
                remedy="turn it on (vLLM: --enable-prefix-caching; kvspec simulate: drop --no-prefix-caching)",
            ),
        )
    # As the coordinator reads them (resolve_block_sizes): a uniform-type group by its representative spec.
    specs = [scheduler_spec(g.kv_cache_spec) for g in groups]
    traits = [traits_of(spec) for spec in specs]
    findings: list[PrefixCachingFinding] = []
    never = tuple(i for i, t in enumerate(traits) if not t.supports_prefix_caching)
    if never:
        findings.append(
            PrefixCachingFinding(
                code="group_never_cached",
                severity="impossible",
                group_ids=never,
                message=f"{_groups(never)} ({_kinds(traits, never)}) cannot be prefix-cached, "
                "so every hit of this model is 0 tokens",
                remedy="serve it with prefix caching off (encoder-decoder models run that way in vLLM)",
            )
        )
    uncached_states = tuple(
        i
        for i, (spec, t) in enumerate(zip(specs, traits, strict=True))
        if t.kind == "mamba" and getattr(spec, "mamba_cache_mode", "none") == "none"
    )
    if uncached_states:
        findings.append(
            PrefixCachingFinding(
                code="state_not_cached",
                severity="impossible",
                group_ids=uncached_states,
                message=f"Mamba cache mode 'none': {_groups(uncached_states)} keep one running state per request "
                "and cache none, so no prefix hit is possible (a hybrid's hit is the shortest over its groups)",
                remedy="mamba_cache_mode 'align' keeps a state at block boundaries (kvspec plan: "
                "--mamba-cache-mode align; vLLM 0.34 picks it itself when prefix caching is on)",
            )
        )
    if findings:
        return tuple(findings)
    cached = [i for i, t in enumerate(traits) if t.prefix_cacheable]
    if len(groups) > 1 and cached:
        hit_block, _ = resolve_block_sizes(config, limits, True, None)
        tokens = {i: traits[i].block_tokens(specs[i].block_size) for i in cached}
        sizes = sorted(set(tokens.values()))
        if hit_block > sizes[0]:
            coarse = tuple(i for i in cached if tokens[i] != hit_block)
            findings.append(
                PrefixCachingFinding(
                    code="coarse_hit_block",
                    severity="limited",
                    group_ids=coarse or tuple(cached),
                    message=f"hits end only on multiples of {hit_block:,} tokens, the least common multiple of the "
                    f"groups' block sizes ({', '.join(f'{s:,}' for s in sizes)}): a shared prefix shorter than "
                    f"that never hits, and up to {hit_block - 1:,} tokens of any hit are computed again",
                    remedy="give every group the same block size (pad the smaller pages, or a block size the "
                    "state fits: --block-size)",
                )
            )
    interval = (
        config.prefix_cache_retention_interval if retention_interval == "planned" else retention_interval
    )
    sparse = tuple(
        i
        for i in cached
        if traits[i].kind == "mamba"
        or traits[i].sliding_window is not None
        or traits[i].attention_chunk_size is not None
    )
    if sparse and interval is not None:
        kinds = _kinds(traits, sparse)
        where = (
            "only where a request's prompt ends (its replay boundary) and where it meets a prefix another "
            "request shares (vLLM 0.34's sparse retention, interval 0): the next turn of a conversation hits, "
            "a prefix shared inside other prompts may not"
            if interval == 0
            else f"one block every {interval:,} tokens, besides replay boundaries and shared-prefix junctions"
        )
        findings.append(
            PrefixCachingFinding(
                code="sparse_retention",
                severity="limited",
                group_ids=sparse,
                message=f"{_groups(sparse)} ({kinds}) keep cached blocks {where}",
                remedy="a smaller retention interval keeps more (kvspec simulate and fleet: --retention-interval "
                "N, or dense: every block, as vLLM 0.23)",
            )
        )
    return tuple(findings)


__all__ = ["PrefixCachingFinding", "Severity", "diagnose_prefix_caching", "group_kind"]
