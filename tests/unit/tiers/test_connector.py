"""How an engine reaches its tiers: the hit search per group family, loads, write-through stores, the
transfer time charged, and the timed replay with a host tier (a prompt the GPU lost is loaded back)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.contracts.spec import SchedulerLimits
from kvspec.engine.replay import replay_coordinator
from kvspec.engine.timed_replay import replay_timed
from kvspec.engine.traces import TraceRequest, parse_line
from kvspec.errors import TierConfigError
from kvspec.tiers import (
    GroupOffload,
    HostTier,
    StorePlan,
    TierConnector,
    TierRequest,
    TierSettings,
    TierSlot,
    TransferModel,
    offload_key,
)
from kvspec.tiers.connector import window_blocks
from tests.helpers import full_spec, make_config

_HASHES = [bytes([i]) * 8 for i in range(10)]


def _connector(groups: list[GroupOffload], held: dict[int, set[int]], capacity: int = 64) -> TierConnector:
    """A connector over one host tier holding, per group index, the blocks in ``held``."""
    tier = HostTier(capacity)
    filler = TierRequest("filler")
    for group in groups:
        per = group.block_size // 16
        keys = [
            offload_key(_HASHES[(b + 1) * per - 1], group.index) for b in sorted(held.get(group.index, ()))
        ]
        plan = tier.prepare_store(keys, filler)
        assert plan is not None
        tier.complete_store(plan.keys_to_store, filler)
    return TierConnector(groups, [TierSlot(name="host", tier=tier, link=TransferModel())], hash_block_size=16)


def _full(index: int = 0, block: int = 16) -> GroupOffload:
    return GroupOffload(index=index, family="full", block_size=block, block_bytes=100)


def test_a_full_attention_hit_runs_from_the_gpu_hit_to_the_first_missing_block() -> None:
    connector = _connector([_full()], {0: {0, 1, 2, 3, 5, 6}})
    assert connector.find_hit("r", _HASHES, 32, 159) == 32  # blocks 2 and 3; block 4 is missing
    everything = _connector([_full()], {0: set(range(10))})
    assert everything.find_hit("r", _HASHES, 32, 159) == 112  # at most num_tokens - 1: 9 whole blocks
    assert everything.find_hit("r", _HASHES, 32, 40) == 0  # no whole block past the GPU hit fits


def test_a_window_group_needs_the_blocks_inside_its_window_at_the_hit_end() -> None:
    window = GroupOffload(
        index=1, family="window", block_size=16, block_bytes=100, window_blocks=window_blocks(49, 16)
    )
    assert window.window_blocks == 3  # cdiv(49 - 1, 16): vLLM's sliding-window hit
    connector = _connector([_full(), window], {0: set(range(10)), 1: set(range(10)) - {2, 6}})
    # ends 144, 128, 112 need block 6; 96 needs 3, 4, 5: held (block 2 lies outside its window)
    assert connector.find_hit("r", _HASHES, 0, 159) == 96


def test_a_state_group_needs_the_state_at_the_hit_end() -> None:
    state = GroupOffload(index=1, family="state", block_size=32, block_bytes=100, window_blocks=1)
    connector = _connector([_full(), state], {0: set(range(10)), 1: {1, 3}})
    assert connector.find_hit("r", _HASHES, 0, 159) == 128  # states at 64 and 128 tokens held
    connector = _connector([_full(), state], {0: set(range(10)), 1: {1}})
    assert connector.find_hit("r", _HASHES, 0, 159) == 64


def test_a_family_left_out_gives_no_hit_beyond_the_gpu() -> None:
    window = GroupOffload(
        index=1, family="window", block_size=16, block_bytes=100, window_blocks=2, offloaded=False
    )
    connector = _connector([_full(), window], {0: set(range(10)), 1: set(range(10))})
    assert connector.find_hit("r", _HASHES, 0, 159) == 0


def test_loads_pin_and_count_and_stores_write_through_the_new_blocks() -> None:
    connector = _connector([_full()], {0: {0, 1, 2}})
    assert connector.find_hit("r", _HASHES, 0, 159) == 48
    ms = connector.begin_load("r", first_admission=True)
    assert ms == pytest.approx(TransferModel().load_ms(300))
    stats = connector.stats
    assert (stats.loaded_blocks, stats.loaded_bytes, stats.first_hit_tokens) == (
        {"host": 3},
        {"host": 300},
        {"host": 48},
    )
    connector.admitted("r", 48)
    connector.end_step([("r", _HASHES, 48 + 64)])  # computed 7 blocks: 3 loaded, 4 new
    assert stats.stored_blocks == {"host": 4}
    tier = connector.slots[0].tier
    assert tier.num_blocks == 7
    connector.finished("r")


def test_bad_connector_settings_are_named() -> None:
    with pytest.raises(TierConfigError, match="not a multiple of the hash block"):
        TierConnector(
            [_full(block=24)],
            [TierSlot(name="host", tier=HostTier(4), link=TransferModel())],
            hash_block_size=16,
        )
    with pytest.raises(TierConfigError, match="family 'ring'"):
        GroupOffload(index=0, family="ring", block_size=16, block_bytes=1)
    with pytest.raises(TierConfigError, match="offload must name"):
        TierSettings(host_bytes=1, offload=("full", "mla"))


def _request(line: int, ids: list[int], at_ms: float) -> TraceRequest:
    return parse_line(
        {
            "hash_ids": ids,
            "hash_block_size": 16,
            "input_length": len(ids) * 16,
            "output_length": 1,
            "timestamp": at_ms,
        },
        line=line,
        where=f"line {line}",
    )


def _replay(tiers: TierSettings | None) -> tuple[int, int, float]:
    # 12 usable blocks of 16 tokens: two 8-block prompts evict the first prompt from the GPU.
    coordinator = replay_coordinator(make_config([full_spec(16)], 13), SchedulerLimits(max_model_len=1024))
    stats = replay_timed(
        [
            _request(1, [1, 2, 3, 4], 0.0),
            _request(2, list(range(100, 108)), 1000.0),
            _request(3, list(range(200, 208)), 2000.0),
            _request(4, [1, 2, 3, 4], 3000.0),
        ],
        coordinator,
        max_num_batched_tokens=256,
        max_num_seqs=4,
        tiers=tiers,
    )
    coordinator.check_invariants()
    loaded = 0 if stats.tiers is None else stats.tiers.loaded_bytes.get("host", 0)
    return stats.first_admission_hit_tokens, loaded, stats.ttft_ms[-1]


def test_a_prompt_the_gpu_lost_is_loaded_back_from_host_memory() -> None:
    block_bytes = full_spec(16).page_size_bytes
    assert _replay(None)[:2] == (0, 0)
    hit, loaded, ttft = _replay(TierSettings(host_bytes=64 * block_bytes))
    assert (hit, loaded) == (48, 3 * block_bytes)  # three whole blocks before the last token
    slow = TransferModel(load_gb_per_s=1e-6, load_latency_us=0.0)  # 1 kB/s: the load dominates
    _, _, slow_ttft = _replay(TierSettings(host_bytes=64 * block_bytes, host_link=slow))
    assert slow_ttft - ttft == pytest.approx(
        slow.load_ms(3 * block_bytes) - TransferModel().load_ms(3 * block_bytes)
    )


def test_host_memory_below_one_block_is_refused() -> None:
    with pytest.raises(TierConfigError, match="holds no block of this model"):
        _replay(TierSettings(host_bytes=10))


def test_a_fleet_shares_one_pool_and_publishes_host_blocks_as_cpu_events() -> None:
    """Two instances behind round robin, each with host memory, sharing a pool: a family's second request
    lands on the other instance, whose GPU and host never saw the prefix, and loads it from the pool; the
    host tier's stores reach a precise_prefix router as "CPU" events."""
    from kvspec.fleet.fleet import FleetSettings, run_fleet
    from tests.unit.fleet.fleet_helpers import family_trace

    block_bytes = full_spec(16).page_size_bytes
    config = make_config([full_spec(16)], 200)
    tiers = TierSettings(host_bytes=100 * block_bytes, pool_bytes=400 * block_bytes)
    trace = family_trace([0, 0], shared_blocks=6, tail_blocks=2)
    report = run_fleet(
        trace, config, SchedulerLimits(max_model_len=1024), FleetSettings(num_instances=2, tiers=tiers)
    )
    first, second = report.instances
    assert first["pool_stored_bytes"] > 0 and second["gpu_reused_tokens"] == 0
    assert second["pool_reused_tokens"] == 6 * 16 and second["host_reused_tokens"] == 0
    assert report.total["reused_tokens"] == 6 * 16

    settings = FleetSettings(
        num_instances=2, tiers=TierSettings(host_bytes=100 * block_bytes), router="precise_prefix"
    )
    from kvspec.fleet.registry import build_router, resolve_router
    from kvspec.fleet.routers import PrecisePrefix
    from kvspec.fleet.routing import RouterContext

    router = build_router(resolve_router("precise_prefix"), RouterContext(num_instances=2, block_size=16))
    assert isinstance(router, PrecisePrefix)
    run_fleet(family_trace([0, 1]), config, SchedulerLimits(max_model_len=1024), settings, router=router)
    assert router.index.offloaded["CPU"]  # host stores arrived as CPU-medium events


