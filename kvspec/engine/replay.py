"""Pure cache replay: a trace's requests in arrival order, one at a time, through the real coordinator.

What an unlimited (or a given) prefix cache could reuse of a trace: each request looks up its prefix hit
exactly as a scheduler would (``get_computed_blocks``: the engine rules, the last prompt token always
recomputed), allocates and publishes its whole prompt, and is freed before the next one arrives; eviction
is the coordinator's own. No decoding, no concurrency (the timed replay adds those).

Figures, in tokens and in trace blocks: a request's hit reaches into ``ceil(hit / B)`` of its
``ceil(input_length / B)`` blocks, ``B`` the trace's hash block (512 for Mooncake) or, for token traces, the
coordinator's block. With unlimited memory that equals the published count of each request's leading run of
already-seen hash ids (``shared/traces/README.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kvspec.blocks.eviction import EvictionPolicyFactory
from kvspec.blocks.hashing import BlockHasher
from kvspec.blocks.request import Request
from kvspec.contracts.release import DEFAULT_PROFILE
from kvspec.contracts.spec import SchedulerLimits
from kvspec.coordinator import KVCacheBlocks, KVCacheCoordinator, shared_prefix_junction
from kvspec.engine.stats import limiting_groups, per_group_figures
from kvspec.engine.traces import TraceRequest, prompt_tokens
from kvspec.errors import SchedulingError
from kvspec.intmath import cdiv
from kvspec.planning import blocks_per_request
from kvspec.planning.config import KVCacheConfig

#: The prefix-cache retention interval (tokens) the current release plans into every config: vLLM 0.34's 0
#: (sparse sliding-window and Mamba caches). A replay uses it unless told otherwise (None: dense).
PLANNED_RETENTION: Final = DEFAULT_PROFILE.planning.prefix_cache_retention_interval


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayStats:
    """What a pure cache replay found. Tokens and trace blocks; ``refused``: prompts longer than the
    coordinator's ``max_model_len`` or larger than the whole cache (not cached, no hit counted)."""

    requests: int
    prompt_tokens: int
    hit_tokens: int
    prompt_blocks: int
    hit_blocks: int
    refused: int
    #: With ``per_group`` (a hybrid): per KV-cache group, the tokens its own search found cached (what it
    #: alone would have given, ``find_longest_cache_hit_per_group``), and on how many requests it found the
    #: fewest while another group found more: the group that limited the hit. Empty otherwise.
    group_hit_tokens: tuple[int, ...] = ()
    group_limited_requests: tuple[int, ...] = ()

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def limiting_groups(self) -> tuple[int, ...]:
        """The groups that limited the most hits (:func:`kvspec.engine.stats.limiting_groups`)."""
        return limiting_groups(self.group_limited_requests)

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": round(self.token_hit_rate, 4),
            "prompt_blocks": self.prompt_blocks,
            "hit_blocks": self.hit_blocks,
            "block_hit_rate": round(self.block_hit_rate, 4),
            "refused": self.refused,
            **per_group_figures(
                self.group_hit_tokens, self.group_limited_requests, self.prompt_tokens, "group_hit_rates"
            ),
        }


def trace_request(item: TraceRequest, hasher: BlockHasher) -> Request:
    """The request a replay runs for trace line ``item``: id ``trace-<line>``, its prompt tokens, and the
    priority and retention it carries to the eviction policy. A prompt of hash ids is hashed run by run
    (:meth:`BlockHasher.hash_runs`: the same hashes as its tokens give)."""
    tokens = prompt_tokens(item)
    if item.hash_ids is None or item.hash_block_size is None:
        return Request(
            f"trace-{item.line}",
            tokens,
            block_hasher=hasher,
            priority=item.priority,
            retention_seconds=item.retention_seconds,
        )
    request = Request(
        f"trace-{item.line}", tokens, priority=item.priority, retention_seconds=item.retention_seconds
    )
    block = item.hash_block_size
    last = item.input_length - (len(item.hash_ids) - 1) * block
    runs = [(h, block) for h in item.hash_ids]
    runs[-1] = (item.hash_ids[-1], last)
    request.adopt_block_hashes(hasher, hasher.hash_runs(runs))
    return request


