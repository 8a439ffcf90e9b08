"""vllm-ascend 0.23.0's real plugin on kvspec with no kvspec code in it (issue 49), in ``nox -s vllm_ascend``.

The plugin is loaded from its wheel (``platform.py``) and registers itself in vLLM's registry from the platform
hook. kvspec adopts both registrations; planning a model of the plugin's specs gives vLLM's own planner's
numbers; a random differential drives vLLM's manager and kvspec's adapter in lockstep (``differential.py``);
and kvspec's conformance kit reports what it finds in the adopted classes.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM 0.23.0")


@pytest.fixture(scope="module")
def ascend() -> tuple[ModuleType, ModuleType]:
    from benchmarks.vllm_scheduler_loop import _setup_offline_hub

    _setup_offline_hub()
    from tests.vllm.readme_differential import prepare_vllm
    from tests.vllm_ascend import differential, platform

    prepare_vllm()  # vLLM's CPU platform (no device here), whose hook then registers the plugin

    specs, managers = platform.load(differential.CACHE)
    return specs, managers


def mla(specs: ModuleType, **kw: Any) -> Any:
    import torch

    return specs.AscendMLAAttentionSpec(num_kv_heads=1, head_size=576, dtype=torch.bfloat16, **kw)


def swmla(specs: ModuleType, **kw: Any) -> Any:
    import torch

    return specs.AscendSlidingWindowMLASpec(num_kv_heads=1, head_size=576, dtype=torch.bfloat16, **kw)


def test_the_spec_module_imports_on_cpu_with_the_page_size_of_an_ascend_device(
    ascend: tuple[ModuleType, ModuleType],
) -> None:
    specs, _ = ascend
    assert mla(specs, block_size=128).page_size_bytes == 147_456


def _adopted() -> list[Any]:
    from kvspec.integrations.vllm_adoption import adopt_vllm_registrations
    from kvspec.registry.builtins import default_registry

    return adopt_vllm_registrations(default_registry)


def test_both_registrations_are_adopted_with_their_own_managers(
    ascend: tuple[ModuleType, ModuleType],
) -> None:
    from kvspec import SlidingWindowManager
    from kvspec.contracts.traits import traits_of
    from kvspec.integrations.vllm import to_kvspec
    from kvspec.integrations.vllm_adoption import AdoptedManager, AdoptedSpec

    specs, managers = ascend
    # Only the platform's own registrations: another test of the session may have registered its own.
    adopted = {a.vllm_spec_class: a for a in _adopted() if a.vllm_spec_class.__module__ == specs.__name__}
    assert set(adopted) == {specs.AscendMLAAttentionSpec, specs.AscendSlidingWindowMLASpec}
    mla_adoption = adopted[specs.AscendMLAAttentionSpec]
    assert issubclass(mla_adoption.manager_class, AdoptedManager)
    assert mla_adoption.manager_class.vllm_manager_cls is managers.CompressAttentionManager
    assert adopted[specs.AscendSlidingWindowMLASpec].manager_class is SlidingWindowManager
    held = to_kvspec(mla(specs, block_size=128, compress_ratio=4))
    assert isinstance(held, AdoptedSpec)
    assert held.vllm_spec.compress_ratio == 4  # the object itself, not a copy into kvspec's fields
    assert held.page_size_bytes == 147_456
    assert traits_of(held).prefix_hits_left_closed  # MLA's family: a full-attention hit search
    window = to_kvspec(swmla(specs, block_size=64, sliding_window=128))
    assert traits_of(window).sliding_window == 128


LAYOUTS: dict[str, Callable[[ModuleType], dict[str, Any]]] = {
    "MLA": lambda s: {f"layers.{i}": mla(s, block_size=128) for i in range(4)},
    "MLA, compress_ratio 4": lambda s: {
        f"layers.{i}": mla(s, block_size=128, compress_ratio=4) for i in range(4)
    },
    "MLA and sliding-window MLA": lambda s: {
        **{f"layers.{i}": mla(s, block_size=128) for i in range(0, 6, 2)},
        **{f"layers.{i}": swmla(s, block_size=128, sliding_window=128) for i in range(1, 6, 2)},
    },
}


@pytest.mark.parametrize("memory", [64 << 20, 1 << 30])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_plans_equal_vllms_own_planner(
    ascend: tuple[ModuleType, ModuleType], layout: str, memory: int
) -> None:
    """vLLM 0.23.0's ``get_kv_cache_configs`` and kvspec's planner (adopted specs, the objects' own page sizes,
    merges and memory bounds) give the same groups, block counts, block sizes and pages."""
    from vllm.config import ModelConfig, VllmConfig
    from vllm.v1.core import kv_cache_utils

    from kvspec.contracts.release import VLLM_0_23
    from kvspec.contracts.spec import SchedulerLimits
    from kvspec.integrations.vllm import to_kvspec
    from kvspec.planning import get_kv_cache_configs

    specs, _ = ascend
    _adopted()
    layers = LAYOUTS[layout](specs)
    config = VllmConfig(model_config=ModelConfig(max_model_len=4096))
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    (theirs,) = kv_cache_utils.get_kv_cache_configs(config, [layers], [memory])
    limits = SchedulerLimits(
        max_model_len=4096, max_num_batched_tokens=config.scheduler_config.max_num_batched_tokens
    )
    (ours,) = get_kv_cache_configs(
        [{name: to_kvspec(spec) for name, spec in layers.items()}], [memory], limits, profile=VLLM_0_23
    )
    assert ours.num_blocks == theirs.num_blocks > 0
    assert [sorted(g.layer_names) for g in ours.kv_cache_groups] == [
        sorted(g.layer_names) for g in theirs.kv_cache_groups
    ]
    # vLLM 0.23 holds a hybrid's groups as UniformTypeKVCacheSpecs (the layers' pages summed); kvspec as one
    # spec: each layer's block and page are compared, and the tensors.
    assert _layer_pages(ours) == _layer_pages(theirs)
    assert sorted(t.size for t in ours.kv_cache_tensors) == sorted(t.size for t in theirs.kv_cache_tensors)


def _layer_pages(config: Any) -> dict[str, tuple[int, int]]:
    """layer -> (block size, page bytes) of the spec that holds it in ``config``."""
    out: dict[str, tuple[int, int]] = {}
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        inner = getattr(spec, "kv_cache_specs", None)
        for layer in group.layer_names:
            held = inner[layer] if inner is not None else spec
            out[layer] = (held.block_size, held.page_size_bytes)
    return out


def test_the_differential_finds_no_divergence(ascend: tuple[ModuleType, ModuleType]) -> None:
    """A seeded sample here; ``nox -s vllm_ascend`` then runs 40 workloads per spec shape."""
    from tests.vllm_ascend import differential

    outcomes = differential.run(workloads_per_shape=8, first_seed=1000)
    assert not [o for o in outcomes if o.divergence or o.stalled], differential.summary(outcomes)


def test_the_kit_reports_on_the_adopted_classes(ascend: tuple[ModuleType, ModuleType]) -> None:
    """kvspec's conformance kit over each adopted class, at the shapes a model uses: what it finds is
    printed (``nox -s vllm_ascend`` shows it); its verdicts are pinned here, so a change in either is seen."""
    from tests.vllm_ascend.kit_report import kit_findings

    findings = kit_findings(ascend[0])
    for shape, finding in findings.items():
        print(f"kit, {shape}: {finding}")
    assert findings["AscendMLAAttentionSpec"].startswith("passes")
    assert findings["AscendSlidingWindowMLASpec, window 128"].startswith("passes")
    assert "compress_ratio" in findings["AscendMLAAttentionSpec, compress_ratio 4"]
