"""Sparse prefix-cache retention for sliding-window and Mamba groups, shared-prefix junctions, and EAGLE
siblings caching alike."""

from __future__ import annotations

import pytest
import torch

from kvspec import KVCacheCoordinator, MambaSpec, SchedulerLimits, UnsupportedConfigurationError
from kvspec.contracts.release import DEFAULT_PROFILE, VLLM_0_23, VLLM_0_32, VLLM_0_34, ReleaseProfile
from kvspec.coordinator import shared_prefix_junction
from kvspec.managers.base import SingleTypeKVCacheManager
from tests.helpers import full_spec, make_config, make_request, schedule, sw_spec


def coordinator(
    specs: list[object],
    interval: int | None,
    *,
    use_eagle: bool = False,
    profile: ReleaseProfile = DEFAULT_PROFILE,
) -> KVCacheCoordinator:
    return KVCacheCoordinator(
        make_config(specs, 400),  # type: ignore[arg-type]
        SchedulerLimits(max_model_len=8192),
        use_eagle=use_eagle,
        prefix_cache_retention_interval=interval,
        profile=profile,
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


def test_retention_set_after_construction_applies_to_the_next_caching() -> None:
    """Same as the interval-0 case above once set on a dense coordinator; a refused value changes nothing."""
    coord = coordinator([sw_spec(16, 16)], None)
    before = coord.prefix_cache_retention_interval
    with pytest.raises(UnsupportedConfigurationError, match="multiple of scheduler_block_size"):
        coord.set_prefix_cache_retention_interval(8)
    assert coord.prefix_cache_retention_interval == before
    coord.set_prefix_cache_retention_interval(0)
    assert coord.prefix_cache_retention_interval == 0
    assert cached_blocks(coord, list(range(16 * 16))) == {14}
    dense = coordinator([sw_spec(16, 16)], 0)
    dense.set_prefix_cache_retention_interval(None)
    assert cached_blocks(dense, list(range(16 * 16))) == set(range(16))


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


def _third_request_hit(
    *, pin: bool, use_eagle: bool, interval: int | None = 0, profile: ReleaseProfile = DEFAULT_PROFILE
) -> int:
    """vLLM 0.34's junction scenario: a request primes the cache, a second one sharing 64 tokens learns
    the junction at admission, a third sharing the same 64 tokens asks for its hit."""
    coord = coordinator([full_spec(16), sw_spec(32, 16)], interval, use_eagle=use_eagle, profile=profile)
    shared = [7] * 64
    schedule(coord, make_request(coord, "0", [*shared, *[50] * 64]))
    second = make_request(coord, "1", [*shared, *[60] * 64])
    _, hit, uncached = coord.lookup_prefix(second, second.num_tokens - 1)
    if interval == 0:  # the window's group lags: the junction is at 64 (48: EAGLE drops a block everywhere)
        assert (hit, hit + uncached) == (0, 48 if use_eagle else 64)
    if pin:  # get_computed_blocks pins the junction on the request, as vLLM 0.34's Scheduler does
        schedule(coord, second)
        assert second.shared_prefix_boundary == shared_prefix_junction(hit, uncached)
    else:  # an engine that looks up its hit without pinning the junction
        blocks, num_hit, _ = coord.lookup_prefix(second, second.num_tokens - 1)
        assert coord.allocate_slots(second, second.num_tokens - num_hit, num_hit, blocks) is not None
        assert second.shared_prefix_boundary == 0
    _, hit = coord.get_computed_blocks(make_request(coord, "2", [*shared, *[70] * 64]))
    return hit


@pytest.mark.parametrize("use_eagle", [False, True])
def test_sparse_retention_keeps_the_window_at_a_shared_prefix_junction(use_eagle: bool) -> None:
    """Without the junction the window before it is dropped and the third request misses; with it the
    window is kept (with EAGLE one block lower: the block past the junction is not shared)."""
    expected = 48 if use_eagle else 64
    assert _third_request_hit(pin=False, use_eagle=use_eagle, interval=None) == expected  # dense: the ceiling
    assert _third_request_hit(pin=False, use_eagle=use_eagle) == 0
    assert _third_request_hit(pin=True, use_eagle=use_eagle) == expected


@pytest.mark.parametrize("use_eagle", [False, True])
def test_the_eagle_block_before_a_junction_is_kept_from_vllm_0_34_on(use_eagle: bool) -> None:
    """The boundaries sparse retention keeps for a 100-token prompt with a junction at 64: the replay
    boundaries, the junction and, with EAGLE under 0.34 only (B stm:519-525), the block before it."""
    found = {}
    for profile in (VLLM_0_32, VLLM_0_34):
        coord = coordinator([full_spec(16), sw_spec(32, 16)], 0, use_eagle=use_eagle, profile=profile)
        manager = coord.managers[1]
        assert isinstance(manager, SingleTypeKVCacheManager)
        found[profile.name] = sorted(manager.retention_boundaries(100, 64))
    if use_eagle:  # the replay boundary one scheduler block lower in both releases: 96 - 16
        assert found == {"vllm-0.32": [64, 80], "vllm-0.34": [48, 64, 80]}
    else:
        assert found == {"vllm-0.32": [64, 99], "vllm-0.34": [64, 99]}


@pytest.mark.parametrize(
    ("profile", "expected"),
    [(VLLM_0_34, {7, 8}), (VLLM_0_23, {11, 12})],
    ids=lambda v: getattr(v, "name", ""),
)
def test_eagle_replay_boundary_is_one_scheduler_block_lower_under_0_34(
    profile: ReleaseProfile, expected: set[int]
) -> None:
    """vLLM 0.34 (its test_hybrid_local_kv_retention_mtp_reuses_latest_boundary): EAGLE proves a boundary
    only with an aligned block past it, so a 127-token prompt's replay boundary is 96 - 32 = 64 and the
    window tail plus the EAGLE block are blocks 7 and 8; 0.23 keeps them at the resend's end (96)."""
    config = make_config([full_spec(32), sw_spec(8, 8)], 100)
    coord = KVCacheCoordinator(
        config,
        SchedulerLimits(max_model_len=8192),
        use_eagle=True,
        prefix_cache_retention_interval=0,
        profile=profile,
    )
    tokens = [i for i in range(15) for _ in range(8)] + [15] * 7
    assert cached_blocks(coord, tokens, group=1) == expected


def _mamba_third_request_hit(*, pin: bool, interval: int | None, profile: ReleaseProfile = VLLM_0_34) -> int:
    """vLLM 0.34's Marconi flow for Mamba: the second request learns the junction at admission, runs a chunk
    ending there (so its Mamba state at the junction exists), and a third request sharing the prefix asks."""
    mamba = MambaSpec(block_size=16, shapes=((16, 4),), dtypes=(torch.float32,), mamba_cache_mode="align")
    coord = KVCacheCoordinator(
        make_config([full_spec(16), mamba], 200),
        SchedulerLimits(max_model_len=8192, mamba_cache_mode="align"),
        prefix_cache_retention_interval=interval,
        profile=profile,
    )
    shared = [7] * 32
    schedule(coord, make_request(coord, "0", [*shared, *[50] * 32]))
    second = make_request(coord, "1", [*shared, *[60] * 32])
    computed, hit, uncached = coord.lookup_prefix(second, second.num_tokens - 1)
    junction = shared_prefix_junction(hit, uncached)
    if pin:
        second.shared_prefix_boundary = junction
    if junction > hit:
        assert coord.allocate_slots(second, junction - hit, hit, computed) is not None
    coord.check_invariants()
    _, hit = coord.get_computed_blocks(make_request(coord, "2", [*shared, *[70] * 32]))
    return hit


def test_mamba_sparse_retention_keeps_only_reachable_states_and_the_junction() -> None:
    """0.34 (its test_mamba_shared_prefix_reuse_under_zero_retention): dense retention reuses the shared
    prefix; interval 0 drops the junction's state unless the engine pins the junction; 0.23 caches densely."""
    assert _mamba_third_request_hit(pin=False, interval=None) == 32
    assert _mamba_third_request_hit(pin=False, interval=0) == 0
    assert _mamba_third_request_hit(pin=True, interval=0) == 32
    assert _mamba_third_request_hit(pin=False, interval=0, profile=VLLM_0_23) == 32
