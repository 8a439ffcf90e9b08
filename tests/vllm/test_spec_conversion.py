"""kvspec <-> vLLM specs, against the installed vLLM itself (0.23.0 or 0.34.0: `nox -s vllm` runs both;
skipped where vLLM is absent). Pages must come out byte-identical both ways."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kvspec
from kvspec.errors import SpecConversionError
from kvspec.integrations.vllm import to_kvspec, to_vllm

vllm_specs = pytest.importorskip("vllm.v1.kv_cache_interface")

A: dict[str, Any] = dict(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
SPECS: list[kvspec.KVCacheSpec] = [
    kvspec.FullAttentionSpec(**A),
    kvspec.FullAttentionSpec(**A, head_size_v=32),
    kvspec.FullAttentionSpec(**A, kv_quant_mode=kvspec.KVQuantMode.INT8_PER_TOKEN_HEAD),
    kvspec.TQFullAttentionSpec(**A, tq_slot_size=80),
    kvspec.MLAAttentionSpec(**A, cache_dtype_str="fp8_ds_mla"),
    kvspec.MLAAttentionSpec(**A, alignment=1000),
    kvspec.HiddenStateCacheSpec(**A),
    kvspec.SinkFullAttentionSpec(**A, sink_len=32),
    kvspec.SlidingWindowSpec(**A, sliding_window=100),
    kvspec.SlidingWindowMLASpec(**A, sliding_window=100),
    kvspec.ChunkedLocalAttentionSpec(**A, attention_chunk_size=256),
    kvspec.MambaSpec(
        block_size=16,
        shapes=((4, 8), (3,)),
        dtypes=(torch.float32, torch.float16),
        mamba_cache_mode="align",
        num_speculative_blocks=1,
        mamba_type="mamba1",
    ),
    kvspec.CrossAttentionSpec(**A),
    kvspec.EncoderOnlyAttentionSpec(**A),
]


@pytest.mark.parametrize("spec", SPECS, ids=[f"{type(s).__name__}-{i}" for i, s in enumerate(SPECS)])
def test_round_trip_keeps_class_fields_and_page_size(spec: kvspec.KVCacheSpec) -> None:
    if not hasattr(vllm_specs, type(spec).__name__):  # TQFullAttentionSpec: gone in vLLM 0.34
        with pytest.raises(SpecConversionError, match=rf"defines no {type(spec).__name__}"):
            to_vllm(spec)
        return
    theirs = to_vllm(spec)
    assert type(theirs) is getattr(vllm_specs, type(spec).__name__)
    assert theirs.page_size_bytes == spec.page_size_bytes
    assert theirs.block_size == spec.block_size
    assert to_kvspec(theirs) == spec


def test_uniform_groups_convert_layer_by_layer() -> None:
    uniform = kvspec.UniformTypeKVCacheSpecs(
        block_size=16,
        kv_cache_specs={
            "a": kvspec.FullAttentionSpec(**A),
            "b": kvspec.FullAttentionSpec(**{**A, "head_size": 32}),
        },
    )
    theirs = to_vllm(uniform)
    assert theirs.page_size_bytes == uniform.page_size_bytes
    assert to_kvspec(theirs) == uniform


def test_vllm_enums_become_kvspec_values() -> None:
    theirs = vllm_specs.MambaSpec(block_size=16, shapes=((4,),), dtypes=(torch.float32,))
    ours = to_kvspec(theirs)
    assert isinstance(ours, kvspec.MambaSpec) and ours.mamba_type == "mamba2"
    quant = to_kvspec(vllm_specs.FullAttentionSpec(**A, kv_quant_mode=vllm_specs.KVQuantMode.FP8_PER_TENSOR))
    assert (
        isinstance(quant, kvspec.FullAttentionSpec)
        and quant.kv_quant_mode is kvspec.KVQuantMode.FP8_PER_TENSOR
    )


def test_a_spec_the_installed_vllm_lacks_is_refused_with_its_version() -> None:
    import vllm

    from kvspec import RSWASpec
    from kvspec.errors import SpecConversionError

    spec = RSWASpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16, rswa_window=32)
    if hasattr(vllm_specs, "RSWASpec"):  # vLLM 0.34 and later define it: the fields cross both ways
        assert to_kvspec(to_vllm(spec)) == spec
    else:
        with pytest.raises(SpecConversionError, match=f"vLLM {vllm.__version__} defines no RSWASpec"):
            to_vllm(spec)


def test_fp8_ds_mla_without_state_content_bytes_sizes_no_0_34_page() -> None:
    """vLLM 0.34 sizes a packed fp8 MLA page from ``state_content_bytes``; ``cache_dtype_str`` alone sizes
    nothing there, so kvspec's spec (whose fp8_ds_mla is 656 bytes a token) drops it to keep the page."""
    if "state_content_bytes" not in {f for f in vllm_specs.MLAAttentionSpec.__dataclass_fields__}:
        pytest.skip("vLLM 0.23 sizes fp8_ds_mla from cache_dtype_str, as kvspec does")
    fields = dict(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.float32)
    labelled = vllm_specs.MLAAttentionSpec(**fields, cache_dtype_str="fp8_ds_mla")
    ours = to_kvspec(labelled)
    assert isinstance(ours, kvspec.MLAAttentionSpec) and ours.cache_dtype_str is None
    assert ours.page_size_bytes == labelled.page_size_bytes == 64 * 576 * 4
    packed = vllm_specs.MLAAttentionSpec(
        **{**fields, "dtype": torch.uint8}, cache_dtype_str="fp8_ds_mla", state_content_bytes=656
    )
    ours = to_kvspec(packed)
    assert isinstance(ours, kvspec.MLAAttentionSpec) and ours.cache_dtype_str == "fp8_ds_mla"
    assert ours.page_size_bytes == packed.page_size_bytes == 64 * 656
