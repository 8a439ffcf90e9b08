"""Each built-in router's rule on hand-made fleet states; the registry's door checks; the kit."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvspec.blocks.event_wire import encode_event_batch
from kvspec.engine.instance import InstanceLoad
from kvspec.errors import RouterAccessError, RouterError, RoutingError
from kvspec.fleet import RouterContext, RouteRequest, register_router, resolve_router, router_names
from kvspec.fleet.kit import check_router
from kvspec.fleet.routers import (
    CacheAware,
    Exact,
    HybridPrefix,
    KvCost,
    LongestPrefix,
    PowerOfTwo,
    PrecisePrefix,
    _held_depth,
)
from kvspec.fleet.routing import FleetView
from tests.unit.fleet.test_index_and_wire import _state, _stored

H = [bytes([i]) * 4 for i in range(16)]


def load(i: int, *, waiting: int = 0, running: int = 0, prefill: int = 0, active: int = 0) -> InstanceLoad:
    return InstanceLoad(
        index=i,
        waiting=waiting,
        running=running,
        prefill_tokens=prefill,
        active_blocks=active,
        num_blocks=100,
    )


class View:
    def __init__(self, loads: Sequence[InstanceLoad], hits: Sequence[int] = ()) -> None:
        self._loads = list(loads)
        self._hits = list(hits)

    @property
    def num_instances(self) -> int:
        return len(self._loads)

    def loads(self) -> Sequence[InstanceLoad]:
        return self._loads

    def cache_hit(self, instance: int, request: RouteRequest) -> int:
        return self._hits[instance]


def req(blocks: int, tokens: int | None = None, first: int = 0) -> RouteRequest:
    return RouteRequest(
        request_id="r",
        arrival_ms=0.0,
        num_tokens=tokens or blocks * 16,
        block_hashes=H[first : first + blocks],
    )


def ctx(n: int = 2, seed: int = 0, **options: float) -> RouterContext:
    return RouterContext(num_instances=n, block_size=16, seed=seed, options=options)


def test_the_builtins_are_registered_and_pass_the_kit() -> None:
    assert router_names() == (
        "cache_aware",
        "consistent_hash",
        "exact",
        "exact_prefix",
        "hybrid_prefix",
        "kv_cost",
        "least_loaded",
        "longest_prefix",
        "power_of_two",
        "precise_prefix",
        "random",
        "round_robin",
    )
    for name in router_names():
        result = check_router(name)
        assert len(result.choices) == 96 and set(result.choices) <= {0, 1, 2, 3}
    assert resolve_router("exact").reads == resolve_router("exact_prefix").reads == {"loads", "cache"}
    assert resolve_router("precise_prefix").reads == {"loads", "kv_events"}
    assert resolve_router("longest_prefix").reads == {"cache"}


def test_cache_aware_follows_its_history_above_the_threshold_and_balances_otherwise() -> None:
    router = CacheAware(ctx(3))
    idle = View([load(0), load(1), load(2)])
    assert router.route(req(4), idle) == 0  # a miss: least loaded, first on ties; history now on 0
    busy0 = View([load(0, running=5), load(1), load(2)])
    assert router.route(req(4, tokens=100), busy0) == 0  # 64/100 matched > 0.3: history wins over load
    assert router.route(req(1, tokens=100), busy0) == 1  # 16/100 = 0.16 <= 0.3: least loaded
    skewed = View([load(0, running=100), load(1, running=10), load(2, running=30)])
    assert router.route(req(4), skewed) == 1  # 100 - 10 > 64 and 100 > 1.5 * 10: shortest queue first
    mild = View([load(0, running=100), load(1, running=70), load(2, running=60)])
    # 100 - 60 <= 64: not imbalanced, the match decides: 0 and 1 both hold the prefix, 1 is less loaded
    # (instance 2, the least loaded, holds nothing).
    assert router.route(req(4), mild) == 1


def test_cache_aware_forgets_the_oldest_blocks_past_its_tree_size() -> None:
    router = CacheAware(ctx(2, max_tree_size=3 * 16))
    view = View([load(0), load(1)])
    router.route(req(2), view)  # blocks 0, 1 on instance 0
    router.route(req(2, first=5), View([load(0, running=1), load(1)]))  # blocks 5, 6 on instance 1
    router.route(
        req(2, first=8), View([load(0), load(1, running=1)])
    )  # 8, 9 on 0: 0 and 1 forgotten... 0 first
    assert router.route(req(2, tokens=32), View([load(0, running=1), load(1)])) == 1  # block 0 forgotten on 0


def test_kv_cost_is_prefill_left_after_the_overlap_plus_active_blocks() -> None:
    """Instance 0 holds 4 of the 6 blocks but 5 more active blocks: cost 0: (0 + 96)/16 - 4 + 5 + 6 = 13;
    instance 1: 96/16 + 0 + 6 = 12, so 1 wins; with credit 2, instance 0 costs 9 and wins."""
    loads = [load(0, active=5), load(1)]
    payload = encode_event_batch([_stored(H[:4])], ts=0)
    for credit, expected in ((1.0, 1), (2.0, 0)):
        router = KvCost(ctx(overlap_score_credit=credit))
        router.on_kv_events(0, payload)
        assert router.route(req(6), View(loads)) == expected
    scaled = KvCost(ctx(prefill_load_scale=0.0))  # only decode load counts: the emptier instance
    assert scaled.route(req(6), View([load(0, prefill=10_000), load(1, active=1)])) == 0


def test_kv_cost_charges_a_prefix_its_requests_in_flight_share_once() -> None:
    """Dynamo's potential active blocks: an instance's active blocks plus the request's full blocks that no
    request routed there and not yet done holds (``new_blocks``). Four-block prompts of 64 tokens."""

    def prompt(request_id: str) -> RouteRequest:
        return RouteRequest(request_id=request_id, arrival_ms=0.0, num_tokens=64, block_hashes=H[:4])

    router = KvCost(ctx())
    assert router.route(prompt("a"), View([load(0), load(1, active=5)])) == 0  # 4+0+4 = 8 vs 4+5+4 = 13
    # a's four blocks are held on 0; b asks for the same four: 4+4+0 = 8 against 4+1+4 = 9 (charging
    # them again, 12 against 9, would send b to 1).
    held = [load(0, active=4), load(1, active=1)]
    assert router.route(prompt("b"), View(held)) == 0
    router.on_request_done(0, "a")
    assert router.route(prompt("c"), View(held)) == 0  # b is still in flight there
    router.on_request_done(0, "b")
    router.on_request_done(0, "c")
    router.on_request_done(0, "never-routed")  # a request it does not know is ignored
    assert router.route(prompt("d"), View(held)) == 1  # nothing in flight on 0 now: 12 against 9


def _chained(blocks: Sequence[int]) -> list[bytes]:
    return [repr(tuple(blocks[: i + 1])).encode() for i in range(len(blocks))]


@given(
    st.lists(st.lists(st.integers(0, 2), max_size=6), max_size=5),
    st.lists(st.integers(0, 2), max_size=8),
)
def test_the_held_depth_counts_every_held_block_of_a_chained_prompt(
    in_flight: list[list[int]], prompt: list[int]
) -> None:
    held: dict[bytes, int] = {}
    for blocks in in_flight:
        for h in _chained(blocks):
            held[h] = held.get(h, 0) + 1
    hashes = _chained(prompt)
    assert _held_depth(hashes, held) == sum(h in held for h in hashes)


def test_exact_takes_its_overlap_from_the_instances_caches() -> None:
    loads = [load(0, active=5), load(1)]
    assert Exact(ctx(overlap_score_credit=2.0)).route(req(6), View(loads, hits=[64, 0])) == 0
    assert Exact(ctx(overlap_score_credit=2.0)).route(req(6), View(loads, hits=[16, 0])) == 1


def test_longest_prefix_follows_the_longest_hit_whatever_the_load() -> None:
    router = LongestPrefix(ctx(3))
    swamped = [load(0, waiting=500, prefill=10**6), load(1), load(2)]
    assert router.route(req(6), View(swamped, hits=[48, 32, 0])) == 0  # the hit, not the load
    assert router.route(req(6), View(swamped, hits=[16, 32, 32])) == 1  # ties: the lowest index
    assert router.route(req(6), View(swamped, hits=[0, 0, 0])) == 0  # a miss everywhere is a tie too
    picks = {
        LongestPrefix(ctx(3, seed=s, random_ties=1.0)).route(req(6), View(swamped, hits=[0, 32, 32]))
        for s in range(20)
    }
    assert picks == {1, 2}  # at random among the tied, never off them
    with pytest.raises(RouterError, match="random_ties must be 0 or 1"):
        LongestPrefix(ctx(random_ties=0.5))


def test_cost_ties_break_at_random_under_the_seed_and_temperature_samples() -> None:
    picks = {KvCost(ctx(4, seed=s)).route(req(2), View([load(i) for i in range(4)])) for s in range(20)}
    assert len(picks) > 1
    again = [KvCost(ctx(4, seed=3)).route(req(2), View([load(i) for i in range(4)])) for _ in range(3)]
    assert len(set(again)) == 1
    warm = KvCost(ctx(2, seed=1, temperature=1.0))
    chosen = [warm.route(req(2), View([load(0, active=1), load(1, active=2)])) for _ in range(50)]
    assert 0 < chosen.count(1) < chosen.count(0)
    with pytest.raises(RouterError, match="temperature must be >= 0"):
        KvCost(ctx(temperature=-1.0))


def test_precise_prefix_weights_prefix_usage_and_queue() -> None:
    router = PrecisePrefix(ctx(2))
    router.on_kv_events(1, encode_event_batch([_stored(H[:4])], ts=0))
    assert router.route(req(4), View([load(0), load(1)])) == 1  # prefix 3 * 1.0 beats nothing
    crowded = View(
        [
            load(0),
            InstanceLoad(index=1, waiting=5, running=0, prefill_tokens=0, active_blocks=100, num_blocks=100),
        ]
    )
    assert router.route(req(4), crowded) == 0  # full and queued: 3 + 0 + 0 < 0 + 2 + 2


def test_hybrid_prefix_scores_the_prefix_every_group_can_serve() -> None:
    """Instance 0 holds six attention blocks and no Mamba state; instance 1 four, with the state at block 4.
    precise_prefix sees attention only and picks 0; hybrid_prefix sees that 0 can serve no hit and picks 1.
    On attention alone (no state group) both pick 0."""
    events = [
        encode_event_batch([_stored(H[:6]), _state([H[0]], group=1)], ts=0),
        encode_event_batch([_stored(H[:4]), _state([H[3]], group=1)], ts=0),
    ]
    hybrid, precise = HybridPrefix(ctx(2)), PrecisePrefix(ctx(2))
    for router in (hybrid, precise):
        for instance, payload in enumerate(events):
            router.on_kv_events(instance, payload)
    view = View([load(0), load(1)])
    assert hybrid.index.hybrid_overlap(H[:6], 16) == [1, 4]
    assert (hybrid.route(req(6), view), precise.route(req(6), view)) == (1, 0)
    plain = HybridPrefix(ctx(2))
    plain.on_kv_events(0, encode_event_batch([_stored(H[:6])], ts=0))
    plain.on_kv_events(1, encode_event_batch([_stored(H[:4])], ts=0))
    assert plain.route(req(6), view) == 0


def test_power_of_two_takes_the_less_loaded_of_its_pair() -> None:
    router = PowerOfTwo(ctx(4, seed=7))
    rng = random.Random(7)
    loads = [load(i, running=r) for i, r in enumerate([3, 1, 4, 2])]
    for _ in range(20):
        a, b = rng.sample(range(4), 2)
        expected = b if loads[b].requests < loads[a].requests else a
        assert router.route(req(1), View(loads)) == expected


def test_registration_refuses_what_cannot_route() -> None:
    class NoRoute:
        def __init__(self, context: RouterContext) -> None:
            pass

    class NoEvents:
        def __init__(self, context: RouterContext) -> None:
            pass

        def route(self, request: RouteRequest, fleet: FleetView) -> int:
            return 0

    with pytest.raises(RouterError, match="must be dotted lower-case words"):
        register_router("Bad Name", NoEvents)
    with pytest.raises(
        RouterError, match="declares it reads 'gpu_memory'; a router may read only cache, kv_events, loads"
    ):
        register_router("test.r", NoEvents, reads=("gpu_memory",))
    with pytest.raises(RouterError, match="NoRoute, which has no route"):
        register_router("test.r", NoRoute)  # type: ignore[arg-type]
    with pytest.raises(
        RouterError, match="declares it reads 'kv_events' but its NoEvents has no on_kv_events"
    ):
        register_router("test.r", NoEvents, reads=("kv_events",))
    with pytest.raises(RouterError, match="already registered"):
        register_router("round_robin", NoEvents)
    with pytest.raises(
        RouterError,
        match=r"'cache_aware' takes no option 'cache_treshold'; its options: cache_threshold \(default 0.3\)",
    ):
        CacheAware(ctx(cache_treshold=0.5))
    assert "test.r" not in router_names()


def test_the_kit_catches_a_missing_instance_an_undeclared_read_and_a_router_without_its_seed() -> None:
    class Wild:
        def __init__(self, context: RouterContext) -> None:
            self.n = context.num_instances

        def route(self, request: RouteRequest, fleet: FleetView) -> int:
            return -1 if request.request_id == "kit-5" else 0

    class Peeks:
        def __init__(self, context: RouterContext) -> None:
            pass

        def route(self, request: RouteRequest, fleet: FleetView) -> int:
            return min(range(fleet.num_instances), key=lambda i: fleet.loads()[i].requests)

    class Unseeded:
        def __init__(self, context: RouterContext) -> None:
            self.n = context.num_instances

        def route(self, request: RouteRequest, fleet: FleetView) -> int:
            return random.randrange(self.n)

    register_router("test.wild", Wild)
    register_router("test.unseeded", Unseeded)
    with pytest.raises(RoutingError, match=r"'test.wild' sent request kit-5 to instance -1"):
        check_router("test.wild")
    with pytest.raises(RouterAccessError, match="did not declare reads=\\('loads',\\)"):
        check_router(register_router("test.peeks", Peeks))
    with pytest.raises(
        RoutingError, match=r"'test.unseeded' is not deterministic under seed 0: request kit-\d+"
    ):
        check_router("test.unseeded")
    assert check_router(register_router("test.peeks", Peeks, reads=("loads",), replace=True)).checks
