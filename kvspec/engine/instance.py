"""One engine instance on a simulated clock: kvspec's scheduler over a coordinator, stepped by a caller.

The timed replay (one instance, :func:`kvspec.engine.timed_replay.replay_timed`) and the fleet
(:mod:`kvspec.fleet`: many instances behind a router) drive the same object: a request is added when it
arrives (:meth:`EngineInstance.add`), and :meth:`EngineInstance.step` runs one scheduler step starting at the
instance's clock ``now_ms`` and advances that clock by the step-time model. An idle instance's clock jumps
to the arrival that wakes it.

Each step: the scheduler forms a batch (running requests first, then admissions, chunked prefill,
preemption by recompute); its duration is the step-time model's for that batch; the requests whose prompt
completes produce their first token at the step's end; decode produces one token per running request per
step (generated tokens are distinct per request, so they are hashed and cached as vLLM caches decode blocks).

Read-only views for a router: :meth:`load` (queue, running, tokens left to prefill, blocks held) and
:meth:`probe_hit` (the hit the coordinator would give a request now: ``lookup_prefix``, which records
nothing and touches no block).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvspec.blocks.events import BlockRemoved, BlockStored, KVCacheEvent
from kvspec.blocks.request import Request
from kvspec.coordinator import KVCacheCoordinator
from kvspec.engine.replay import PromptAdmission, TraceClock, cached_group_ids, count_group_hits
from kvspec.engine.scheduler import ScheduledRequest, Scheduler
from kvspec.engine.stats import TimedReplayStats, percentile
from kvspec.engine.step_time import StepBatch, StepTime, StepTimeModel
from kvspec.engine.traces import TraceRequest
from kvspec.errors import SchedulingError
from kvspec.intmath import cdiv
from kvspec.tiers.base import key_block_hash, key_group
from kvspec.tiers.connector import TierConnector

#: Generated token ids: ``_GENERATED_BASE + (line * _OUTPUT_SPAN + i) % _GENERATED_RANGE`` for the i-th token
#: of the request on trace line ``line``: distinct across requests of any real trace, above every prompt
#: token a hash id gives (``traces.HASH_ID_LIMIT``, 2**31), and below 2**32 (token ids hash as uint32).
_GENERATED_BASE = 3_000_000_000
_GENERATED_RANGE = 1_000_000_000
_OUTPUT_SPAN = 65_536


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
class InstanceLoad:
    """What a router may know of an instance's load now. Requests; tokens; blocks (the scheduler's pool,
    every group's blocks; ``num_blocks`` excludes the null block).

    ``prefill_tokens``: prompt (and recompute) tokens the queued and running requests have still to compute;
    ``active_blocks``: blocks held by running requests (cached blocks nobody holds are not load) plus the
    blocks queued requests' uncomputed tokens will take (so it may exceed ``num_blocks``)."""

    index: int
    waiting: int
    running: int
    prefill_tokens: int
    active_blocks: int
    num_blocks: int

    def __init__(
        self,
        *,
        index: int,
        waiting: int,
        running: int,
        prefill_tokens: int,
        active_blocks: int,
        num_blocks: int,
    ) -> None:
        # Direct object.__setattr__ calls: slot stores in the compiled build (see kvspec.blocks.events).
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "waiting", waiting)
        object.__setattr__(self, "running", running)
        object.__setattr__(self, "prefill_tokens", prefill_tokens)
        object.__setattr__(self, "active_blocks", active_blocks)
        object.__setattr__(self, "num_blocks", num_blocks)

    @property
    def requests(self) -> int:
        """Requests in flight: queued and running."""
        return self.waiting + self.running

    @property
    def kv_usage(self) -> float:
        """Active blocks over the pool's, at most 1."""
        return min(1.0, self.active_blocks / self.num_blocks) if self.num_blocks else 0.0


