"""Prefix hits across groups (kvspec.coordinator.hit_search): equal specs searched as one, left-closed
groups first, and a fixed point where every group can serve the common prefix."""

from __future__ import annotations

from kvspec import traits_of
from kvspec.coordinator.hit_search import split_spec_groups
from tests.helpers import full_spec, ids, make_coordinator, make_request, schedule, sw_spec


def test_equal_specs_are_one_search_and_left_closed_groups_go_first() -> None:
    specs = [sw_spec(32), full_spec(), sw_spec(64), full_spec(), sw_spec(32)]
    coord = make_coordinator(specs, 64)
    groups = split_spec_groups(coord.specs, [traits_of(s) for s in specs], coord.managers, frozenset({2}))
    assert [g.group_ids for g in groups] == [(1, 3), (0, 4), (2,)]
    assert [g.left_closed for g in groups] == [True, False, False]
    assert [g.use_eagle for g in groups] == [False, False, True]
    assert [g.block_size for g in groups] == [16, 16, 16]


def test_hybrid_hit_is_the_longest_prefix_every_group_serves() -> None:
    """Full attention and a 32-token window (block 16): a request sharing 6 blocks of a finished one hits
    96 tokens; the window group holds nulls where attention never reads again. Once a window block
    inside the shared prefix is evicted, the window can serve only up to it and full attention's hit is
    cut to the same length (the fixed point)."""
    coord = make_coordinator([full_spec(), sw_spec(32)], 64)
    shared = list(range(1, 97))
    first = make_request(coord, "a", [*shared, *range(500, 532)])
    schedule(coord, first)
    full_blocks, window_blocks = (list(g) for g in coord.get_blocks("a").blocks)
    coord.free(first)

    second = make_request(coord, "b", [*shared, *range(900, 940)])
    computed, hit = coord.get_computed_blocks(second)
    assert hit == 96
    assert ids(computed.blocks[0]) == ids(full_blocks[:6])
    null = coord.block_pool.null_block
    window_hit = computed.blocks[1]
    assert len(window_hit) == 6 and all(b is null for b in window_hit[:4])
    assert ids(window_hit[4:]) == ids(window_blocks[4:6])

    coord.evict_blocks([window_blocks[4].block_id])  # the window's block for tokens 64..79
    computed, hit = coord.get_computed_blocks(second)
    assert hit == 64
    assert ids(computed.blocks[0]) == ids(full_blocks[:4])
    assert ids(computed.blocks[1][2:]) == ids(window_blocks[2:4])


def test_hit_never_covers_the_last_token() -> None:
    """A prompt of exactly three cached blocks hits two: the last token's logits must be computed."""
    coord = make_coordinator([full_spec()], 16)
    tokens = list(range(1, 49))
    schedule(coord, make_request(coord, "a", tokens))
    coord.free_request_id("a")
    _, hit = coord.get_computed_blocks(make_request(coord, "b", tokens))
    assert hit == 32