def _hybrid_config(kind: str, num_blocks: int) -> tuple[object, SchedulerLimits]:
    import torch

    from kvspec import MambaSpec
    from tests.helpers import sw_spec

    if kind == "window":
        return make_config([full_spec(16), sw_spec(32)], num_blocks), SchedulerLimits(max_model_len=1024)
    if kind == "mamba":
        mamba = MambaSpec(block_size=16, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align")
        return make_config([full_spec(16), mamba], num_blocks), SchedulerLimits(
            max_model_len=1024, mamba_cache_mode="align"
        )
    return make_config([full_spec(16)], num_blocks), SchedulerLimits(max_model_len=1024)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["full", "window", "mamba"]),
    families=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    gpu_blocks=st.integers(14, 40),
    host_blocks=st.integers(1, 40),
    pool_blocks=st.integers(0, 60),
    policy=st.sampled_from(["lru", "arc"]),
)
def test_replays_with_tiers_keep_the_pool_consistent_and_count_every_hit_once(
    kind: str, families: list[int], gpu_blocks: int, host_blocks: int, pool_blocks: int, policy: str
) -> None:
    """Random family traffic through full-attention, sliding-window and Mamba models with a host tier and a
    pool: the coordinator's invariants hold, every request finishes or is refused, the tiers' first hits
    are part of the first admissions' hits, and no tier holds more than its capacity."""
    from kvspec.engine.offload import chunk_bytes
    from tests.unit.fleet.fleet_helpers import family_trace

    config, limits = _hybrid_config(kind, gpu_blocks)
    coordinator = replay_coordinator(config, limits)  # type: ignore[arg-type]
    chunk = chunk_bytes(coordinator)
    tiers = TierSettings(
        host_bytes=host_blocks * chunk, pool_bytes=pool_blocks * chunk, host_options={"policy": policy}
    )
    trace = family_trace(families, shared_blocks=4, tail_blocks=2, gap_ms=5.0, output_length=3)
    stats = replay_timed(trace, coordinator, max_num_batched_tokens=64, max_num_seqs=4, tiers=tiers)
    coordinator.check_invariants()
    assert stats.finished + stats.refused == len(families)
    assert stats.tiers is not None
    tier_hits = sum(stats.tiers.first_hit_tokens.values())
    assert 0 <= tier_hits <= stats.first_admission_hit_tokens <= stats.prompt_tokens
    assert all(v % 16 == 0 for v in stats.tiers.first_hit_tokens.values())


