"""vllm-ascend's specs ported with only their imports changed (tests/fixtures/vllm_ascend_port), issue 18.

mypy --strict checks the port with the rest of the repository (vLLM's ``merge(cls, specs: list[Self])`` and
``max_memory_usage_bytes(self, vllm_config)`` type-check as kvspec overrides). Here: the conformance kit, a
DeepSeek-V3.2-like layout (MLA + SFA indexer + a full-attention draft layer) planned and serving requests,
registration through vLLM's names and through an entry point, and DCP 2 with prefix caching.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvspec import (
    FullAttentionManager,
    FullAttentionSpec,
    KVCacheCoordinator,
    Registry,
    SchedulerLimits,
    SlidingWindowManager,
    SlidingWindowMLASpec,
    UniformTypeKVCacheSpecs,
    default_registry,
)
from kvspec.integrations.vllm import KVCacheSpecRegistry
from kvspec.planning import get_kv_cache_config
from kvspec.registry.builtins import register_builtins
from kvspec.registry.plugins import load_plugins
from kvspec.testing import check_plugin
from tests.fixtures.vllm_ascend_port import kv_cache_interface as ascend
from tests.helpers import make_request, schedule

MLA = ascend.AscendMLAAttentionSpec(
    block_size=128,
    num_kv_heads=1,
    head_size=576,
    dtype=torch.bfloat16,
    scale_dim=4,
    scale_dtype=torch.float16,
)
INDEXER = ascend.AscendSFAIndexerCacheSpec(
    block_size=128, num_kv_heads=1, head_size=128, dtype=torch.int8, scale_dim=2, scale_dtype=torch.float16
)
SWA = ascend.AscendSlidingWindowMLASpec(
    block_size=128, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, sliding_window=512
)
DRAFT = FullAttentionSpec(block_size=128, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)


@pytest.fixture
def ascend_registered() -> Iterator[Registry[Any, Any]]:
    with default_registry.isolated() as registry:
        ascend.register(registry)
        yield registry


def test_page_sizes_follow_the_ascend_layouts() -> None:
    assert MLA.page_size_bytes == 128 * (576 * 2 + 4 * 2)
    assert INDEXER.page_size_bytes == 128 * (128 * 1 + 2 * 2)
    assert SWA.page_size_bytes == 128 * 576 * 2
    limits = SchedulerLimits(max_model_len=4096, decode_context_parallel_size=2)
    # vLLM's form, called with kvspec's limits: each DCP rank keeps half of the tokens.
    assert MLA.max_memory_usage_bytes(limits) == 16 * MLA.page_size_bytes
    assert ascend.AscendMLAAttentionSpec.merge([MLA, MLA]) == MLA


@pytest.mark.usefixtures("ascend_registered")
def test_the_kit_passes_each_ported_spec() -> None:
    check_plugin(MLA, FullAttentionManager, uniform_type_base_spec=FullAttentionSpec)
    check_plugin(INDEXER, FullAttentionManager, uniform_type_base_spec=FullAttentionSpec)
    check_plugin(SWA, SlidingWindowManager, uniform_type_base_spec=SlidingWindowMLASpec)


@pytest.mark.usefixtures("ascend_registered")
def test_a_deepseek_v32_like_layout_plans_and_serves() -> None:
    layers: dict[str, Any] = {}
    for i in range(4):
        layers[f"model.layers.{i}.self_attn.mla"] = MLA
        layers[f"model.layers.{i}.self_attn.indexer"] = INDEXER
    layers["model.mtp.0.self_attn"] = DRAFT
    limits = SchedulerLimits(max_model_len=8192, max_num_batched_tokens=2048)
    config = get_kv_cache_config(layers, 256 << 20, limits)
    (group,) = config.kv_cache_groups  # one uniform full-attention group: one block id per token range
    assert isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs) and len(group.layer_names) == 9
    per_block = 4 * (MLA.page_size_bytes + INDEXER.page_size_bytes) + DRAFT.page_size_bytes
    assert config.num_blocks == (256 << 20) // per_block
    coord = KVCacheCoordinator(config, limits)
    prefix = list(range(1000, 1000 + 640))
    first = make_request(coord, "a", [*prefix, 1, 2, 3])
    schedule(coord, first)
    coord.free(first)
    second = make_request(coord, "b", [*prefix, 7, 8])
    _, hit = coord.get_computed_blocks(second)
    assert hit == 640  # five 128-token blocks of the shared prefix
    schedule(coord, second)
    coord.free(second)
    assert (
        coord.block_pool.get_num_free_blocks() == config.num_blocks - 1
    )  # nothing leaked (null block aside)


def test_registration_through_vllms_names() -> None:
    registry: Registry[Any, Any] = Registry(name="vllm-names")
    register_builtins(registry)
    KVCacheSpecRegistry.use(registry)
    try:
        ascend.register_ascend_kv_cache_specs()
        assert KVCacheSpecRegistry.get_manager_class(MLA) is FullAttentionManager
        assert KVCacheSpecRegistry.get_manager_class(SWA) is SlidingWindowManager
        assert KVCacheSpecRegistry.get_uniform_type_base_spec(INDEXER) is FullAttentionSpec
    finally:
        KVCacheSpecRegistry.use(default_registry)


def test_registration_through_an_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = SimpleNamespace(
        name="ascend",
        value="tests.fixtures.vllm_ascend_port.kv_cache_interface:register",
        dist=SimpleNamespace(name="vllm-ascend-kvspec"),
        load=lambda: ascend.register,
    )
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group: [entry] if group == "kvspec.plugins" else []
    )
    registry: Registry[Any, Any] = Registry(name="entry-point")
    register_builtins(registry)
    load_plugins(registry=registry)
    assert registry.get_manager_class(INDEXER) is FullAttentionManager
    assert ascend.AscendSlidingWindowMLASpec in registry


@pytest.mark.usefixtures("ascend_registered")
def test_dcp_2_with_prefix_caching() -> None:
    limits = SchedulerLimits(max_model_len=4096, decode_context_parallel_size=2)
    config = get_kv_cache_config({"mla": MLA}, 0, limits, num_blocks_override=64)
    coord = KVCacheCoordinator(config, limits)
    assert coord.hash_block_size == 256  # a block spans both DCP ranks: 2 x 128 tokens
    prefix = list(range(600))
    first = make_request(coord, "a", [*prefix, 1])
    schedule(coord, first)
    second = make_request(coord, "b", [*prefix, 2])
    _, hit = coord.get_computed_blocks(second)
    assert hit == 512
