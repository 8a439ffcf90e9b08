"""A router added in one module (issue 50's proof): ``consistent_hash``, and the options every router
declares through the one registry form."""

from __future__ import annotations

import pytest

from kvspec.errors import OptionValueError, RouterError, RouterOptionError
from kvspec.fleet import ROUTERS, RouterContext, RouteRequest
from kvspec.fleet.consistent_hash import ConsistentHash
from kvspec.fleet.kit import check_router
from kvspec.fleet.registry import build_router, resolve_router
from tests.unit.fleet.test_routers import View, ctx, load


def _keyed(*blocks: bytes) -> RouteRequest:
    return RouteRequest(request_id="r", arrival_ms=0.0, num_tokens=16 * len(blocks), block_hashes=blocks)


def test_a_shared_prefix_lands_on_one_instance_whatever_the_load() -> None:
    router = ConsistentHash(ctx(4))
    idle, busy = View([load(i) for i in range(4)]), View([load(i, running=50 * i) for i in range(4)])
    chosen = set()
    for k in range(40):
        first = k.to_bytes(8, "big")
        chosen.add(router.route(_keyed(first, b"a"), idle))
        # The same block 0, another prompt after it, other loads: the same instance.
        assert router.route(_keyed(first, b"b", b"c"), busy) == router.route(_keyed(first, b"a"), idle)
    assert len(chosen) == 4


def test_keys_spread_over_the_instances_and_growing_the_fleet_moves_about_one_in_n() -> None:
    four, five = ConsistentHash(ctx(4, virtual_nodes=128)), ConsistentHash(ctx(5, virtual_nodes=128))
    view4, view5 = View([load(i) for i in range(4)]), View([load(i) for i in range(5)])
    keys = [_keyed(k.to_bytes(8, "big")) for k in range(2000)]
    before = [four.route(r, view4) for r in keys]
    after = [five.route(r, view5) for r in keys]
    counts = [before.count(i) for i in range(4)]
    assert min(counts) > 0.6 * len(keys) / 4
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    # A consistent ring moves keys only to the new instance, about a fifth of them.
    assert all(a == 4 for _, a in moved)
    assert 0.1 * len(keys) < len(moved) < 0.3 * len(keys)


def test_prefix_blocks_decides_which_blocks_key_the_request() -> None:
    """Prompts that share block 0 only: one instance when block 0 keys them, spread when two blocks do."""
    one, two = ConsistentHash(ctx(8, prefix_blocks=1)), ConsistentHash(ctx(8, prefix_blocks=2))
    view = View([load(i) for i in range(8)])
    variants = [_keyed(b"first", bytes([k])) for k in range(40)]
    assert len({one.route(r, view) for r in variants}) == 1
    assert len({two.route(r, view) for r in variants}) > 2


def test_its_options_are_declared_once_and_checked_in_the_registry_s_words() -> None:
    entry = ROUTERS.entry("consistent_hash")
    assert [(o.name, o.kind, o.default) for o in entry.options] == [
        ("prefix_blocks", int, 1),
        ("virtual_nodes", int, 64),
    ]
    spec = resolve_router("consistent_hash")
    with pytest.raises(
        RouterOptionError, match=r"'consistent_hash': option 'prefix_blocks' must be a whole number, got 1\.5"
    ):
        build_router(spec, ctx(2, prefix_blocks=1.5))
    with pytest.raises(
        OptionValueError, match=r"takes no option 'blocks'; its options: prefix_blocks \(default 1\)"
    ):
        build_router(spec, ctx(2, blocks=2))
    with pytest.raises(RouterError, match="prefix_blocks and virtual_nodes must be >= 1, got 0 and 64"):
        build_router(spec, ctx(2, prefix_blocks=0))
    # The same wording from another router's options (one place checks them all).
    with pytest.raises(RouterOptionError, match="'kv_cost': option 'temperature' must be a number, got True"):
        build_router(
            resolve_router("kv_cost"),
            RouterContext(num_instances=2, block_size=16, options={"temperature": True}),
        )


def test_it_passes_the_kit() -> None:
    result = check_router("consistent_hash")
    assert len(result.choices) == 96 and len(set(result.choices)) > 1
