"""Packed groups (a block-outermost layout: pages of several sizes side by side in one block) and the
full-allocation fallback for MLA beside a sliding window whose pages cannot be unified (vLLM 0.32+)."""

from __future__ import annotations

import pytest
import torch

from kvspec import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SchedulerLimits,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from kvspec.contracts.release import VLLM_0_23, VLLM_0_34
from kvspec.device.kv_cache import allocate_kv_caches
from kvspec.errors import PageSizeUnificationError, PlanningError
from kvspec.planning import (
    bytes_per_block,
    full_allocation_groups,
    get_kv_cache_config_from_groups,
    get_kv_cache_configs,
    get_kv_cache_groups,
    get_max_concurrency,
    is_packed_layout,
    max_memory_usage_bytes_from_groups,
    packed_kv_cache_groups,
)
from kvspec.planning.config import KVCacheGroupSpec, KVCacheTensor
from kvspec.planning.packing import _least_padding_repeats
from kvspec.registry.builtins import default_registry

BF16, F32, U8 = torch.bfloat16, torch.float32, torch.uint8


#: vLLM 0.34 without its full-allocation fallback: a derived profile, as a user mixing rules builds one.
PADS_ONLY = VLLM_0_34.derive(full_allocation_fallback=False)


def mla(
    block_size: int = 16, head_size: int = 576, dtype: torch.dtype = F32, **kw: object
) -> MLAAttentionSpec:
    return MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=head_size, dtype=dtype, **kw)  # type: ignore[arg-type]


def indexer(block_size: int = 16) -> MLAAttentionSpec:
    """A sparse-attention indexer's keys: an MLA page much smaller than the main MLA page."""
    return mla(block_size=block_size, head_size=132, dtype=U8)


def swa_mla(head_size: int = 1024, window: int = 128, block_size: int = 16) -> SlidingWindowMLASpec:
    return SlidingWindowMLASpec(
        block_size=block_size, num_kv_heads=1, head_size=head_size, dtype=F32, sliding_window=window
    )


def glm5_like() -> dict[str, KVCacheSpec]:
    """11 x (MLA, compressed indexer, ring) and 34 linear-attention (KDA) states, all at 1024 tokens."""
    specs: dict[str, KVCacheSpec] = {}
    for i in range(11):
        specs[f"layers.{i}.attn"] = mla(block_size=1024, dtype=BF16)
        specs[f"layers.{i}.indexer"] = mla(block_size=1024, head_size=132, dtype=U8, compress_ratio=4)
        specs[f"layers.{i}.tail"] = CircularBufferSpec(
            block_size=4, num_kv_heads=2, head_size=128, head_size_v=0, dtype=BF16
        )
    for i in range(34):
        specs[f"layers.{i}.kda"] = MambaSpec(
            shapes=((3, 6144), (16, 128, 128)), dtypes=(BF16, F32), block_size=1024
        )
    return specs


def test_least_padding_repeats() -> None:
    # 11, 11, 34 in repeats of 12 pad 1 + 1 + 2 = 4, the least from 11 up (11 pads 10; 13 pads 9).
    assert _least_padding_repeats([11, 11, 34], 11) == 12
    # 3 and 5: 3 pads 1, 4 pads 4, 5 pads 2.
    assert _least_padding_repeats([3, 5], 3) == 3
    # A tie goes to the larger count: 2 and 4 pad nothing with 2, nor with 4... 4 pads 2 for the 2.
    assert _least_padding_repeats([4, 8], 1) == 4
    assert _least_padding_repeats([6], 9) == 9  # a floor above every count is the answer


def test_glm5_like_hybrid_packs_into_one_attention_group_a_ring_group_and_three_state_groups() -> None:
    specs = glm5_like()
    groups = get_kv_cache_groups(specs, pack_pages=True)
    sizes = [len(g.layer_names) for g in groups]
    assert sizes == [22, 11, 12, 11, 11]
    attn, ring, *states = groups
    assert attn.layer_names[:3] == ("layers.0.attn", "layers.0.indexer", "layers.1.attn")
    assert ring.layer_names == tuple(f"layers.{i}.tail" for i in range(11))
    assert all(isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs) for g in groups)
    # The repeats go to the state groups with a stride, so every group spans the model's depth.
    assert states[0].layer_names[:3] == ("layers.0.kda", "layers.3.kda", "layers.6.kda")
    assert states[2].layer_names[-1] == "layers.32.kda"
    # 11 x (1,179,648-byte MLA page + 33,792-byte indexer page) sets the block; it holds 12 KDA states.
    block = 11 * (1024 * 576 * 2 + 256 * 132)
    assert bytes_per_block(groups) == block == attn.kv_cache_spec.page_size_bytes
    state_page = 3 * 6144 * 2 + 16 * 128 * 128 * 4
    assert block // state_page == 12
    assert all(g.kv_cache_spec.page_size_bytes <= block for g in groups)
    # One 8192-token request: 8 attention blocks, one ring block, one state block per state group.
    limits = SchedulerLimits(max_model_len=8192)
    assert max_memory_usage_bytes_from_groups(groups, limits) == (8 + 1 + 3) * block


