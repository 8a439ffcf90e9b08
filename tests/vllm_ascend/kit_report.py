"""kvspec's conformance kit over vllm-ascend's adopted classes: one line of findings per spec shape."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from kvspec.errors import KVSpecError
from kvspec.integrations.vllm import to_kvspec
from kvspec.integrations.vllm_adoption import adopt_vllm_registrations
from kvspec.registry.builtins import default_registry
from kvspec.testing import check_plugin


def shapes(specs: ModuleType) -> dict[str, Any]:
    mla = dict(num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    return {
        "AscendMLAAttentionSpec": specs.AscendMLAAttentionSpec(block_size=128, **mla),
        "AscendMLAAttentionSpec, compress_ratio 4": specs.AscendMLAAttentionSpec(
            block_size=128, compress_ratio=4, **mla
        ),
        "AscendSlidingWindowMLASpec, window 128": specs.AscendSlidingWindowMLASpec(
            block_size=128, sliding_window=128, **mla
        ),
    }


def kit_findings(specs: ModuleType) -> dict[str, str]:
    """shape -> "passes: ..." or what the kit refused (its PluginContractError's message)."""
    adopted = {a.vllm_spec_class: a for a in adopt_vllm_registrations(default_registry)}
    out: dict[str, str] = {}
    for shape, obj in shapes(specs).items():
        adoption = adopted[type(obj)]
        spec = to_kvspec(obj)
        try:
            report = check_plugin(spec, adoption.manager_class, uniform_type_base_spec=type(spec).__mro__[1])
        except KVSpecError as exc:
            out[shape] = f"refused: {type(exc).__name__}: {exc}"
        else:
            out[shape] = f"passes: {len(report.checks)} checks"
    return out
