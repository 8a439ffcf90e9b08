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

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvspec.blocks.request import Request
from kvspec.coordinator import KVCacheCoordinator
from kvspec.engine.traces import TraceRequest, prompt_tokens
from kvspec.intmath import cdiv


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

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    def summary(self) -> dict[str, float | int]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": round(self.token_hit_rate, 4),
            "prompt_blocks": self.prompt_blocks,
            "hit_blocks": self.hit_blocks,
            "block_hit_rate": round(self.block_hit_rate, 4),
            "refused": self.refused,
        }


def replay_cache(
    requests: Iterable[TraceRequest],
    coordinator: KVCacheCoordinator,
    *,
    on_request: Callable[[TraceRequest, int], None] | None = None,
) -> ReplayStats:
    """Replay ``requests`` (arrival order) through ``coordinator``; ``on_request(request, hit_tokens)`` is
    called after each (a progress bar, per-request figures). The coordinator must have prefix caching on
    and hold no request; it holds none afterwards."""
    hasher = coordinator.make_block_hasher(seed="kvspec-replay")
    block_size = coordinator.hash_block_size
    max_model_len = coordinator.max_model_len
    num_requests = total_tokens = total_hits = total_blocks = hit_blocks = refused = 0
    for item in requests:
        tokens = prompt_tokens(item)
        request = Request(f"trace-{item.line}", tokens, block_hasher=hasher)
        computed, hit = coordinator.get_computed_blocks(request)
        if (
            len(tokens) > max_model_len
            or coordinator.allocate_slots(request, len(tokens) - hit, hit, computed) is None
        ):
            # Longer than the model takes, or larger than the whole cache: an engine turns it away.
            refused += 1
            hit = 0
        else:
            request.num_computed_tokens = len(tokens)
            coordinator.free(request)
        trace_block = item.hash_block_size or block_size
        num_requests += 1
        total_tokens += len(tokens)
        total_hits += hit
        total_blocks += cdiv(len(tokens), trace_block)
        hit_blocks += cdiv(hit, trace_block)
        if on_request is not None:
            on_request(item, hit)
    return ReplayStats(
        requests=num_requests,
        prompt_tokens=total_tokens,
        hit_tokens=total_hits,
        prompt_blocks=total_blocks,
        hit_blocks=hit_blocks,
        refused=refused,
    )
