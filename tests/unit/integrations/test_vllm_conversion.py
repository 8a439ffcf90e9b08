"""Converting a platform's vLLM-side specs (``vllm_ascend.*`` classes subclass vLLM's) without vLLM installed:
a registered ``vllm_counterpart``, a plugin's converter, and a clear refusal for an unknown class."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
import torch

from kvspec import MLAAttentionSpec, Registry
from kvspec.errors import SpecConversionError
from kvspec.integrations.vllm import as_kvspec, to_kvspec
from kvspec.integrations.vllm_planning import config_from_vllm
from kvspec.managers import FullAttentionManager as MLAManager
from kvspec.registry.builtins import register_builtins

MLA: dict[str, Any] = dict(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VllmMLA:
    """Stands in for vLLM's ``MLAAttentionSpec`` (its module is vLLM's, so it is vLLM-side)."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    cache_dtype_str: str | None = None


VllmMLA.__module__ = "vllm.v1.kv_cache_interface"
VllmMLA.__qualname__ = VllmMLA.__name__ = "MLAAttentionSpec"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AscendIndexer(VllmMLA):
    """A platform's spec written for vLLM: its own module, vLLM's base."""

    index_head_dim: int = 128


AscendIndexer.__module__ = "vllm_ascend.core.kv_cache_interface"
AscendIndexer.__qualname__ = AscendIndexer.__name__ = "AscendSFAIndexerCacheSpec"
ASCEND_NAME = "vllm_ascend.core.kv_cache_interface.AscendSFAIndexerCacheSpec"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class KvspecIndexer(MLAAttentionSpec):
    """The platform's kvspec port, naming the vLLM-side class it mirrors."""

    vllm_counterpart: ClassVar[str] = ASCEND_NAME
    index_head_dim: int = 128


@pytest.fixture
def registry() -> Registry[Any, Any]:
    reg: Registry[Any, Any] = Registry(name="conversion")
    register_builtins(reg)
    return reg


def test_a_platform_spec_on_vllms_base_is_not_taken_for_kvspecs(registry: Registry[Any, Any]) -> None:
    """Before: any class outside ``vllm.*`` was kept as a kvspec spec with default behaviour."""
    with pytest.raises(
        SpecConversionError, match=r"AscendSFAIndexerCacheSpec \(vllm_ascend\..*vllm_counterpart"
    ):
        as_kvspec(AscendIndexer(**MLA, index_head_dim=64), registry=registry)


def test_the_registered_counterpart_receives_every_field(registry: Registry[Any, Any]) -> None:
    registry.register(KvspecIndexer, MLAManager, MLAAttentionSpec)
    ours = as_kvspec(AscendIndexer(**MLA, index_head_dim=64, cache_dtype_str="fp8_ds_mla"), registry=registry)
    assert type(ours) is KvspecIndexer
    assert ours == KvspecIndexer(**MLA, index_head_dim=64, cache_dtype_str="fp8_ds_mla")
    # vLLM's own base class still converts by name to kvspec's built-in.
    assert type(as_kvspec(VllmMLA(**MLA), registry=registry)) is MLAAttentionSpec


def test_a_subclass_of_a_mirroring_class_mirrors_nothing(registry: Registry[Any, Any]) -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
    class Narrower(KvspecIndexer):
        pass

    registry.register(Narrower, MLAManager, MLAAttentionSpec)
    with pytest.raises(SpecConversionError, match="No kvspec counterpart"):
        to_kvspec(AscendIndexer(**MLA), registry=registry)


def test_a_plugins_converter_comes_first_and_reaches_the_adapters_config(
    registry: Registry[Any, Any],
) -> None:
    seen: list[object] = []

    def convert(spec: object) -> KvspecIndexer | None:
        seen.append(spec)
        if isinstance(spec, AscendIndexer):
            return KvspecIndexer(**MLA, index_head_dim=spec.index_head_dim * 2)
        return None  # not the plugin's: kvspec's own rules follow

    group = dataclasses.make_dataclass("G", [("layer_names", list[str]), ("kv_cache_spec", Any)])
    config = dataclasses.make_dataclass(
        "C", [("num_blocks", int), ("kv_cache_tensors", list[Any]), ("kv_cache_groups", list[Any])]
    )(
        num_blocks=8,
        kv_cache_tensors=[],
        kv_cache_groups=[group(["idx"], AscendIndexer(**MLA)), group(["mla"], VllmMLA(**MLA))],
    )
    ours = config_from_vllm(config, spec_converter=convert, registry=registry)
    specs = [g.kv_cache_spec for g in ours.kv_cache_groups]
    assert specs == [KvspecIndexer(**MLA, index_head_dim=256), MLAAttentionSpec(**MLA)]
    assert len(seen) == 2
    with pytest.raises(SpecConversionError):
        config_from_vllm(config, registry=registry)  # without the converter nothing knows the class
