"""Prefix-cache statistics and KV events annotated with each group's declared kind and window."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.blocks.events import BlockStored, KVCacheEvent
from kvspec.contracts.traits import SpecTraits, event_kind

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class PrefixCacheStats:
    """Prefix-cache counters since the last ``make_prefix_cache_stats`` (tokens, not blocks)."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    reset: bool = False

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupEventMetadata:
    """What BlockStored events of one group carry: its declared kind and sliding window (tokens)."""

    kind: str
    sliding_window: int | None


def group_event_metadata(
    traits: Sequence[SpecTraits], identifiers: Sequence[str | None]
) -> tuple[GroupEventMetadata, ...]:
    """Per group: the kind from its traits (else its registration's identifier) and its event window."""
    return tuple(
        GroupEventMetadata(kind=event_kind(t, ident), sliding_window=t.event_sliding_window)
        for t, ident in zip(traits, identifiers, strict=True)
    )


def annotate_events(
    events: Sequence[KVCacheEvent],
    metadata: Sequence[GroupEventMetadata],
    log: logging.Logger | None = None,
) -> list[KVCacheEvent]:
    """``events`` with every BlockStored carrying its group's kind and window; a group index outside
    ``metadata`` is warned about on ``log`` (kvspec's logger by default) and the event left as it is."""
    out: list[KVCacheEvent] = []
    for event in events:
        if isinstance(event, BlockStored) and event.group_idx is not None:
            if 0 <= event.group_idx < len(metadata):
                meta = metadata[event.group_idx]
                if (
                    event.kv_cache_spec_kind == meta.kind
                    and event.kv_cache_spec_sliding_window == meta.sliding_window
                ):
                    out.append(event)  # born annotated (BlockPool.stored_event_kinds)
                    continue
                event = dataclasses.replace(
                    event, kv_cache_spec_kind=meta.kind, kv_cache_spec_sliding_window=meta.sliding_window
                )
            else:
                (log or logger).warning("Group index `%s` not in KV cache metadata", event.group_idx)
        out.append(event)
    return out