class _Recording(HostTier):
    """A host tier that records each offer's length."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.offers: list[int] = []

    def prepare_store(self, keys: Sequence[bytes], request: TierRequest) -> StorePlan | None:
        self.offers.append(len(keys))
        return super().prepare_store(keys, request)


def test_a_tier_that_refuses_an_offer_is_offered_the_blocks_again_and_the_others_are_not() -> None:
    host, small = _Recording(64), _Recording(8)
    pinner = TierRequest("pinner")
    held = [offload_key(bytes([200 + i]) * 8, 0) for i in range(8)]
    plan = small.prepare_store(held, pinner)
    assert plan is not None
    small.complete_store(plan.keys_to_store, pinner)
    small.prepare_load(held, pinner)  # all of the small tier's blocks pinned: it cannot make room
    connector = TierConnector(
        [_full()],
        [
            TierSlot(name="host", tier=host, link=TransferModel()),
            TierSlot(name="small", tier=small, link=TransferModel()),
        ],
        hash_block_size=16,
    )
    connector.admitted("r", 0)
    connector.end_step([("r", _HASHES, 64)])  # blocks 0-3
    assert connector.stats.stored_blocks == {"host": 4} and connector.stats.refused_stores == {"small": 4}
    small.complete_load(held, pinner)
    connector.end_step([("r", _HASHES, 96)])  # blocks 4-5 are new
    assert host.offers == [4, 2] and small.offers == [8, 4, 6]  # the small tier is offered 0-5 again
    assert connector.stats.stored_blocks == {"host": 6, "small": 6}