class TraceClock:
    """Simulated time in seconds, for an eviction policy's clock (``eviction_clock``): a replay sets
    ``now`` to each request's arrival."""

    __slots__ = ("now",)

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def replay_cache(
    requests: Iterable[TraceRequest],
    coordinator: KVCacheCoordinator,
    *,
    chunk_tokens: int | None = None,
    on_request: Callable[[TraceRequest, int], None] | None = None,
    clock: TraceClock | None = None,
    per_group: bool = False,
) -> ReplayStats:
    """Replay ``requests`` (arrival order) through ``coordinator``; ``on_request(request, hit_tokens)`` is
    called after each (a progress bar, per-request figures). The coordinator must have prefix caching on
    and hold no request; it holds none afterwards.

    Each prompt is computed as a scheduler would: from its hit, in chunks of at most ``chunk_tokens``
    (None: one chunk) ending on scheduler-block boundaries, the first ending at the shared-prefix junction
    the lookup reports (``Request.shared_prefix_boundary``, pinned as vLLM 0.34's Scheduler pins it). Mamba
    "align" keeps states only where chunks end, so chunking and junctions decide what a hybrid can hit.
    Each request carries its trace priority and retention to the eviction policy; ``clock`` (the
    coordinator's ``eviction_clock``, if it has a policy that reads time) is set to each arrival.

    ``per_group`` (a hybrid): before each lookup, every group is also searched alone, and the stats count
    each group's own hit tokens and the requests on which it limited the hit (one more search per request)."""
    hasher = coordinator.make_block_hasher(seed="kvspec-replay")
    block_size = coordinator.hash_block_size
    scheduler_block = coordinator.scheduler_block_size
    if chunk_tokens is not None and chunk_tokens < scheduler_block:
        raise SchedulingError(
            f"chunk_tokens {chunk_tokens} is below the scheduler block ({scheduler_block} tokens); a chunk "
            "must hold at least one block"
        )
    admission = PromptAdmission(coordinator, chunk_tokens=chunk_tokens)
    num_requests = total_tokens = total_hits = total_blocks = hit_blocks = refused = 0
    num_groups = len(coordinator.kv_cache_config.kv_cache_groups) if per_group else 0
    group_hits = [0] * num_groups
    group_limited = [0] * num_groups
    searched = cached_group_ids(coordinator) if per_group else ()
    for item in requests:
        num_tokens = item.input_length
        if clock is not None:
            clock.now = item.arrival_ms / 1000.0
        if admission.refuses(item):
            # Longer than the model takes, or larger than the whole cache: an engine turns it away before it
            # touches the cache (and before its hash ids are expanded to tokens).
            refused += 1
            hit = 0
        else:
            request = trace_request(item, hasher)
            if num_groups:
                _, lengths = coordinator.find_longest_cache_hit_per_group(
                    request.block_hashes, num_tokens - 1
                )
                count_group_hits(lengths, searched, group_hits, group_limited)
            computed, hit, uncached = coordinator.lookup_prefix(request, num_tokens - 1)
            junction = shared_prefix_junction(hit, uncached)
            request.shared_prefix_boundary = junction
            if not _compute_prompt(
                coordinator, request, computed, hit, junction, chunk_tokens, scheduler_block
            ):
                refused += 1  # the admission bound guarantees room; kept so a plugin's surprise is counted
                hit = 0
        trace_block = item.hash_block_size or block_size
        num_requests += 1
        total_tokens += num_tokens
        total_hits += hit
        total_blocks += cdiv(num_tokens, trace_block)
        hit_blocks += cdiv(hit, trace_block)
        if on_request is not None:
            on_request(item, hit)
    stats = ReplayStats(
        requests=num_requests,
        prompt_tokens=total_tokens,
        hit_tokens=total_hits,
        prompt_blocks=total_blocks,
        hit_blocks=hit_blocks,
        refused=refused,
    )
    if not num_groups:
        return stats
    return dataclasses.replace(
        stats, group_hit_tokens=tuple(group_hits), group_limited_requests=tuple(group_limited)
    )


