"""Sparse prefix-cache retention for sliding-window groups, and EAGLE siblings caching alike."""

from __future__ import annotations

import pytest

from kvspec import KVCacheCoordinator, SchedulerLimits, UnsupportedConfigurationError
from tests.helpers import full_spec, make_config, make_request, schedule, sw_spec


def coordinator(specs: list[object], interval: int | None, *, use_eagle: bool = False) -> KVCacheCoordinator:
    return KVCacheCoordinator(
        make_config(specs, 400),  # type: ignore[arg-type]
        SchedulerLimits(max_model_len=8192),
        use_eagle=use_eagle,
        prefix_cache_retention_interval=interval,
    )


def cached_blocks(coord: KVCacheCoordinator, tokens: list[int], group: int = 0) -> set[int]:
    request = make_request(coord, "r", tokens)
    assert coord.allocate_slots(request, len(tokens)) is not None
    pool = coord.block_pool
    return {i for i, h in enumerate(request.block_hashes) if pool.get_cached_block(h, [group]) is not None}


def test_dense_by_default_caches_every_full_block() -> None:
    coord = coordinator([sw_spec(16, 16)], None)
    assert cached_blocks(coord, list(range(16 * 16))) == set(range(16))


def test_interval_zero_keeps_only_the_prompt_replay_tail() -> None:
    # window 16 = one block; a replay hits at most at token 255 -> boundary 240 -> the block before it
    coord = coordinator([sw_spec(16, 16)], 0)
    assert cached_blocks(coord, list(range(16 * 16))) == {14}


def test_interval_keeps_one_tail_per_segment_plus_the_replay_tail() -> None:
    # window 32 -> a hit needs 2 blocks; 64 tokens = 4 blocks a segment -> blocks 2,3 of each segment;
    # 251 tokens: a replay hits at most 250 -> boundary 240 -> blocks 13, 14
    coord = coordinator([sw_spec(32, 16)], 64)
    assert cached_blocks(coord, list(range(251))) == {2, 3, 6, 7, 10, 11, 13, 14}
    replay = make_request(coord, "replay", list(range(251)))
    _, hit = coord.get_computed_blocks(replay)
    assert hit == 240
    shorter = make_request(coord, "shorter", list(range(200)))  # its hits land on segment ends: 192
    _, hit = coord.get_computed_blocks(shorter)
    assert hit == 192


@pytest.mark.parametrize(
    ("specs", "interval", "message"),
    [
        ([full_spec(16)], 64, "no sliding-window or Mamba KV cache group"),
        ([sw_spec(32, 16)], -16, "non-negative int"),
        ([full_spec(32), sw_spec(32, 16)], 48, "multiple of scheduler_block_size \\(32\\)"),
    ],
)
def test_bad_intervals_are_refused(specs: list[object], interval: int, message: str) -> None:
    with pytest.raises(UnsupportedConfigurationError, match=message):
        coordinator(specs, interval)


def test_interval_zero_is_accepted_where_retention_has_nothing_to_thin() -> None:
    """vLLM 0.34 plans 0 into every configuration: a full-attention model caches densely with it."""
    coord = coordinator([full_spec(16)], 0)
    first = make_request(coord, "first", list(range(100)))
    schedule(coord, first)
    coord.free(first)
    _, hit = coord.get_computed_blocks(make_request(coord, "again", list(range(100))))
    assert hit == 96


def test_eagle_group_makes_its_same_spec_siblings_eagle() -> None:
    from kvspec import KVCacheConfig, KVCacheGroupSpec

    window = sw_spec(8, 8)
    config = KVCacheConfig(
        num_blocks=100,
        kv_cache_tensors=(),
        kv_cache_groups=(
            KVCacheGroupSpec(layer_names=("full",), kv_cache_spec=full_spec(32)),
            KVCacheGroupSpec(layer_names=("swa",), kv_cache_spec=window),
            KVCacheGroupSpec(layer_names=("mtp",), kv_cache_spec=window, is_eagle_group=True),
        ),
    )
    coord = KVCacheCoordinator(config, SchedulerLimits(max_model_len=8192), use_eagle=True)
    assert [m.use_eagle for m in coord.managers] == [False, True, True]  # type: ignore[attr-defined]
    request = make_request(coord, "r", [t for t in range(9) for _ in range(8)])
    assert coord.allocate_slots(request, 72) is not None
    # the lookahead block past the 32-token boundary (block 4) is cached in both siblings
    assert coord.block_pool.get_cached_block(request.block_hashes[4], [1, 2]) is not None
