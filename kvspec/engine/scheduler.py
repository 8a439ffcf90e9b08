"""A small continuous-batching scheduler over the KVCacheCoordinator: chunked prefill, decode, and
preemption (recompute) when ``allocate_slots`` says the blocks do not fit."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvspec.blocks.request import Request
from kvspec.coordinator import KVCacheCoordinator, shared_prefix_junction
from kvspec.tiers.connector import TierConnector


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
class ScheduledRequest:
    """``num_new_tokens`` tokens of ``request`` run this step, starting at position ``num_computed``."""

    request: Request
    num_computed: int
    num_new_tokens: int
    new_block_ids: tuple[Sequence[int], ...]
    resumed: bool

    def __init__(
        self,
        *,
        request: Request,
        num_computed: int,
        num_new_tokens: int,
        new_block_ids: tuple[Sequence[int], ...],
        resumed: bool,
    ) -> None:
        # Direct object.__setattr__ calls: slot stores in the compiled build (see kvspec.blocks.events).
        object.__setattr__(self, "request", request)
        object.__setattr__(self, "num_computed", num_computed)
        object.__setattr__(self, "num_new_tokens", num_new_tokens)
        object.__setattr__(self, "new_block_ids", new_block_ids)
        object.__setattr__(self, "resumed", resumed)


@dataclass(kw_only=True, slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    cpu_seconds: float = 0.0

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    """FCFS: running requests first (oldest first), then admissions; the newest running request is
    preempted when blocks run out. Token budget per step: ``max_num_batched_tokens``. An admission's first
    chunk ends at its shared-prefix junction (``Request.shared_prefix_boundary``), as in vLLM 0.34.

    With a group whose hits end only at its own block boundaries (Mamba "align") and prefix caching on,
    prefill chunks are cut as vLLM's Scheduler cuts them (``_mamba_block_aligned_split``): a chunk short of
    the prompt's last full block ends on a block boundary, the chunk reaching past it ends exactly there, so
    states are kept where hits can use them; a chunk cut to nothing waits for the next step."""

    def __init__(
        self, coordinator: KVCacheCoordinator, *, max_num_batched_tokens: int, max_num_seqs: int
    ) -> None:
        self.coordinator = coordinator
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        #: Offload tiers below the GPU cache (None: none): an admission's hit extends past the GPU's with
        #: the tokens they hold, as vLLM's KV connector's external computed tokens.
        self.connector: TierConnector | None = None
        #: Called with each waiting request just before its prefix lookup (None: nothing): a per-group
        #: count reads the groups' own hits there, before the admission caches the request's blocks.
        self.before_lookup: Callable[[Request], None] | None = None
        self._aligned_block = (
            coordinator.scheduler_block_size
            if coordinator.enable_caching and any(t.hits_at_own_block_boundaries for t in coordinator.traits)
            else 0
        )

    def _aligned(self, request: Request, computed: int, num_new: int) -> int:
        """``num_new`` prefill tokens from ``computed`` cut as vLLM's Mamba "align" split cuts them."""
        block = self._aligned_block
        if not block or computed >= max(request.num_prompt_tokens, request.num_tokens - 1):
            return num_new  # no aligned group, or decoding
        last = request.num_tokens - request.num_tokens % block
        if computed + num_new < last:
            return num_new // block * block
        if computed < last < computed + num_new:
            return last - computed
        return num_new

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, out: SchedulerOutput) -> Request:
        victim = self.running.pop()
        self.coordinator.free(victim)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        out.preempted.append(victim)
        return victim

    def schedule(self) -> SchedulerOutput:
        start = time.perf_counter()
        out = SchedulerOutput()
        coord = self.coordinator
        coord.new_step_starts()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if self._aligned_block:
                num_new = self._aligned(request, request.num_computed_tokens, num_new)
                if not num_new:
                    i += 1  # too little budget for a whole block: it waits for the next step
                    continue
            new_blocks = coord.allocate_slots(request, num_new)
            while new_blocks is None:
                victim = self._preempt(out)
                if victim is request:
                    break
                new_blocks = coord.allocate_slots(request, num_new)
            if new_blocks is None:
                break
            out.scheduled.append(
                ScheduledRequest(
                    request=request,
                    num_computed=request.num_computed_tokens,
                    num_new_tokens=num_new,
                    new_block_ids=new_blocks.get_block_ids(),
                    resumed=False,
                )
            )
            budget -= num_new
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if self.before_lookup is not None:
                self.before_lookup(request)
            computed, num_computed, uncached = coord.lookup_prefix(request, request.num_tokens - 1)
            coord.record_prefix_hit(request, num_computed)
            external = 0
            connector = self.connector
            if connector is not None:
                external = connector.find_hit(
                    request.request_id, request.block_hashes, num_computed, request.num_tokens - 1
                )
            # The shared-prefix junction (where one group's hit reached past the common one) is pinned as
            # vLLM 0.34's Scheduler pins it: the first chunk ends there, so sparse retention caches it.
            # A tier hit reaching past it loads the span instead.
            junction = shared_prefix_junction(num_computed, uncached) if not external else 0
            request.shared_prefix_boundary = junction
            first = num_computed + external  # where the request's first chunk starts
            num_new = min(request.num_tokens - first, budget)
            if junction > num_computed:
                num_new = min(num_new, junction - num_computed)
            if self._aligned_block:
                num_new = self._aligned(request, first, num_new)
            new_blocks = (
                coord.allocate_slots(
                    request, num_new, num_computed, computed, num_external_computed_tokens=external
                )
                if num_new
                else None
            )
            if new_blocks is None:
                if connector is not None:
                    connector.dropped(request.request_id)
                break
            if connector is not None:
                connector.admitted(request.request_id, first)
            self.waiting.popleft()
            request.num_computed_tokens = first
            self.running.append(request)
            out.scheduled.append(
                ScheduledRequest(
                    request=request,
                    num_computed=first,
                    num_new_tokens=num_new,
                    new_block_ids=coord.get_block_ids(request.request_id),
                    resumed=True,
                )
            )
            budget -= num_new
        out.cpu_seconds = time.perf_counter() - start
        return out

    def finish(self, request: Request) -> None:
        self.running.remove(request)
        self.coordinator.free(request)
