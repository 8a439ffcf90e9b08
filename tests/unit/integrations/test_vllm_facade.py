"""vLLM's registry names over kvspec's registry, with vLLM's exception bases (no vLLM needed)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest
import torch

from kvspec import FullAttentionManager, FullAttentionSpec, Registry, SlidingWindowManager, default_registry
from kvspec import SlidingWindowSpec as SlidingWindowSpecOfKvspec
from kvspec.errors import SpecConversionError, VllmRegistrationError, VllmSpecLookupError
from kvspec.integrations.vllm import (
    KVCacheSpecRegistry,
    apply_vllm_platform_hook,
    check_kv_cache_spec_registry,
    register_kv_cache_spec,
    to_kvspec,
    to_vllm,
)
from kvspec.registry.builtins import register_builtins
from tests.helpers import ForeignSpec

A: dict[str, Any] = dict(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)


@pytest.fixture
def facade() -> Any:
    reg: Registry[Any, Any] = Registry(name="facade")
    register_builtins(reg)
    KVCacheSpecRegistry.use(reg)
    yield reg
    KVCacheSpecRegistry.use(default_registry)


def test_lookups_with_vllms_names(facade: Registry[Any, Any]) -> None:
    spec = FullAttentionSpec(**A)
    assert KVCacheSpecRegistry.get_manager_class(spec) is FullAttentionManager
    assert KVCacheSpecRegistry.get_uniform_type_base_spec(spec) is FullAttentionSpec
    assert KVCacheSpecRegistry.get_manager_class(ForeignSpec()) is None


def test_registration_errors_are_assertions_as_in_vllm(facade: Registry[Any, Any]) -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
    class NpuSpec(FullAttentionSpec):
        pass

    with pytest.raises(AssertionError, match="manager_class is required"):
        KVCacheSpecRegistry.register(NpuSpec)
    with pytest.raises(
        VllmRegistrationError, match="Conflicting registration for KVCacheSpec FullAttentionSpec"
    ):
        KVCacheSpecRegistry.register(FullAttentionSpec, SlidingWindowManager)
    register_kv_cache_spec(FullAttentionManager, FullAttentionSpec)(NpuSpec)
    assert NpuSpec in facade


def test_check_raises_value_error_naming_the_layer(facade: Registry[Any, Any]) -> None:
    check_kv_cache_spec_registry({"model.layers.0": FullAttentionSpec(**A)})
    with pytest.raises(
        ValueError, match=r"Unsupported KV cache spec type for layer model\.layers\.3: ForeignSpec"
    ):
        check_kv_cache_spec_registry({"model.layers.3": ForeignSpec()})
    with pytest.raises(VllmSpecLookupError):
        check_kv_cache_spec_registry({"x": ForeignSpec()})


def test_platform_hook_with_vllm_config_is_atomic(facade: Registry[Any, Any]) -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
    class AscendSpec(FullAttentionSpec):
        pass

    seen: list[object] = []

    class Platform:
        def register_custom_kv_cache_specs(self, vllm_config: object) -> None:
            seen.append(vllm_config)
            KVCacheSpecRegistry.register(AscendSpec, FullAttentionManager, FullAttentionSpec)
            raise RuntimeError("CANN missing")

    config = object()
    with pytest.raises(RuntimeError, match="CANN missing"):
        apply_vllm_platform_hook(Platform(), config)
    assert seen == [config] and AscendSpec not in facade


def test_conversion_by_class_name_and_without_vllm() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class SlidingWindowSpec:  # stands in for vLLM's class of that name: same fields
        block_size: int
        num_kv_heads: int
        head_size: int
        dtype: torch.dtype
        sliding_window: int
        head_size_v: int | None = None

    ours = to_kvspec(SlidingWindowSpec(**A, sliding_window=128))
    assert isinstance(ours, SlidingWindowSpecOfKvspec) and ours.sliding_window == 128
    assert ours.page_size_bytes == 16 * 2 * 128 * 2
    with pytest.raises(SpecConversionError, match="No kvspec counterpart for vLLM spec ForeignSpec"):
        to_kvspec(ForeignSpec())
    if "vllm" not in sys.modules:
        try:
            import vllm  # noqa: F401
        except ImportError:
            with pytest.raises(SpecConversionError, match="needs vLLM installed"):
                to_vllm(FullAttentionSpec(**A))


# -- a plugin written as for vLLM: vLLM's registry calls, its platform hook, its vllm_config forms -------


@dataclasses.dataclass(frozen=True, kw_only=True)
class CappedFullAttentionSpec(FullAttentionSpec):
    """A platform's spec as a vLLM plugin writes it: memory bound in vLLM's ``vllm_config`` form."""

    max_tokens_kept: int = 256

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        tokens = min(vllm_config.model_config.max_model_len, self.max_tokens_kept)
        cp = vllm_config.parallel_config.decode_context_parallel_size
        return int(-(-tokens // (self.block_size * cp)) * self.page_size_bytes)


class CappedPlatform:
    def register_custom_kv_cache_specs(self, vllm_config: Any) -> None:
        KVCacheSpecRegistry.register(CappedFullAttentionSpec, FullAttentionManager)


def test_vllm_style_plugin_registers_and_runs_unchanged(facade: Registry[Any, Any]) -> None:
    from kvspec import KVCacheCoordinator, Request, SchedulerLimits
    from kvspec.planning import get_kv_cache_config

    apply_vllm_platform_hook(CappedPlatform(), vllm_config=object())
    assert KVCacheSpecRegistry.get_manager_class(CappedFullAttentionSpec(**A)) is FullAttentionManager
    spec = CappedFullAttentionSpec(**A)
    limits = SchedulerLimits(max_model_len=4096)
    # kvspec's planner calls kvspec's form; the plugin's vllm_config form answers through the view
    assert spec.max_memory_usage_bytes(limits) == 16 * spec.page_size_bytes  # 256 tokens / 16 per block
    assert spec.max_memory_usage_bytes(SchedulerLimits(max_model_len=100)) == 7 * spec.page_size_bytes
    assert (
        spec.max_memory_usage_bytes(SchedulerLimits(max_model_len=4096, decode_context_parallel_size=2))
        == 8 * spec.page_size_bytes
    )
    layers = {f"layer.{i}": spec for i in range(4)}
    config = get_kv_cache_config(layers, 64 * 4 * spec.page_size_bytes, limits, registry=facade)
    assert config.num_blocks == 64
    coordinator = KVCacheCoordinator(config, limits, registry=facade)
    request = Request("r", list(range(40)), block_hasher=coordinator.make_block_hasher())
    blocks = coordinator.allocate_slots(request, 40)
    assert blocks is not None and len(blocks.get_block_ids()[0]) == 3
    coordinator.check_invariants()