class EngineInstance:
    """One engine: ``coordinator`` (prefix caching on, holding no request) under kvspec's FCFS scheduler,
    on its own simulated clock (``now_ms``). ``clock`` (the coordinator's ``eviction_clock``) follows the
    step starts in seconds. Figures accumulate in ``stats``; ``on_finish`` is called for each request done."""

    __slots__ = (
        "_admission",
        "_admitted_once",
        "_block_tokens",
        "_clock",
        "_expected_new",
        "_first",
        "_generated",
        "_group_probe",
        "_items",
        "_model",
        "_quiet_blocks",
        "_searched_groups",
        "connector",
        "coordinator",
        "fast_decode",
        "index",
        "now_ms",
        "on_done",
        "on_finish",
        "record_requests",
        "scheduler",
        "stats",
        "track_queued_hits",
    )

    def __init__(
        self,
        coordinator: KVCacheCoordinator,
        *,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        step_time: StepTime | None = None,
        clock: TraceClock | None = None,
        index: int = 0,
        on_finish: Callable[[TraceRequest], None] | None = None,
        tiers: TierConnector | None = None,
        per_group: bool = False,
    ) -> None:
        if max_num_batched_tokens < coordinator.scheduler_block_size:
            raise SchedulingError(
                f"max_num_batched_tokens {max_num_batched_tokens} is below the scheduler block "
                f"({coordinator.scheduler_block_size} tokens)"
            )
        self.coordinator = coordinator
        self.index = index
        self._model: StepTime = StepTimeModel() if step_time is None else step_time
        self._clock = clock
        self.scheduler = Scheduler(
            coordinator, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs
        )
        self._admission = PromptAdmission(coordinator, chunk_tokens=max_num_batched_tokens)
        #: Offload tiers under the GPU cache (``tiers``; None: none). Loads are charged in the step that
        #: admits the request, stores overlap the step's compute (see kvspec.tiers.connector).
        self.connector = tiers
        self.scheduler.connector = tiers
        self._block_tokens = coordinator.scheduler_block_size
        self.stats = TimedReplayStats(tiers=None if tiers is None else tiers.stats)
        # ``per_group``: count each group's own hit at every first admission (a hybrid's limiting group; one
        # more search per admission) into ``stats.group_hit_tokens`` and ``group_limited_requests``.
        self._group_probe: dict[str, tuple[int, ...]] = {}
        self._searched_groups = cached_group_ids(coordinator)
        if per_group:
            num_groups = len(coordinator.kv_cache_config.kv_cache_groups)
            self.stats.group_hit_tokens = [0] * num_groups
            self.stats.group_limited_requests = [0] * num_groups
            self.scheduler.before_lookup = self._probe_groups
        if tiers is not None:
            tiers.publish = coordinator.options.enable_kv_cache_events
        self.now_ms = 0.0
        self.on_finish = on_finish
        #: Called with the id of each request that leaves this instance, finished or refused after it was
        #: added (a router that tracks what it routed learns it, as Dynamo's router does from the stream).
        self.on_done: Callable[[str], None] | None = None
        self._items: dict[str, TraceRequest] = {}
        self._generated: dict[str, int] = {}
        self._admitted_once: set[str] = set()
        #: Per queued request, the tokens it will compute (its prompt less the hit it would get when it
        #: arrived), kept when ``track_queued_hits`` so :meth:`load` counts queued work as a router that
        #: tracks its own routed requests does (Dynamo's prefill tokens and active blocks).
        self.track_queued_hits = False
        #: Keep one row per finished request in ``stats.per_request``.
        self.record_requests = False
        #: Run stretches of decode steps that start and fill no block as bookkeeping only (the same figures,
        #: block ids and events; see :meth:`step`) where the coordinator says such steps change nothing.
        self.fast_decode = True
        self._quiet_blocks = coordinator.quiet_decode_block_sizes()
        self._first: dict[str, tuple[int, float, float]] = {}
        self._expected_new: dict[str, int] = {}

    # -- arrivals -----------------------------------------------------------------------------

    def refuses(self, item: TraceRequest) -> bool:
        """Whether this engine turns ``item`` away on arrival: longer than max_model_len (prompt and output)
        or larger than the whole cache. Decided before the request's tokens are built."""
        return self._admission.refuses(item, output_tokens=max(1, item.output_length))

    def add(self, item: TraceRequest, request: Request | None, *, at_ms: float) -> bool:
        """``item`` arrives at ``at_ms`` (not before the clock of a busy instance); ``request`` is its
        Request (hashed with this coordinator's hasher), or None when :meth:`refuses` said so. Counts it;
        False (counted as refused) when refused."""
        stats = self.stats
        stats.requests += 1
        stats.prompt_tokens += item.input_length
        stats.prompt_blocks += cdiv(
            item.input_length, item.hash_block_size or self.coordinator.hash_block_size
        )
        if request is None:
            stats.refused += 1
            return False
        if not self.scheduler.has_unfinished():
            self.now_ms = max(self.now_ms, at_ms)  # idle until this arrival
        self._items[request.request_id] = item
        self._generated[request.request_id] = 0
        if self.track_queued_hits:
            self._expected_new[request.request_id] = request.num_tokens - self.probe_hit(request)
        self.scheduler.add_request(request)
        return True

    # -- steps --------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self, horizon_ms: float = float("inf")) -> None:
        """Run one scheduler step starting at ``now_ms`` and advance the clock by its duration. A step that
        schedules nothing (the first waiting request cannot fit the empty cache) refuses that request and
        takes no time.

        Quiet decode: when nothing waits, every running request decodes, and no step before ``horizon_ms``
        (the next arrival: a step starting at or after it may take new work) would start or fill a block
        of any group nor finish a request, the steps starting before the horizon are run together as
        bookkeeping (tokens appended, clock advanced step by step): the coordinator said such steps change
        nothing in the cache (``quiet_decode_block_sizes``), so the figures are those of one step at a
        time."""
        if self._quiet_blocks is not None and self.fast_decode and not self.scheduler.waiting:
            if self._quiet_steps(horizon_ms):
                return
        stats = self.stats
        scheduler = self.scheduler
        coordinator = self.coordinator
        start = self.now_ms
        if self._clock is not None:
            self._clock.now = start / 1000.0
        output = scheduler.schedule()
        stats.preemptions += len(output.preempted)
        connector = self.connector
        if not output.scheduled:
            refused = scheduler.waiting.popleft()
            coordinator.free(refused)
            if connector is not None:
                connector.finished(refused.request_id)
            stats.refused += 1
            if self.on_done is not None:
                self.on_done(refused.request_id)
            return
        stats.steps += 1
        now = start + self._step_duration(output.scheduled)
        self.now_ms = now
        self._account(output.scheduled, start, now)

    def _step_duration(self, scheduled_requests: list[ScheduledRequest]) -> float:
        """The step's duration (ms): the step-time model's for its prefill tokens and decodes, plus the tier
        loads that resumed requests wait for, at least the tiers' own step (stores)."""
        connector = self.connector
        prefill = decode = 0
        for scheduled in scheduled_requests:
            request = scheduled.request
            if (
                scheduled.num_new_tokens == 1
                and request.num_prompt_tokens < request.num_tokens
                and scheduled.num_computed + 1 == request.num_tokens
            ):
                decode += 1
            else:
                prefill += scheduled.num_new_tokens
        duration = self._step_ms(prefill, decode, len(scheduled_requests))
        if connector is not None:
            for scheduled in scheduled_requests:
                if scheduled.resumed:
                    rid = scheduled.request.request_id
                    duration += connector.begin_load(rid, first_admission=rid not in self._admitted_once)
            duration = max(
                duration,
                connector.end_step(
                    [
                        (s.request.request_id, s.request.block_hashes, s.num_computed + s.num_new_tokens)
                        for s in scheduled_requests
                    ]
                ),
            )
        return duration

    def _probe_groups(self, request: Request) -> None:
        """Before a first admission's lookup: each group's own hit now (the last lookup before the admission
        counts; the admission then caches the request's own blocks, which a later search would find)."""
        if request.request_id not in self._admitted_once:
            _, lengths = self.coordinator.find_longest_cache_hit_per_group(
                request.block_hashes, request.num_tokens - 1
            )
            self._group_probe[request.request_id] = lengths

    def _account(self, scheduled_requests: list[ScheduledRequest], start: float, now: float) -> None:
        """The step's effects on each scheduled request and the stats: admissions' hits and queueing, the
        prompt's end (TTFT), one generated token per request that finished its prompt, and finishes."""
        stats = self.stats
        scheduler = self.scheduler
        coordinator = self.coordinator
        connector = self.connector
        items = self._items
        generated = self._generated
        for scheduled in scheduled_requests:
            request = scheduled.request
            rid = request.request_id
            item = items[rid]
            if scheduled.resumed:  # an admission: its hit is num_computed
                stats.query_tokens += request.num_tokens
                stats.hit_tokens += scheduled.num_computed
                if rid not in self._admitted_once:
                    self._admitted_once.add(rid)
                    self._expected_new.pop(rid, None)
                    hit = scheduled.num_computed
                    probe = self._group_probe.pop(rid, None)
                    if probe is not None:
                        count_group_hits(
                            probe, self._searched_groups, stats.group_hit_tokens, stats.group_limited_requests
                        )
                    stats.first_admission_hit_tokens += hit
                    stats.first_admission_hit_blocks += cdiv(
                        hit, item.hash_block_size or coordinator.hash_block_size
                    )
                    stats.queue_ms.append(start - item.arrival_ms)
                    if self.record_requests:
                        self._first[rid] = (hit, start - item.arrival_ms, 0.0)
            request.num_computed_tokens = scheduled.num_computed + scheduled.num_new_tokens
            if request.num_computed_tokens < request.num_tokens:
                continue  # chunked prefill continues next step
            count = generated[rid]
            if count == 0:
                stats.ttft_ms.append(now - item.arrival_ms)
                if self.record_requests:
                    hit, queued, _ = self._first[rid]
                    self._first[rid] = (hit, queued, now - item.arrival_ms)
            request.append_output_token_ids(
                _GENERATED_BASE + (item.line * _OUTPUT_SPAN + count) % _GENERATED_RANGE
            )
            generated[rid] = count + 1
            stats.generated_tokens += 1
            if count + 1 >= max(1, item.output_length):
                scheduler.finish(request)
                if connector is not None:
                    connector.finished(rid)
                del items[rid], generated[rid]
                self._admitted_once.discard(rid)
                stats.finished += 1
                stats.e2e_ms.append(now - item.arrival_ms)
                if self.record_requests:
                    hit, queued, ttft = self._first.pop(rid)
                    stats.per_request.append((item.line, hit, queued, ttft, now - item.arrival_ms))
                if self.on_finish is not None:
                    self.on_finish(item)
                if self.on_done is not None:
                    self.on_done(rid)
        stats.simulated_ms = now

    def _usable_and_held(self) -> tuple[int, int]:
        """The pool's usable blocks (the null block aside) and how many of them requests hold."""
        pool = self.coordinator.block_pool
        usable = pool.num_gpu_blocks - 1
        return usable, usable - pool.get_num_free_blocks()

    def _step_ms(self, prefill_tokens: int, decode_tokens: int, num_requests: int) -> float:
        """The step-time model's duration for a step of this batch over the pool as it is now."""
        usable, held = self._usable_and_held()
        return self._model.step_ms(
            StepBatch(
                prefill_tokens=prefill_tokens,
                decode_tokens=decode_tokens,
                num_requests=num_requests,
                active_kv_tokens=held * self._block_tokens,
                kv_capacity_tokens=max(1, usable) * self._block_tokens,
            )
        )

    def _quiet_steps(self, horizon_ms: float) -> bool:
        """Run the quiet decode steps before ``horizon_ms`` (see :meth:`step`); False when there are none."""
        running = self.scheduler.running
        if not running or len(running) > self.scheduler.max_num_batched_tokens:
            return False
        sizes = self._quiet_blocks
        assert sizes is not None
        items = self._items
        generated = self._generated
        quiet = 1 << 62
        for r in running:
            computed = r.num_computed_tokens
            if computed + 1 != r.num_tokens or r.num_tokens <= r.num_prompt_tokens:
                return False  # still in prefill (or recomputing after a preemption)
            for size in sizes:
                offset = computed % size
                if offset == 0 or offset == size - 1:
                    return False  # this step starts or fills a block
                if size - 1 - offset < quiet:
                    quiet = size - 1 - offset
            left = max(1, items[r.request_id].output_length) - generated[r.request_id] - 1
            if left < quiet:
                quiet = left  # the step that produces the last token finishes the request
            if quiet <= 0:
                return False
        duration = self._step_ms(0, len(running), len(running))
        now = self.now_ms
        steps = 0
        start = now
        while steps < quiet and now < horizon_ms:
            start = now
            now += duration  # step by step, so the clock is the one single steps give
            steps += 1
        if not steps:
            return False
        if self._clock is not None:
            self._clock.now = start / 1000.0
        for r in running:
            rid = r.request_id
            line = items[rid].line
            count = generated[rid]
            r.append_output_token_ids(
                [_GENERATED_BASE + (line * _OUTPUT_SPAN + count + i) % _GENERATED_RANGE for i in range(steps)]
            )
            r.num_computed_tokens += steps
            generated[rid] = count + steps
        stats = self.stats
        stats.steps += steps
        stats.generated_tokens += steps * len(running)
        stats.simulated_ms = now
        self.now_ms = now
        return True

    # -- what a router may read -----------------------------------------------------------------

    def load(self) -> InstanceLoad:
        """The load now. Queued requests count their prompt tokens (less the hit each would have got on
        arrival, with ``track_queued_hits``) as prefill and, as blocks they will take, that many tokens'
        blocks; running ones what is left of their prompt and the blocks they hold."""
        scheduler = self.scheduler
        expected = self._expected_new
        pending = queued_blocks = 0
        block = self._block_tokens
        for r in scheduler.waiting:
            left = expected.get(r.request_id, r.num_tokens - r.num_computed_tokens)
            pending += left
            queued_blocks += -(-left // block)
        for r in scheduler.running:
            left = r.num_tokens - r.num_computed_tokens
            if left > 1:
                pending += left
        usable, held = self._usable_and_held()
        return InstanceLoad(
            index=self.index,
            waiting=len(scheduler.waiting),
            running=len(scheduler.running),
            prefill_tokens=pending,
            active_blocks=held + queued_blocks,
            num_blocks=usable,
        )

    def probe_hit(self, request: Request) -> int:
        """Tokens of ``request``'s prompt this instance's cache would give it if admitted now (the engine's
        rules: every group's retention, the last token recomputed; its tiers' hit past the GPU's included).
        Side-effect free."""
        hit = self.coordinator.lookup_prefix(request, request.num_tokens - 1)[1]
        if self.connector is not None:
            hit += self.connector.probe(request.block_hashes, hit, request.num_tokens - 1)
        return hit

    def take_events(self) -> list[KVCacheEvent]:
        """KV events since the last call (empty unless the coordinator has ``enable_kv_cache_events``): the
        GPU cache's, then this instance's tiers' (``medium`` the tier's; a store as vLLM's offloading
        connector announces it by default: the hash alone, no tokens, block size 0)."""
        events = self.coordinator.take_events()
        if self.connector is not None and self.connector.publish:
            kinds = self.coordinator.block_pool.stored_event_kinds
            for event in self.connector.take_events():
                for key in event.keys:
                    group = key_group(key)
                    if event.removed:
                        events.append(
                            BlockRemoved(
                                block_hashes=[key_block_hash(key)], medium=event.medium, group_idx=group
                            )
                        )
                        continue
                    kind, window = kinds[group] if kinds else (None, None)
                    events.append(
                        BlockStored(
                            block_hashes=[key_block_hash(key)],
                            parent_block_hash=None,
                            token_ids=[],
                            block_size=0,
                            lora_id=None,
                            medium=event.medium,
                            lora_name=None,
                            group_idx=group,
                            kv_cache_spec_kind=kind,
                            kv_cache_spec_sliding_window=window,
                        )
                    )
        return events


__all__ = ["EngineInstance", "InstanceLoad", "TimedReplayStats", "percentile"]