def count_group_hits(
    lengths: Sequence[int], searched: Sequence[int], hits: list[int], limited: list[int]
) -> None:
    """Fold one request's per-group own hits (``lengths``, tokens, from ``find_longest_cache_hit_per_group``)
    into ``hits``; count it in ``limited`` for the groups whose own hit was the shortest while another's was
    longer (the groups that limited its hit). Only the ``searched`` groups (those prefix-cached) count. The
    pure replay and a timed instance (``per_group``) both count with it."""
    for g in searched:
        hits[g] += lengths[g]
    if searched:
        own = [lengths[g] for g in searched]
        low = min(own)
        if low < max(own):
            for g in searched:
                if lengths[g] == low:
                    limited[g] += 1


def cached_group_ids(coordinator: KVCacheCoordinator) -> tuple[int, ...]:
    """The groups a prefix hit is searched in (prefix-cacheable ones)."""
    return tuple(g for g, t in enumerate(coordinator.traits) if t.prefix_cacheable)


class PromptAdmission:
    """Whether an engine takes a prompt, decided before it touches the cache: at most ``max_model_len``
    tokens (with ``output_tokens``: prompt and output), and one request of that many tokens, computed in
    chunks of ``chunk_tokens``, fits the pool's usable blocks (the planner's per-request bound, every group's
    blocks; the null block is not usable). A prompt refused here evicts nothing."""

    __slots__ = ("_chunk", "_groups", "_limits", "_max_model_len", "_needed", "usable")

    def __init__(self, coordinator: KVCacheCoordinator, *, chunk_tokens: int | None) -> None:
        config = coordinator.kv_cache_config
        self._groups = [g for g in config.kv_cache_groups if g.layer_names]
        self._limits = coordinator.limits
        self._max_model_len = coordinator.max_model_len
        #: Blocks a request may take: all of the pool's but the null block.
        self.usable = config.num_blocks - 1
        self._chunk = chunk_tokens
        self._needed: dict[int, int] = {}

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks one request of ``num_tokens`` tokens holds at most (every group)."""
        needed = self._needed.get(num_tokens)
        if needed is None:
            chunk = num_tokens if self._chunk is None else min(self._chunk, num_tokens)
            limits = dataclasses.replace(self._limits, max_model_len=num_tokens, max_num_batched_tokens=chunk)
            needed = blocks_per_request(self._groups, limits)
            self._needed[num_tokens] = needed
        return needed

    def refuses(self, item: TraceRequest, *, output_tokens: int = 0) -> bool:
        num_tokens = item.input_length + output_tokens
        return (
            item.over_length
            or num_tokens > self._max_model_len
            or self.blocks_needed(num_tokens) > self.usable
        )


def _compute_prompt(
    coordinator: KVCacheCoordinator,
    request: Request,
    computed: KVCacheBlocks,
    hit: int,
    junction: int,
    chunk_tokens: int | None,
    scheduler_block: int,
) -> bool:
    """Allocate (and so publish) the prompt chunk by chunk from ``hit``, then free the request; False (and
    nothing held) when a chunk does not fit."""
    num_tokens = request.num_tokens
    done = hit
    first = True
    while done < num_tokens:
        end = num_tokens
        if chunk_tokens is not None and done + chunk_tokens < num_tokens:
            end = max((done + chunk_tokens) // scheduler_block * scheduler_block, done + 1)
        if done < junction < end:
            end = junction
        coordinator.new_step_starts()  # each chunk is a step of its own (Mamba defers same-step hits)
        result = coordinator.allocate_slots(
            request, end - done, hit if first else 0, computed if first else None
        )
        if result is None:
            if not first:
                coordinator.free(request)
            return False
        first = False
        request.num_computed_tokens = end
        done = end
    coordinator.free(request)
    return True


def replay_coordinator(
    config: KVCacheConfig,
    limits: SchedulerLimits,
    *,
    eviction_policy: str | EvictionPolicyFactory | None = None,
    clock: TraceClock | None = None,
    retention_interval: int | None = PLANNED_RETENTION,
) -> KVCacheCoordinator:
    """A coordinator for a replay of ``config``'s layout: prefix caching on, the current release's rules,
    ``eviction_policy`` (None: vLLM's LRU) on ``clock``'s time (pass the same clock to ``replay_cache``).

    ``retention_interval`` (tokens) is the prefix-cache retention of sliding-window and Mamba groups: by
    default what the current release plans into every config (vLLM 0.34: 0, sparse: only the blocks a hit
    can end on, at replay boundaries and shared-prefix junctions); None caches them densely (vLLM 0.23).
    Full-attention groups cache every block either way."""
    return KVCacheCoordinator(
        config,
        limits,
        enable_caching=True,
        eviction_policy=eviction_policy,
        eviction_clock=clock,
        prefix_cache_retention_interval=retention_interval,
    )


def blocks_to_hold_every_prompt(requests: Iterable[TraceRequest], block_sizes: Sequence[int]) -> int:
    """Blocks that hold every distinct prompt block of the trace at once in groups of ``block_sizes`` tokens
    (one entry per group: the groups share the pool), plus the null block and one request's unhashed tail
    per group. Hash ids are counted once each (the longest stretch of tokens any request gives one); token
    prompts, every prompt's blocks. One pass over ``requests`` (a stream is read once); over-length requests
    (refused) count nothing."""
    sizes: dict[int, int] = {}
    token_prompts: list[int] = []
    for r in requests:
        if r.over_length:
            continue
        if r.hash_ids is None:
            token_prompts.append(r.input_length)
            continue
        assert r.hash_block_size is not None
        block = r.hash_block_size
        for i, h in enumerate(r.hash_ids):
            n = min(block, r.input_length - i * block)
            if n > sizes.get(h, 0):
                sizes[h] = n
    lengths = [*sizes.values(), *token_prompts]
    return sum(sum(cdiv(n, b) for n in lengths) + 2 for b in block_sizes)


def blocks_retained(
    requests: Iterable[TraceRequest],
    config: KVCacheConfig,
    limits: SchedulerLimits,
    *,
    chunk_tokens: int | None = None,
    retention_interval: int | None = PLANNED_RETENTION,
) -> int:
    """Blocks a cache needs to keep everything a replay of ``requests`` would cache, plus room for the
    longest prompt: the blocks holding cached content after an LRU replay in ``config`` (which must hold
    every prompt, see :func:`blocks_to_hold_every_prompt`), plus that prompt's blocks in every group.

    Under sparse retention (``retention_interval`` 0, vLLM 0.34's default) sliding-window and Mamba groups
    keep only the blocks a hit can end on, so for hybrids this is far below the distinct prompt blocks: it
    is the size at which more memory stops raising the hit rate, the top of a sweep."""
    coordinator = replay_coordinator(config, limits, retention_interval=retention_interval)
    longest = 0

    def note_longest(item: TraceRequest, _hit: int) -> None:
        nonlocal longest
        if not item.over_length and item.input_length > longest:
            longest = item.input_length

    replay_cache(requests, coordinator, chunk_tokens=chunk_tokens, on_request=note_longest)
    cached = sum(1 for block in coordinator.block_pool.blocks if block.block_hash is not None)
    return cached + sum(cdiv(longest, size) for size in coordinator.group_block_sizes)