def test_balanced_buckets_share_one_repeat_count_and_single_size_buckets_split_to_it() -> None:
    specs: dict[str, KVCacheSpec] = {}
    for i in range(3):
        specs[f"mla.{i}"] = mla()
        specs[f"indexer.{i}"] = indexer()
    specs.update({f"swa.{i}": swa_mla() for i in range(5)})
    groups = get_kv_cache_groups(specs, pack_pages=True)
    # The MLA + indexer pattern repeats 3 times and stays whole; the 5 windows split into groups of 3 and 2
    # repeats, strided.
    assert [g.layer_names for g in groups] == [
        ("mla.0", "indexer.0", "mla.1", "indexer.1", "mla.2", "indexer.2"),
        ("swa.0", "swa.2", "swa.4"),
        ("swa.1", "swa.3"),
    ]


def test_windows_without_a_repeat_pattern_split_to_fit_the_block() -> None:
    specs = {"l.0": mla(), "l.1": swa_mla(), "mtp.0": mla(), "mtp.1": swa_mla()}
    groups = get_kv_cache_groups(specs, pack_pages=True)
    # Two 36,864-byte MLA pages make a 73,728-byte block: one 65,536-byte window page fits it.
    assert [g.layer_names for g in groups] == [("l.0", "mtp.0"), ("l.1",), ("mtp.1",)]
    assert bytes_per_block(groups) == 2 * 36864


def test_packing_needs_several_page_sizes_and_is_off_by_default() -> None:
    same_page = {
        "a": mla(),
        "b": SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype=F32, sliding_window=64),
    }
    assert packed_kv_cache_groups(same_page) is None
    mixed = {"mla": mla(), "indexer": indexer(), "swa": swa_mla()}
    with pytest.raises(PageSizeUnificationError, match="does not divide"):
        get_kv_cache_groups(mixed, profile=PADS_ONLY)
    assert len(get_kv_cache_groups(mixed, profile=PADS_ONLY, pack_pages=True)) == 2


def test_mixed_context_parallel_sharding_is_not_one_uniform_type() -> None:
    sharded, replicated = mla(), mla(dcp_sharded=False)
    assert default_registry.is_uniform_type([sharded, mla(head_size=64)])
    assert not default_registry.is_uniform_type([sharded, replicated])
    groups = get_kv_cache_groups({"t": sharded, "i": indexer(), "d": replicated}, pack_pages=True)
    assert [g.layer_names for g in groups] == [("t", "i"), ("d",)]


def test_packed_config_places_every_groups_pages_side_by_side_from_byte_0() -> None:
    specs = {"l.0": mla(), "l.1": swa_mla(), "mtp.0": mla(), "mtp.1": swa_mla()}
    groups = get_kv_cache_groups(specs, pack_pages=True)
    assert is_packed_layout(groups)
    config = get_kv_cache_config_from_groups(groups, 10 * 73728 + 5)
    assert config.num_blocks == 10
    (tensor,) = config.kv_cache_tensors
    assert tensor.size == 10 * 73728 and tensor.block_stride == 73728
    assert dict(zip(tensor.shared_by, tensor.offsets)) == {"l.0": 0, "mtp.0": 36864, "l.1": 0, "mtp.1": 0}
    limits = SchedulerLimits(max_model_len=64)
    # A request takes 4 blocks of the MLA group (64 / 16) and 5 of each window group (its 64 tokens may start
    # mid-block: the window's admission cap).
    assert get_max_concurrency(config, limits) == pytest.approx(10 / 14)


def test_packed_device_views_do_not_overlap_within_a_block() -> None:
    specs = {"l.0": mla(), "l.1": swa_mla(), "mtp.0": mla(), "mtp.1": swa_mla()}
    groups = get_kv_cache_groups(specs, pack_pages=True)
    config = get_kv_cache_config_from_groups(groups, 3 * 73728)
    caches = allocate_kv_caches(config)
    first, second = caches["l.0"], caches["mtp.0"]
    assert isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)
    assert first.shape[0] == second.shape[0] == 3
    first[1].fill_(1.0)
    assert float(second.abs().sum()) == 0.0  # the neighbour's page in the same block is untouched
    assert float(first[0].abs().sum()) == float(first[2].abs().sum()) == 0.0
    assert second.data_ptr() - first.data_ptr() == 36864
    assert first[1].data_ptr() - first[0].data_ptr() == 73728
    window = caches["mtp.1"]
    assert isinstance(window, torch.Tensor)
    assert float(window[1].abs().sum()) > 0  # groups alias: block 1 is the MLA group's while it writes it


