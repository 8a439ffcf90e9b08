"""Synthetic traces for fleet tests: prefix families in 16-token hash blocks."""

from __future__ import annotations

from kvspec.engine.traces import TraceRequest


def family_trace(
    order: list[int],
    *,
    shared_blocks: int = 6,
    tail_blocks: int = 2,
    gap_ms: float = 1000.0,
    output_length: int = 2,
) -> list[TraceRequest]:
    """Request i belongs to family ``order[i]``: ``shared_blocks`` hash ids of its family, then
    ``tail_blocks`` of its own; one every ``gap_ms`` (so every engine is idle when one arrives)."""
    rows = []
    for i, family in enumerate(order):
        ids = tuple(1000 * (family + 1) + b for b in range(shared_blocks)) + tuple(
            100_000 + 100 * i + b for b in range(tail_blocks)
        )
        rows.append(
            TraceRequest(
                line=i,
                arrival_ms=gap_ms * i,
                input_length=16 * len(ids),
                output_length=output_length,
                hash_ids=ids,
                hash_block_size=16,
            )
        )
    return rows
