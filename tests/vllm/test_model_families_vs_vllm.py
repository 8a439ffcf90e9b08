"""Each model family's layers as vLLM 0.34.0 builds them (issue 34): for the real configs under
tests/fixtures/configs, kvspec's attention page per token, state shapes, state dtypes and state page, and the
hybrid attention block size, against vLLM 0.34's own code run on the same config.

vLLM's code here: the model-architecture convertor (head size, KV heads), each model class's
``get_mamba_state_shape_from_config`` / ``get_mamba_state_dtype_from_config`` (Nemotron-H's float32 SSM
state update included), ``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator`` where 0.34 has no model
class (MiniMax-Text-01's lightning attention), its ``MambaSpec`` / ``FullAttentionSpec`` / ``MLAAttentionSpec``
page sizes and ``Platform._align_hybrid_block_size``. The config is read as vLLM reads a Hugging Face config
(attributes of the config.json's keys); the attention backend is a stand-in that declares FlashAttention's
kernel blocks (multiples of 16) and packs pages as the standard formula does.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("vllm", minversion="0.34", reason="vLLM 0.34's state calculators and convertor")
# Imported before the convertor, which cannot be the first of vLLM's config modules imported (a cycle).
pytest.importorskip("vllm.model_executor.layers.mamba.mamba_utils")

from kvspec import MambaSpec
from kvspec.contracts.spec import KVCacheSpec
from kvspec.models import build_model_layout

CONFIGS = sorted((Path(__file__).parents[1] / "fixtures" / "configs").glob("*.json"))
#: model_type -> (vLLM 0.34 module, model class) for families with state layers.
STATE_MODEL_CLASSES = {
    "jamba": ("vllm.model_executor.models.jamba", "JambaForCausalLM"),
    "nemotron_h": ("vllm.model_executor.models.nemotron_h", "NemotronHForCausalLM"),
    "granitemoehybrid": ("vllm.model_executor.models.granitemoehybrid", "GraniteMoeHybridForCausalLM"),
    "falcon_h1": ("vllm.model_executor.models.falcon_h1", "FalconH1ForCausalLM"),
    "zamba2": ("vllm.model_executor.models.zamba2", "Zamba2ForCausalLM"),
    "qwen3_next": ("vllm.model_executor.models.qwen3_next", "Qwen3NextForCausalLM"),
    "lfm2": ("vllm.model_executor.models.lfm2", "Lfm2ForCausalLM"),
}
BLOCK = 64


def _namespace(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    return value


class _Backend:
    """An attention backend as FlashAttention declares its blocks (multiples of 16), standard pages."""

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[Any]:
        from vllm.v1.attention.backend import MultipleOf

        return [MultipleOf(16)]

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        return block_size is not None and block_size % 16 == 0

    @staticmethod
    def customize_spec(spec: Any) -> Any:
        return spec

    @staticmethod
    def get_name() -> str:
        return "STAND_IN"


def _vllm_config(raw: dict[str, Any], tp: int, block_size: int) -> Any:
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    hf = _namespace(raw)
    text = getattr(hf, "text_config", hf)
    convertor_cls = MODEL_ARCH_CONFIG_CONVERTORS.get(raw["model_type"], ModelArchConfigConvertorBase)
    convertor = convertor_cls(hf, text)
    use_mla = raw["model_type"] in ("deepseek_v2", "deepseek_v3")
    parallel = SimpleNamespace(tensor_parallel_size=tp)
    model = SimpleNamespace(
        hf_config=hf,
        hf_text_config=text,
        dtype=torch.bfloat16,
        use_mla=use_mla,
        is_hybrid=raw["model_type"] in STATE_MODEL_CLASSES or raw["model_type"] == "minimax_text_01",
        architecture=raw["architectures"][0],
        get_head_size=convertor.get_head_size,
        get_num_kv_heads=lambda p: (
            1 if use_mla else max(1, convertor.get_total_num_kv_heads() // p.tensor_parallel_size)
        ),
    )
    cache = SimpleNamespace(
        cache_dtype="auto",
        block_size=block_size,
        user_specified_block_size=True,
        mamba_cache_dtype="auto",
        mamba_ssm_cache_dtype="auto",
        mamba_cache_mode="none",
        mamba_page_size_padded=None,
        mamba_block_size=None,
        use_replayssm=False,
        kv_cache_dtype_skip_layers=None,
    )
    config = SimpleNamespace(
        parallel_config=parallel,
        model_config=model,
        cache_config=cache,
        num_speculative_tokens=0,
        speculative_config=None,
        use_flashinfer_replayssm=False,
    )
    if raw["model_type"] == "nemotron_h":
        from vllm.model_executor.models.config import NemotronHForCausalLMConfig

        NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(cache_config=cache, hf_config=hf)
    return config


def _vllm_state(
    raw: dict[str, Any], config: Any
) -> tuple[tuple[tuple[int, ...], ...], tuple[torch.dtype, ...]]:
    if raw["model_type"] == "minimax_text_01":  # no model class in 0.34: its layers' own calculators
        from vllm.model_executor.layers.mamba.mamba_utils import (
            MambaStateDtypeCalculator,
            MambaStateShapeCalculator,
        )

        shapes = MambaStateShapeCalculator.linear_attention_state_shape(
            num_heads=raw["num_attention_heads"],
            tp_size=config.parallel_config.tensor_parallel_size,
            head_dim=raw["head_dim"],
        )
        dtypes = MambaStateDtypeCalculator.linear_attention_state_dtype(torch.bfloat16, "auto")
        return tuple(tuple(s) for s in shapes), tuple(dtypes)
    module, name = STATE_MODEL_CLASSES[raw["model_type"]]
    model_cls = getattr(importlib.import_module(module), name)
    shapes = model_cls.get_mamba_state_shape_from_config(config)
    dtypes = model_cls.get_mamba_state_dtype_from_config(config)
    return tuple(tuple(s) for s in shapes), tuple(dtypes)


def _vllm_block_size(config: Any, model_cls: Any, monkeypatch: pytest.MonkeyPatch) -> int:
    from vllm.model_executor.models import ModelRegistry
    from vllm.platforms.interface import Platform

    monkeypatch.setattr(
        ModelRegistry, "resolve_model_cls", lambda *a, **k: (model_cls, config.model_config.architecture)
    )
    monkeypatch.setattr(Platform, "_find_non_ssm_backends", classmethod(lambda cls, vllm_config: [_Backend]))
    Platform._align_hybrid_block_size(config, _Backend)
    return int(config.cache_config.block_size)


def _attention(specs: dict[str, KVCacheSpec]) -> list[KVCacheSpec]:
    return [s for s in specs.values() if not isinstance(s, MambaSpec)]


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_family_layers_match_vllm_0_34(path: Path, tp: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec as VllmFull
    from vllm.v1.kv_cache_interface import MambaSpec as VllmMamba
    from vllm.v1.kv_cache_interface import MLAAttentionSpec as VllmMLA

    raw = json.loads(path.read_text())
    layout = build_model_layout(str(path), block_size=BLOCK, tensor_parallel_size=tp)
    specs = layout.layer_specs
    config = _vllm_config(raw, tp, BLOCK)
    model = config.model_config
    attention = _attention(specs)
    assert attention, "every family here has attention layers"
    # The attention page of one token, as vLLM 0.34 sizes the layer.
    vllm_cls = VllmMLA if model.use_mla else VllmFull
    vllm_one = vllm_cls(
        block_size=1,
        num_kv_heads=model.get_num_kv_heads(config.parallel_config),
        head_size=model.get_head_size(),
        dtype=torch.bfloat16,
    ).page_size_bytes
    for spec in attention:
        assert spec.page_size_bytes == vllm_one * spec.block_size
    states = [s for s in specs.values() if isinstance(s, MambaSpec)]
    if not model.is_hybrid:
        assert not states
        return
    shapes, dtypes = _vllm_state(raw, config)
    assert states and all(s.shapes == shapes and s.dtypes == dtypes for s in states)
    vllm_state_page = VllmMamba(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes
    assert states[0].unpadded_page_size_bytes == vllm_state_page
    # The hybrid block: vLLM grows the attention block to hold the state and pads the state to the page.
    model_cls = SimpleNamespace(
        get_mamba_state_shape_from_config=lambda c: shapes, get_mamba_state_dtype_from_config=lambda c: dtypes
    )
    block = _vllm_block_size(config, model_cls, monkeypatch)
    assert {s.block_size for s in attention} == {block}
    padded = config.cache_config.mamba_page_size_padded or vllm_state_page
    assert {s.page_size_bytes for s in states} == {padded}