def test_a_packed_tensor_needs_one_offset_per_layer() -> None:
    with pytest.raises(PlanningError, match="one offset per layer"):
        KVCacheTensor(size=64, shared_by=("a", "b"), block_stride=32, offsets=(0,))
    with pytest.raises(PlanningError, match="set block_stride"):
        KVCacheTensor(size=64, shared_by=("a",), offsets=(0,))


def test_packed_plans_count_the_widest_groups_bytes_per_block() -> None:
    specs = {"l.0": mla(), "l.1": swa_mla(), "mtp.0": mla(), "mtp.1": swa_mla()}
    limits = SchedulerLimits(max_model_len=64)
    (config,) = get_kv_cache_configs([specs], [20 * 73728], limits, pack_pages=True)
    assert config.num_blocks == 20
    get_kv_cache_configs(
        [specs], [14 * 73728], limits, pack_pages=True, profile=VLLM_0_23
    )  # 4 + 5 + 5 blocks needed
    with pytest.raises(PlanningError, match="needed"):
        get_kv_cache_configs([specs], [14 * 73728 - 1], limits, pack_pages=True, profile=VLLM_0_23)


def incompatible_mla_model(draft: KVCacheSpec) -> dict[str, KVCacheSpec]:
    return {"target.0.attn": mla(block_size=64), "target.0.indexer": indexer(block_size=64), "draft.0": draft}


@pytest.mark.parametrize(
    ("draft", "promoted_cls"),
    [
        (
            SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=64, dtype=F32, sliding_window=128),
            FullAttentionSpec,
        ),
        (swa_mla(head_size=576), MLAAttentionSpec),
    ],
    ids=["swa", "swa_mla"],
)
def test_mla_beside_an_incompatible_window_falls_back_to_one_full_allocation_group(
    draft: KVCacheSpec, promoted_cls: type
) -> None:
    specs = incompatible_mla_model(draft)
    with pytest.raises(PageSizeUnificationError):
        get_kv_cache_groups(specs, profile=PADS_ONLY)
    with pytest.raises(PageSizeUnificationError):
        get_kv_cache_groups(specs, profile=VLLM_0_23)
    (group,) = get_kv_cache_groups(specs)  # the default profile (0.34) falls back
    assert group.layer_names == ("target.0.attn", "target.0.indexer", "draft.0")
    spec = group.kv_cache_spec
    assert isinstance(spec, UniformTypeKVCacheSpecs) and spec.block_size == 64
    promoted = spec.kv_cache_specs["draft.0"]
    assert type(promoted) is promoted_cls
    assert promoted.block_size == 64
    assert getattr(promoted, "sliding_window") == 128  # noqa: B009 - the window is remembered
    assert specs["draft.0"] is draft
    assert spec.kv_cache_specs["target.0.attn"] is specs["target.0.attn"]


def test_the_fallback_needs_mla_and_a_window_and_no_chunked_or_own_group_layer() -> None:
    window = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=64, dtype=F32, sliding_window=128)
    assert (
        full_allocation_groups(
            {"f": FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=F32), "w": window}
        )
        is None
    )
    assert full_allocation_groups({"a": mla(block_size=64), "i": indexer(block_size=64)}) is None
    chunked = ChunkedLocalAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=64, dtype=F32, attention_chunk_size=256
    )
    assert full_allocation_groups({**incompatible_mla_model(window), "c": chunked}) is None
    assert full_allocation_groups(incompatible_mla_model(window)) is not None


def test_the_fallback_logs_that_window_compute_is_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    window = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=64, dtype=F32, sliding_window=128)
    with caplog.at_level("WARNING", logger="kvspec.planning"):
        get_kv_cache_groups(incompatible_mla_model(window), profile=VLLM_0_34)
    assert "attention compute is unchanged" in caplog.text


def test_groups_of_equal_pages_are_not_packed() -> None:
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=F32)
    groups = (
        KVCacheGroupSpec(layer_names=("a", "b"), kv_cache_spec=full),
        KVCacheGroupSpec(layer_names=("c",), kv_cache_spec=full),
    )
    assert not is_packed_layout(groups)
    assert bytes_per_block(groups) == 2 * full.page_size_bytes


def test_state_groups_split_to_fit_the_block_rather_than_widen_it() -> None:
    specs: dict[str, KVCacheSpec] = {}
    for i in range(2):
        specs[f"mla.{i}"] = mla()
        specs[f"indexer.{i}"] = indexer()
    for i in range(4):
        specs[f"ssm.{i}"] = MambaSpec(shapes=((50000,),), dtypes=(F32,), block_size=16)
    groups = get_kv_cache_groups(specs, pack_pages=True)
    # Repeats of 2 would put two 200,000-byte states in a group; one state a group keeps the block at one.
    assert [g.layer_names for g in groups[1:]] == [("ssm.0",), ("ssm.1",), ("ssm.2",), ("ssm.3",)]
    assert bytes_per_block(groups) == 200000
