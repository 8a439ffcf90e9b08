"""Page sizes, memory bounds, merge and uniformity rules, and validation of every spec type."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvspec import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    KVQuantMode,
    MambaSpec,
    MLAAttentionSpec,
    SchedulerLimits,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    SpecValidationError,
    TQFullAttentionSpec,
    UniformTypeKVCacheSpecs,
    UnsupportedConfigurationError,
    get_kv_quant_mode,
)
from kvspec.contracts.traits import traits_of
from kvspec.errors import KVSpecTypeError, SpecMergeError, WindowSizeMismatchError
from kvspec.specs import (
    KVCacheSpecKind,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
    nvfp4_full,
)

BF16 = torch.bfloat16


def full(**kw: object) -> FullAttentionSpec:
    args: dict[str, object] = dict(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16)
    args.update(kw)
    return FullAttentionSpec(**args)  # type: ignore[arg-type]


def sw(window: int = 1024, **kw: object) -> SlidingWindowSpec:
    args: dict[str, object] = dict(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16)
    args.update(kw)
    return SlidingWindowSpec(sliding_window=window, **args)  # type: ignore[arg-type]


LIMITS = SchedulerLimits(max_model_len=4096)


class TestPageSizes:
    def test_full_attention(self) -> None:
        spec = full()
        assert spec.head_size_v == 128
        assert spec.page_size_bytes == 16 * 8 * (128 + 128) * 2 == 65_536
        assert spec.max_memory_usage_bytes(LIMITS) == 256 * 65_536 == 16_777_216

    def test_full_attention_with_context_parallel_splits_tokens(self) -> None:
        limits = SchedulerLimits(max_model_len=4096, decode_context_parallel_size=2)
        assert full().max_memory_usage_bytes(limits) == 128 * 65_536
        odd = SchedulerLimits(max_model_len=4097, prefill_context_parallel_size=2)
        assert full().max_memory_usage_bytes(odd) == 129 * 65_536  # cdiv(2049, 16)

    def test_full_attention_value_head_size(self) -> None:
        assert full(head_size=192, head_size_v=128).page_size_bytes == 16 * 8 * 320 * 2

    def test_per_token_head_quant_adds_fp32_scales(self) -> None:
        spec = full(dtype=torch.int8, kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD)
        assert spec.real_page_size_bytes == 16 * 8 * 256
        assert spec.page_size_bytes == 16 * 8 * 256 + 2 * 16 * 8 * 4 == 33_792

    def test_nvfp4(self) -> None:
        assert nvfp4_full(128) == 72
        spec = full(dtype=torch.uint8, kv_quant_mode=KVQuantMode.NVFP4)
        assert spec.page_size_bytes == 16 * 8 * (72 + 72) == 18_432
        cross = CrossAttentionSpec(
            block_size=16, num_kv_heads=8, head_size=64, dtype=torch.uint8, kv_quant_mode=KVQuantMode.NVFP4
        )
        assert cross.page_size_bytes == 2 * 16 * 8 * (32 + 4)

    def test_padding(self) -> None:
        assert full(page_size_padded=70_000).page_size_bytes == 70_000
        with pytest.raises(SpecValidationError, match="page_size_padded=1000 is smaller"):
            full(page_size_padded=1000)

    def test_turboquant(self) -> None:
        tq = TQFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16, tq_slot_size=100)
        assert tq.page_size_bytes == 16 * 8 * 100
        tq0 = TQFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16)
        assert tq0.page_size_bytes == full().page_size_bytes

    def test_mla(self) -> None:
        mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=BF16)
        assert mla.page_size_bytes == 16 * 576 * 2 == 18_432
        assert mla.max_memory_usage_bytes(LIMITS) == 256 * 18_432

    def test_mla_fp8_ds_mla_656_and_584(self) -> None:
        v3 = MLAAttentionSpec(
            block_size=64, num_kv_heads=1, head_size=576, dtype=torch.uint8, cache_dtype_str="fp8_ds_mla"
        )
        assert v3.page_size_bytes == 64 * 656
        v4 = MLAAttentionSpec(
            block_size=64,
            num_kv_heads=1,
            head_size=512,
            dtype=torch.uint8,
            cache_dtype_str="fp8_ds_mla",
            model_version="deepseek_v4",
            compress_ratio=4,
        )
        assert v4.storage_block_size == 16
        assert v4.page_size_bytes == 16 * 584
        # fp8_ds_mla without deepseek_v4 ignores compression: it is per logical token.
        v3c = dataclasses.replace(v3, compress_ratio=4)
        assert v3c.page_size_bytes == 64 * 656

    def test_mla_compress_ratio_and_alignment(self) -> None:
        comp = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=512, dtype=BF16, compress_ratio=4)
        assert comp.page_size_bytes == 16 * 512 * 2
        # max memory counts logical blocks of block_size, not storage blocks
        assert comp.max_memory_usage_bytes(LIMITS) == 64 * 16_384
        aligned = MLAAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=576, dtype=torch.uint8, alignment=4096
        )
        assert aligned.real_page_size_bytes == 9216
        assert aligned.page_size_padded == 12_288
        assert aligned.page_size_bytes == 12_288
        exact = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=512, dtype=BF16, alignment=4096)
        assert exact.page_size_padded is None
        with pytest.raises(SpecValidationError, match="compress_ratio"):
            MLAAttentionSpec(block_size=10, num_kv_heads=1, head_size=512, dtype=BF16, compress_ratio=4)

    def test_sliding_window_mla_sets_value_head_size(self) -> None:
        spec = SlidingWindowMLASpec(
            block_size=64, num_kv_heads=1, head_size=512, dtype=BF16, sliding_window=128, compress_ratio=4
        )
        assert spec.head_size_v == 512  # vLLM 0.23 leaves it None
        assert spec.page_size_bytes == 16 * 512 * 2
        v4 = dataclasses.replace(spec, cache_dtype_str="fp8_ds_mla", model_version="deepseek_v4")
        assert v4.page_size_bytes == 16 * 584
        with pytest.raises(SpecValidationError, match="model_version"):
            dataclasses.replace(spec, model_version="deepseek_v3")

    def test_sliding_window_admission_bound(self) -> None:
        spec = sw(1024)
        limits = SchedulerLimits(max_model_len=16_384, max_num_batched_tokens=1024)
        assert spec.max_admission_blocks_per_request(1024, 16_384) == 129
        assert spec.max_memory_usage_bytes(limits) == 129 * 65_536
        capped = SchedulerLimits(max_model_len=100, max_num_batched_tokens=1024)
        assert spec.max_memory_usage_bytes(capped) == (7 + 1) * 65_536
        with pytest.raises(UnsupportedConfigurationError, match="decode context parallelism"):
            spec.max_memory_usage_bytes(SchedulerLimits(max_model_len=100, decode_context_parallel_size=2))

    def test_chunked_local(self) -> None:
        spec = ChunkedLocalAttentionSpec(
            block_size=16, num_kv_heads=8, head_size=128, dtype=BF16, attention_chunk_size=8192
        )
        assert spec.page_size_bytes == 2 * 16 * 8 * 128 * 2
        limits = SchedulerLimits(max_model_len=32_768, max_num_batched_tokens=2048)
        assert spec.max_memory_usage_bytes(limits) == 640 * 65_536
        short = SchedulerLimits(max_model_len=1000, max_num_batched_tokens=2048)
        assert spec.max_memory_usage_bytes(short) == 63 * 65_536

    def test_mamba_modes(self) -> None:
        spec = MambaSpec(
            block_size=16,
            shapes=((16, 64), (8, 32, 32)),
            dtypes=(BF16, torch.float32),
            num_speculative_blocks=2,
        )
        assert spec.page_size_bytes == 16 * 64 * 2 + 8 * 32 * 32 * 4 == 34_816
        none = SchedulerLimits(max_model_len=1000)
        align = SchedulerLimits(max_model_len=1000, mamba_cache_mode="align")
        every = SchedulerLimits(max_model_len=1000, mamba_cache_mode="all")
        assert spec.max_memory_usage_bytes(none) == 3 * 34_816
        assert spec.max_memory_usage_bytes(align) == 4 * 34_816
        assert spec.max_memory_usage_bytes(every) == (63 + 2) * 34_816
        padded = dataclasses.replace(spec, page_size_padded=40_000)
        assert padded.page_size_bytes == 40_000
        # A prefill checkpoint block (vLLM 0.34's Mamba2 / GDN layers) is one more "align" state per request.
        checkpointed = dataclasses.replace(
            spec, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1
        )
        assert checkpointed.max_memory_usage_bytes(align) == 5 * 34_816
        assert checkpointed.max_memory_usage_bytes(none) == 3 * 34_816
        assert not spec.is_uniform_with_collection([spec, checkpointed])
        with pytest.raises(SpecValidationError, match="num_prefill_checkpoint_blocks"):
            dataclasses.replace(spec, num_prefill_checkpoint_blocks=-1)
        with pytest.raises(SpecValidationError, match="prefill_checkpoint_alignment"):
            dataclasses.replace(spec, prefill_checkpoint_alignment=0)

    def test_cross_and_encoder_only(self) -> None:
        cross = CrossAttentionSpec(block_size=16, num_kv_heads=8, head_size=64, dtype=BF16)
        limits = SchedulerLimits(max_model_len=448, max_num_encoder_input_tokens=1500)
        assert cross.max_memory_usage_bytes(limits) == 94 * (2 * 16 * 8 * 64 * 2)
        enc = EncoderOnlyAttentionSpec(block_size=16, num_kv_heads=8, head_size=64, dtype=BF16)
        assert enc.max_memory_usage_bytes(limits) == 0

    def test_uniform_type_specs(self) -> None:
        a, b = full(), full(head_size=64)
        uni = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": a, "b": b})
        assert uni.page_size_bytes == 65_536 + 32_768
        assert uni.max_memory_usage_bytes(LIMITS) == 256 * 98_304
        assert uni.get_page_sizes() == [65_536, 32_768]
        assert hash(uni) == hash(UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": a, "b": b}))
        assert uni.copy_with_new_block_size(32).kv_cache_specs["a"].block_size == 32
        # The layers share block ids, so a request takes the hungriest layer's blocks: full attention's 256
        # over 4,096 tokens, not the 81 of a 1,024-token window with 256-token steps.
        mixed = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"w": sw(), "a": a})
        steps = SchedulerLimits(max_model_len=4096, max_num_batched_tokens=256)
        assert sw().max_memory_usage_bytes(steps) == 81 * sw().page_size_bytes
        assert mixed.max_memory_usage_pages(steps) == 256
        with pytest.raises(SpecValidationError, match="layer 'b' has block_size=32"):
            UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": a, "b": full(block_size=32)})

    def test_copy_with_new_block_size(self) -> None:
        assert full().copy_with_new_block_size(32).page_size_bytes == 2 * 65_536
        assert sw().copy_with_new_block_size(32).sliding_window == 1024


class TestValidation:
    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("block_size", 0),
            ("num_kv_heads", -1),
            ("head_size", 0),
            ("head_size_v", 0),
            ("sliding_window", 0),
        ],
    )
    def test_field_must_be_positive(self, field: str, value: int) -> None:
        with pytest.raises(SpecValidationError, match=f"FullAttentionSpec.{field} must be a positive int"):
            full(**{field: value})

    def test_dtype_must_be_torch_dtype(self) -> None:
        with pytest.raises(KVSpecTypeError):
            full(dtype="bfloat16")

    def test_type_errors_are_kvspec_errors(self) -> None:
        with pytest.raises(KVSpecTypeError, match="block_size"):
            full(block_size="16")

    def test_window_and_chunk_are_exclusive(self) -> None:
        with pytest.raises(SpecValidationError, match="at most one of them"):
            full(sliding_window=8, attention_chunk_size=16)

    def test_sliding_window_must_be_positive(self) -> None:
        with pytest.raises(SpecValidationError, match=r"SlidingWindowSpec\.sliding_window"):
            sw(0)

    def test_mamba_validation(self) -> None:
        with pytest.raises(SpecValidationError, match="one dtype per state shape"):
            MambaSpec(block_size=16, shapes=((4,),), dtypes=())
        with pytest.raises(SpecValidationError, match="non-empty tuples of positive ints"):
            MambaSpec(block_size=16, shapes=((4, 0),), dtypes=(BF16,))
        with pytest.raises((SpecValidationError, KVSpecTypeError), match="mamba_cache_mode"):
            MambaSpec(block_size=16, shapes=((4,),), dtypes=(BF16,), mamba_cache_mode="sometimes")  # type: ignore[arg-type]

    def test_scheduler_limits_validation(self) -> None:
        with pytest.raises(SpecValidationError, match="max_model_len"):
            SchedulerLimits(max_model_len=0)
        assert SchedulerLimits(max_model_len=10).batched_tokens == 10
        with pytest.raises(SpecValidationError, match="mamba_cache_mode"):
            SchedulerLimits(max_model_len=10, mamba_cache_mode="x")  # type: ignore[arg-type]

    def test_specs_are_frozen_and_hashable(self) -> None:
        spec = full()
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.block_size = 32  # type: ignore[misc]
        assert {spec: 1}[full()] == 1

    def test_sink_len_validated(self) -> None:
        with pytest.raises(SpecValidationError, match="sink_len"):
            SinkFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16, sink_len=0)


class TestMerge:
    def test_equal_specs_merge(self) -> None:
        assert FullAttentionSpec.merge([full(), full()]) == full()

    def test_different_heads_do_not_merge(self) -> None:
        with pytest.raises(SpecMergeError, match="'num_kv_heads' differs \\(8 vs 4\\)"):
            FullAttentionSpec.merge([full(), full(num_kv_heads=4)])

    def test_full_and_sliding_window_do_not_merge_in_either_order(self) -> None:
        # The built-ins' merge takes list[Any] (a vLLM-style `list[Self]` override then type-checks under
        # every checker), so a mixed list is refused here, at run time, not by the checker.
        with pytest.raises(SpecMergeError, match="same spec type"):
            FullAttentionSpec.merge([full(), sw()])
        with pytest.raises(SpecMergeError, match="same spec type"):
            SlidingWindowSpec.merge([sw(), full()])
        with pytest.raises(SpecMergeError, match="got a FullAttentionSpec, which is not a SlidingWindowSpec"):
            SlidingWindowSpec.merge([full()])

    def test_different_windows_raise_window_mismatch(self) -> None:
        with pytest.raises(WindowSizeMismatchError, match="same sliding_window"):
            FullAttentionSpec.merge([full(sliding_window=1), full(sliding_window=2)])

    def test_window_merges_with_none(self) -> None:
        merged = FullAttentionSpec.merge([full(sliding_window=1), full()])
        assert merged.sliding_window == 1
        assert FullAttentionSpec.merge([full(), full(attention_chunk_size=8)]).attention_chunk_size == 8

    def test_window_and_chunk_in_one_group_do_not_merge(self) -> None:
        with pytest.raises(SpecMergeError, match="mix sliding_window"):
            FullAttentionSpec.merge([full(sliding_window=4), full(attention_chunk_size=8)])

    def test_mla_merge(self) -> None:
        a = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=BF16)
        b = dataclasses.replace(a, cache_dtype_str="fp8_ds_mla")
        assert MLAAttentionSpec.merge([a, a]).cache_dtype_str is None
        assert MLAAttentionSpec.merge([b, b]).cache_dtype_str == "fp8_ds_mla"
        with pytest.raises(SpecMergeError, match="cache_dtype_str"):
            MLAAttentionSpec.merge([a, b])
        with pytest.raises(SpecMergeError):
            FullAttentionSpec.merge([full(), a])
        with pytest.raises(SpecMergeError, match="same spec type"):
            MLAAttentionSpec.merge([a, full()])

    def test_subclass_fields_are_compared(self) -> None:
        tq1 = TQFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16, tq_slot_size=100)
        tq2 = dataclasses.replace(tq1, tq_slot_size=120)
        assert TQFullAttentionSpec.merge([tq1, tq1]).tq_slot_size == 100
        with pytest.raises(SpecMergeError, match="tq_slot_size"):
            TQFullAttentionSpec.merge([tq1, tq2])
        sink = SinkFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16, sink_len=16)
        with pytest.raises(SpecMergeError, match="sink_len"):
            SinkFullAttentionSpec.merge([sink, dataclasses.replace(sink, sink_len=32)])
        # a TurboQuant spec never silently merges into a plain one (vLLM would drop tq_slot_size)
        with pytest.raises(SpecMergeError, match="same spec type"):
            FullAttentionSpec.merge([full(), tq1])

    def test_empty_merge(self) -> None:
        with pytest.raises(SpecMergeError, match="at least one"):
            FullAttentionSpec.merge([])

    def test_mamba_merge(self) -> None:
        m = MambaSpec(block_size=16, shapes=((4,),), dtypes=(BF16,))
        assert MambaSpec.merge([m, m]) is m
        with pytest.raises(SpecMergeError, match="num_speculative_blocks"):
            MambaSpec.merge([m, dataclasses.replace(m, num_speculative_blocks=1)])


class TestKinds:
    def test_quant_mode_strings(self) -> None:
        assert get_kv_quant_mode("auto") is KVQuantMode.NONE
        assert get_kv_quant_mode("fp8_e4m3") is KVQuantMode.FP8_PER_TENSOR
        assert get_kv_quant_mode("int8_per_token_head") is KVQuantMode.INT8_PER_TOKEN_HEAD
        assert get_kv_quant_mode("fp8_per_token_head") is KVQuantMode.FP8_PER_TOKEN_HEAD
        assert get_kv_quant_mode("nvfp4") is KVQuantMode.NVFP4
        assert KVQuantMode.FP8_PER_TOKEN_HEAD.is_per_token_head
        assert not KVQuantMode.FP8_PER_TENSOR.is_per_token_head

    def test_specific_kinds_win(self) -> None:
        mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=BF16)
        hidden = HiddenStateCacheSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=BF16)
        swmla = SlidingWindowMLASpec(
            block_size=16, num_kv_heads=1, head_size=576, dtype=BF16, sliding_window=8
        )
        sink = SinkFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16, sink_len=16)
        assert get_kv_cache_spec_kind(mla) is KVCacheSpecKind.MLA_ATTENTION
        assert get_kv_cache_spec_kind(hidden) is KVCacheSpecKind.MLA_ATTENTION
        assert get_kv_cache_spec_kind(swmla) is KVCacheSpecKind.SLIDING_WINDOW_MLA
        assert get_kv_cache_spec_kind(sink) is KVCacheSpecKind.SINK_FULL_ATTENTION
        assert get_kv_cache_spec_kind(full()) is KVCacheSpecKind.FULL_ATTENTION

    def test_uniform_type_kinds(self) -> None:
        same = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full(), "b": full(head_size=64)})
        mixed = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full(), "b": sw()})
        assert get_kv_cache_spec_kind(same) is KVCacheSpecKind.FULL_ATTENTION
        assert get_kv_cache_spec_kind(mixed) is KVCacheSpecKind.UNKNOWN
        assert not traits_of(same).kind_merged and not traits_of(mixed).kind_merged
        # Full-attention layers of different kinds (one uniform base): full attention, as vLLM 0.34 says.
        mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=BF16)
        sink = SinkFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16, sink_len=16)
        for other in (mla, sink):
            merged = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full(), "b": other})
            assert get_kv_cache_spec_kind(merged) is KVCacheSpecKind.FULL_ATTENTION
            assert traits_of(merged).kind_merged
        with_window = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": sink, "b": sw()})
        assert get_kv_cache_spec_kind(with_window) is KVCacheSpecKind.UNKNOWN

    def test_sliding_window_reporting(self) -> None:
        assert get_kv_cache_spec_sliding_window(sw(64)) == 64
        assert get_kv_cache_spec_sliding_window(full(sliding_window=64)) is None
        uni = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": sw(64), "b": sw(64, head_size=64)})
        assert get_kv_cache_spec_sliding_window(uni) == 64
