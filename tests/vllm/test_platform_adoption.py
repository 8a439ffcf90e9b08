"""A platform's own spec and manager, registered in vLLM's registry from its hook and written only against
vLLM's API (tests/vllm_platform, the plugin ``nox -s vllm_serve`` serves), run on kvspec as on vLLM (issue 49):
the random differential over layouts holding the platform's spec, on the installed release (vLLM 0.23.0 in
``nox -s vllm``, 0.34.0 in ``nox -s vllm034``), and the platform's manager seen to act in both."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.v1.kv_cache_spec_registry", reason="needs vLLM with the spec registry")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def capped() -> Any:
    sys.path.insert(0, str(ROOT / "tests" / "vllm_platform"))
    from capped_platform import kv_cache

    from tests.vllm_ascend.platform import hook_platform

    hook_platform(kv_cache.register_capped_specs)
    return kv_cache


def _layout(rng: random.Random) -> tuple[str, ...]:
    kind = rng.random()
    if kind < 0.4:
        return ("capped",)
    return ("capped", rng.choice(("full", "sliding_window", "mla")))


def test_the_platforms_spec_runs_on_kvspec_as_on_vllm(capped: Any) -> None:
    import torch

    from tests.vllm import differential as diff

    def make(block_size: int, rng: random.Random) -> Any:
        heads = rng.choice((1, 2, 4))
        return capped.CappedFullAttentionSpec(
            block_size=block_size, num_kv_heads=heads, head_size=64, dtype=torch.float16
        )

    diff.quiet_logs()
    outcomes = [
        diff.run_workload(diff.draw_workload(seed, layout=_layout, extra_specs={"capped": make}))
        for seed in range(40)
    ]
    assert not [o for o in outcomes if o.divergence or o.stalled], diff.summary(outcomes)
    assert sum(o.hit_tokens for o in outcomes) > 0


def test_the_platforms_manager_acts_on_kvspec(capped: Any) -> None:
    """Every hit of the platform's group stops at its cap, on kvspec's adapter: the platform's code ran."""
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    from kvspec.integrations.vllm_kv_cache_manager import adapter_class

    spec = capped.CappedFullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float16)
    config = KVCacheConfig(
        num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)]
    )
    kwargs: dict[str, Any] = dict(
        kv_cache_config=config,
        max_model_len=1024,
        scheduler_block_size=16,
        hash_block_size=16,
        enable_caching=True,
    )
    manager = adapter_class()(**kwargs)
    assert "CappedHitManager as it is" in manager.describe()
    init_none_hash(sha256)
    hasher = get_request_block_hasher(16, sha256)

    def request(rid: str) -> Any:
        return Request(
            rid, list(range(200)), SamplingParams(max_tokens=4), None, arrival_time=0.0, block_hasher=hasher
        )

    first = request("a")
    blocks, hit = manager.get_computed_blocks(first)[:2]
    assert manager.allocate_slots(first, 200, hit, blocks) is not None
    first.num_computed_tokens = 200
    manager.free(first)
    blocks, hit = manager.get_computed_blocks(request("b"))[:2]
    assert hit == capped.HIT_CAP_BLOCKS * 16  # 12 cached blocks match; the platform's manager gives 4
