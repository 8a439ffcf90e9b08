"""vLLM's real Scheduler on kvspec's adapter, for the installed release (0.23.0 or 0.34.0: `nox -s vllm` runs
this file under both; skipped where vLLM is absent)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler")

from benchmarks import vllm_scheduler_loop as loop
from kvspec.integrations import vllm_kv_cache_manager

ARGS = argparse.Namespace(requests=48, blocks=160, block_size=16, budget=512, max_seqs=16, seed=3)


def test_same_scheduling_outputs_as_stock_vllm_with_preemptions() -> None:
    stock, _, stock_preemptions = loop.run(False, ARGS)
    ours, _, our_preemptions = loop.run(True, ARGS)
    assert stock_preemptions > 0  # the block budget is small enough to preempt: eviction paths run
    assert our_preemptions == stock_preemptions
    assert len(ours) == len(stock)
    for step, (a, b) in enumerate(zip(stock, ours, strict=True)):
        assert a == b, f"step {step}"
    assert any(new for new, *_ in stock)  # block ids were compared, not empty tuples


MAMBA_ARGS = argparse.Namespace(
    requests=64, blocks=300, block_size=16, budget=256, max_seqs=12, seed=5, layout="mamba-align"
)


def test_mamba_align_hybrid_under_the_schedulers_aligned_splitting() -> None:
    """Full attention + sliding window + Mamba "align": vLLM's Scheduler cuts prefill chunks at block
    boundaries; every step's outputs (block ids included) match stock vLLM's (issue 18, item 10)."""
    stock, _, stock_preemptions = loop.run(False, MAMBA_ARGS)
    ours, _, our_preemptions = loop.run(True, MAMBA_ARGS)
    assert scheduler_is_aligned() and stock_preemptions > 0
    assert (len(ours), our_preemptions) == (len(stock), stock_preemptions)
    for step, (a, b) in enumerate(zip(stock, ours, strict=True)):
        assert a == b, f"step {step}"


def scheduler_is_aligned() -> bool:
    scheduler = loop.make_scheduler(32, 16, 64, 2, "mamba-align")
    return bool(scheduler.need_mamba_block_aligned_split)


def test_a_wrong_block_id_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison sees block ids: kvspec handing out blocks in another order fails it."""
    from kvspec.blocks.pool import BlockPool

    original = BlockPool.get_new_blocks

    def reversed_blocks(self: BlockPool, num_blocks: int) -> Any:
        return list(reversed(original(self, num_blocks)))

    stock, _, _ = loop.run(False, ARGS)
    monkeypatch.setattr(BlockPool, "get_new_blocks", reversed_blocks)
    ours, _, _ = loop.run(True, ARGS)
    assert ours != stock


def test_install_and_uninstall_route_the_scheduler() -> None:
    import vllm.v1.core.sched.scheduler as scheduler_module

    original = scheduler_module.KVCacheManager
    vllm_kv_cache_manager.install()
    try:
        assert scheduler_module.KVCacheManager is vllm_kv_cache_manager.adapter_class()
    finally:
        vllm_kv_cache_manager.uninstall()
    assert scheduler_module.KVCacheManager is original


def test_the_adapter_reproduces_the_installed_vllms_release() -> None:
    import vllm

    from kvspec.contracts.release import VLLM_0_23, VLLM_0_34, profile_for_vllm_version

    vllm_kv_cache_manager.install()
    try:
        scheduler = loop.make_scheduler(32, 16, 64, 2)
    finally:
        vllm_kv_cache_manager.uninstall()
    profile = scheduler.kv_cache_manager.kvspec_coordinator.profile
    assert profile is profile_for_vllm_version(vllm.__version__)
    assert vllm.__version__ != "0.23.0" or profile is VLLM_0_23
    assert vllm.__version__ != "0.34.0" or profile is VLLM_0_34
    # The adapter speaks the release's Scheduler interface (0.34's get_computed_blocks returns 3 values).
    expected = (
        vllm_kv_cache_manager.Vllm034KVCacheManager
        if profile is VLLM_0_34
        else vllm_kv_cache_manager.VllmKVCacheManager
    )
    assert type(scheduler.kv_cache_manager) is expected


def test_install_with_an_eviction_policy_reaches_vllms_scheduler_and_its_priorities() -> None:
    """Beyond vLLM: ``install(eviction_policy=...)`` gives vLLM's own Scheduler a kvspec policy, and the
    request view carries vLLM's request priority to it."""
    from kvspec.errors import UnknownEvictionPolicyError
    from kvspec.eviction import RetentionPolicy

    with pytest.raises(UnknownEvictionPolicyError):
        vllm_kv_cache_manager.install(eviction_policy="fifo")
    vllm_kv_cache_manager.install(eviction_policy="retention")
    try:
        scheduler = loop.make_scheduler(32, 16, 64, 2)
    finally:
        vllm_kv_cache_manager.uninstall()
    manager = scheduler.kv_cache_manager
    assert isinstance(manager.kvspec_coordinator.block_pool.eviction_policy, RetentionPolicy)

    class Fake:
        priority = 3

    view = vllm_kv_cache_manager.VllmRequestView(Fake(), manager._hasher)
    assert view.priority == 3
