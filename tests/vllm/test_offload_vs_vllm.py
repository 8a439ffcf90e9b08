"""kvspec's host tier against vLLM 0.34's own CPU offloading manager (``vllm/v1/kv_offload/cpu``), LRU and
ARC, with and without a store threshold: the same random call sequences (requests with end positions, offers,
completed, failed and pending stores, loads, finishes) must give identical lookups, stored keys, evictions
(in order) and events. Runs in ``nox -s vllm034``; skipped where vLLM's kv_offload is not 0.34's."""

from __future__ import annotations

import random
from typing import Any

import pytest

_vllm = pytest.importorskip("vllm")
if not str(_vllm.__version__).startswith("0.34."):
    pytest.skip(
        f"vLLM 0.34's kv_offload managers (nox -s vllm034); found {_vllm.__version__}",
        allow_module_level=True,
    )
manager_module = pytest.importorskip("vllm.v1.kv_offload.cpu.manager")
base_module = pytest.importorskip("vllm.v1.kv_offload.base")

from kvspec.tiers import HostTier, LookupResult, TierRequest, offload_key  # noqa: E402

_LOOKUP = {"MISS": LookupResult.MISS, "HIT": LookupResult.HIT, "HIT_PENDING": LookupResult.HIT_PENDING}


def _vllm_manager(capacity: int, policy: str, threshold: int, tracker: int) -> Any:
    return manager_module.CPUOffloadingManager(
        num_chunks=capacity,
        cache_policy=policy,
        enable_events=True,
        store_threshold=threshold,
        max_tracker_size=tracker,
    )


def _run(seed: int, policy: str, threshold: int) -> int:
    """One random sequence on both managers; returns the evictions seen (so a test knows it evicted)."""
    rng = random.Random(seed)
    capacity = rng.randint(3, 12)
    tracker = rng.choice([4, 64_000])
    theirs = _vllm_manager(capacity, policy, threshold, tracker)
    ours = HostTier(capacity, policy=policy, store_threshold=threshold, max_tracker_size=tracker)
    hashes = [rng.randbytes(8) for _ in range(14)]
    keys = [offload_key(h, g) for h in hashes for g in (0, 1)]
    active: list[tuple[Any, TierRequest]] = []
    pending: list[tuple[list[bytes], Any, TierRequest]] = []
    pinned: list[tuple[list[bytes], Any, TierRequest]] = []
    evictions = 0
    for step in range(250):
        where = f"seed {seed}, {policy}, threshold {threshold}, step {step}"
        if not active or rng.random() < 0.15:
            context = base_module.ReqContext(req_id=f"r{step}")
            theirs.on_new_request(context)
            active.append((context, TierRequest(f"r{step}")))
        context, request = rng.choice(active)
        op = rng.random()
        if op < 0.4:
            start = rng.randrange(len(hashes))
            span = hashes[start : start + rng.randint(1, 5)]
            groups = rng.choice([(0,), (1,), (0, 1)])
            offer = [offload_key(h, g) for g in groups for h in span]
            if rng.random() < 0.3:
                rng.shuffle(offer)
            if rng.random() < 0.8:  # most offers carry positions (the scheduler records them)
                for key in offer:
                    position = 16 * (hashes.index(key[:-4]) + 1)
                    context.set_offload_key_position(key, position)
                    request.set_position(key, position)
            expected = theirs.prepare_store(offer, context)
            got = ours.prepare_store(offer, request)
            assert (expected is None) == (got is None), where
            if expected is None or got is None:
                continue
            assert list(got.keys_to_store) == list(expected.keys_to_store), where
            assert list(got.evicted_keys) == list(expected.evicted_keys), where
            evictions += len(got.evicted_keys)
            stored = list(got.keys_to_store)
            if not stored:
                continue
            fate = rng.random()
            if fate < 0.2:
                pending.append((stored, context, request))
            else:
                ok = fate > 0.3
                theirs.complete_store(stored, context, success=ok)
                ours.complete_store(stored, request, success=ok)
        elif op < 0.55 and pending:
            stored, ctx, req = pending.pop(rng.randrange(len(pending)))
            theirs.complete_store(stored, ctx, success=True)
            ours.complete_store(stored, req, success=True)
        elif op < 0.75:
            ready = []
            for key in keys:
                expected = _LOOKUP[theirs.lookup(key, context).name]
                assert ours.lookup(key, request) is expected, f"{where}: lookup of {key.hex()}"
                if expected is LookupResult.HIT:
                    ready.append(key)
            if ready and rng.random() < 0.6:
                load = rng.sample(ready, rng.randint(1, min(4, len(ready))))
                theirs.prepare_load(load, context)
                ours.prepare_load(load, request)
                pinned.append((load, context, request))
        elif op < 0.85 and pinned:
            load, ctx, req = pinned.pop(rng.randrange(len(pinned)))
            theirs.complete_load(load, ctx)
            ours.complete_load(load, req)
        else:
            theirs.on_request_finished(context)
            ours.on_request_finished(request)
            active.remove((context, request))
        expected_events = [(list(e.keys), e.removed, e.metadata_only) for e in theirs.take_events()]
        got_events = [(list(e.keys), e.removed, e.metadata_only) for e in ours.take_events()]
        assert got_events == expected_events, where
    for key in keys:
        assert (
            ours.lookup(key, TierRequest("end"))
            is _LOOKUP[theirs.lookup(key, base_module.ReqContext(req_id="end")).name]
        )
    return evictions


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("threshold", [1, 2])
def test_host_tier_decides_as_vllm_034_cpu_offloading(policy: str, threshold: int) -> None:
    evictions = sum(_run(seed, policy, threshold) for seed in range(60))
    assert evictions > 100  # the sequences reach the eviction paths
