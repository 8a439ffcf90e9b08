"""Prefix-cache statistics and KV events annotated with each group's declared kind (kvspec.coordinator.stats)."""

from __future__ import annotations

import logging

import pytest

from kvspec import BlockRemoved, BlockStored, SpecTraits
from kvspec.coordinator.stats import PrefixCacheStats, annotate_events, group_event_metadata


def _stored(group_idx: int | None) -> BlockStored:
    return BlockStored(
        block_hashes=[b"h"],
        parent_block_hash=None,
        token_ids=[1, 2],
        block_size=2,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=group_idx,
    )


def test_stats_count_tokens_apart_for_preempted_requests() -> None:
    stats = PrefixCacheStats()
    assert stats.hit_rate == 0.0
    stats.record(100, 40, preempted=False)
    stats.record(50, 10, preempted=False)
    stats.record(30, 30, preempted=True)
    assert (stats.requests, stats.queries, stats.hits) == (2, 150, 50)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 30, 30)
    assert stats.hit_rate == pytest.approx(50 / 150)


def test_event_metadata_prefers_the_declared_kind() -> None:
    traits = [SpecTraits(kind="sliding_window", event_sliding_window=128), SpecTraits(), SpecTraits()]
    meta = group_event_metadata(traits, [None, "acme.ring", None])
    assert [(m.kind, m.sliding_window) for m in meta] == [
        ("sliding_window", 128),
        ("acme.ring", None),
        ("unknown", None),
    ]
    with pytest.raises(ValueError):
        group_event_metadata(traits, [None])  # one identifier per group


def test_annotate_events_copies_stored_events_with_their_group_kind() -> None:
    meta = group_event_metadata(
        [SpecTraits(kind="full_attention"), SpecTraits(kind="w", event_sliding_window=8)], [None, None]
    )
    removed = BlockRemoved(block_hashes=[b"h"], medium="GPU", group_idx=1)
    original = _stored(1)
    out = annotate_events([original, removed, _stored(None)], meta)
    assert out[0] is not original and original.kv_cache_spec_kind is None  # events are values: copied
    assert (out[0].kv_cache_spec_kind, out[0].kv_cache_spec_sliding_window) == ("w", 8)  # type: ignore[union-attr]
    assert out[0].token_ids == [1, 2] and out[0].group_idx == 1  # type: ignore[union-attr]
    assert out[1] is removed and out[2].kv_cache_spec_kind is None  # type: ignore[union-attr]


def test_annotate_events_warns_about_a_foreign_group(caplog: pytest.LogCaptureFixture) -> None:
    meta = group_event_metadata([SpecTraits(kind="full_attention")], [None])
    log = logging.getLogger("tests.stats")
    with caplog.at_level(logging.WARNING, logger="tests.stats"):
        out = annotate_events([_stored(3)], meta, log)
    assert out[0].kv_cache_spec_kind is None  # type: ignore[union-attr]
    assert "Group index `3` not in KV cache metadata" in caplog.text
