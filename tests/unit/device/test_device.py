"""Block tables, slot mapping and KV cache tensors against plain-Python computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec import FullAttentionSpec, SchedulerLimits, SlidingWindowSpec
from kvspec.device import (
    PAD_SLOT_ID,
    BlockTable,
    MultiGroupBlockTable,
    allocate_kv_caches,
    gather_kv,
    get_backend,
    map_to_kernel_blocks,
    query_start_loc_to_req_indices,
    write_kv,
)
from kvspec.errors import BlockTableError, DeviceError
from kvspec.planning import get_kv_cache_config


def table(
    *,
    block_size: int = 4,
    max_num_blocks_per_req: int = 8,
    max_num_batched_tokens: int = 64,
    kernel_block_size: int | None = None,
    cp_world_size: int = 1,
    cp_rank: int = 0,
) -> BlockTable:
    return BlockTable(
        block_size=block_size,
        max_num_reqs=4,
        max_num_blocks_per_req=max_num_blocks_per_req,
        max_num_batched_tokens=max_num_batched_tokens,
        kernel_block_size=kernel_block_size,
        cp_world_size=cp_world_size,
        cp_rank=cp_rank,
    )


def python_slots(rows: list[list[int]], req: list[int], pos: list[int], bs: int) -> list[int]:
    return [rows[r][p // bs] * bs + p % bs for r, p in zip(req, pos)]


class TestBackends:
    def test_cpu(self) -> None:
        backend = get_backend("cpu")
        assert backend.name == "cpu" and backend.block_id_dtype == torch.int32
        assert backend.slot_mapping_dtype == torch.int64 and not backend.pin_memory

    @pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
    def test_cuda_absent_is_a_clear_error(self) -> None:
        with pytest.raises(DeviceError, match="CUDA is not available"):
            get_backend("cuda:0")

    def test_npu_without_torch_npu(self) -> None:
        with pytest.raises(DeviceError, match="torch_npu"):
            get_backend("npu:0")

    def test_unknown_device(self) -> None:
        with pytest.raises(DeviceError, match="No kvspec device backend for 'meta'"):
            get_backend("meta")


class TestRows:
    def test_add_append_move_swap_clear(self) -> None:
        t = table()
        t.add_row([5, 6], 0)
        t.append_row([7], 0)
        t.add_row([9], 1)
        assert t.row(0).tolist() == [5, 6, 7] and t.row(1).tolist() == [9]
        t.move_row(0, 2)
        assert t.row(2).tolist() == [5, 6, 7]
        t.swap_row(1, 2)
        assert t.row(1).tolist() == [5, 6, 7] and t.row(2).tolist() == [9]
        t.clear_row(1)
        assert t.row(1).tolist() == [] and t.block_table.np[1].tolist() == [0] * 8
        t.add_row([1, 2], 3)
        assert t.row(3).tolist() == [1, 2]
        with pytest.raises(BlockTableError, match="room for 8"):
            t.append_row(list(range(7)), 3)

    def test_commit_copies_rows_to_device(self) -> None:
        t = table()
        t.add_row([3, 4], 0)
        t.add_row([8], 1)
        dev = t.commit_block_table(2)
        assert dev.shape == (2, 8) and dev.dtype == torch.int32
        assert dev[0, :2].tolist() == [3, 4] and dev[1, 0].item() == 8

    def test_kernel_block_split(self) -> None:
        assert map_to_kernel_blocks(np.array([0, 1, 2]), 2).tolist() == [0, 1, 2, 3, 4, 5]
        t = table(block_size=8, kernel_block_size=4)
        assert t.block_size == 4 and t.blocks_per_kv_block == 2 and t.max_num_blocks_per_req == 16
        t.add_row([3, 5], 0)
        assert t.row(0).tolist() == [6, 7, 10, 11]
        with pytest.raises(
            BlockTableError, match="kernel_block_size 3 must divide kv_manager_block_size size 8"
        ):
            table(block_size=8, kernel_block_size=3)


class TestSlotMapping:
    def test_matches_python_with_padding(self) -> None:
        t = table()
        rows = [[5, 6, 7], [9, 2]]
        for i, r in enumerate(rows):
            t.add_row(r, i)
        qsl = np.array([0, 3, 5])
        req = query_start_loc_to_req_indices(qsl)
        assert req.tolist() == [0, 0, 0, 1, 1]
        pos = np.array([3, 4, 9, 0, 7])
        slots = t.compute_slot_mapping(req, pos)
        assert slots.tolist() == python_slots(rows, req.tolist(), pos.tolist(), 4) == [23, 24, 29, 36, 11]
        assert (t.slot_mapping.np[5:] == PAD_SLOT_ID).all()
        dev = t.commit_slot_mapping()
        assert dev.dtype == torch.int64 and dev[:5].tolist() == slots.tolist() and dev[5].item() == -1

    def test_kernel_blocks_and_moved_rows(self) -> None:
        t = table(block_size=8, kernel_block_size=4)
        t.add_row([3, 5], 1)
        t.move_row(1, 0)
        slots = t.compute_slot_mapping(np.array([0, 0, 0]), np.array([0, 5, 9]))
        # position 9: allocation block 5 -> kernel block 11, offset 1
        assert slots.tolist() == [6 * 4 + 0, 7 * 4 + 1, 10 * 4 + 1]
        assert slots.tolist() == [3 * 8 + 0, 3 * 8 + 5, 5 * 8 + 1]

    def test_context_parallel_interleave(self) -> None:
        tables = [table(block_size=2, cp_world_size=2, cp_rank=r) for r in (0, 1)]
        for t in tables:
            t.add_row([4, 7], 0)
        pos = np.arange(8)
        got = [t.compute_slot_mapping(np.zeros(8, dtype=np.int64), pos).tolist() for t in tables]
        # virtual block of 4 tokens: even offsets on rank 0, odd on rank 1, each rank stores 2 per block
        assert got[0] == [8, -1, 9, -1, 14, -1, 15, -1]
        assert got[1] == [-1, 8, -1, 9, -1, 14, -1, 15]

    @settings(max_examples=60, deadline=None)
    @given(st.data())
    def test_random_batches_match_python(self, data: st.DataObject) -> None:
        bs = data.draw(st.sampled_from([1, 2, 4, 16]))
        t = table(block_size=bs, max_num_blocks_per_req=6, max_num_batched_tokens=128)
        rows = [data.draw(st.lists(st.integers(0, 1000), min_size=6, max_size=6)) for _ in range(4)]
        for i, r in enumerate(rows):
            t.add_row(r, i)
        req = data.draw(st.lists(st.integers(0, 3), max_size=100))
        pos = [data.draw(st.integers(0, 6 * bs - 1)) for _ in req]
        slots = t.compute_slot_mapping(np.array(req, dtype=np.int64), np.array(pos, dtype=np.int64))
        assert slots.tolist() == python_slots(rows, req, pos, bs)

    def test_too_many_tokens(self) -> None:
        with pytest.raises(BlockTableError, match="exceed max_num_batched_tokens"):
            table(max_num_batched_tokens=2).compute_slot_mapping(np.zeros(3, dtype=np.int64), np.arange(3))

    def test_multi_group(self) -> None:
        mg = MultiGroupBlockTable(
            max_num_reqs=2,
            max_model_len=32,
            max_num_batched_tokens=16,
            block_sizes=[4, 8],
            kernel_block_sizes=[4, 4],
        )
        assert [t.max_num_blocks_per_req for t in mg.tables] == [8, 8]
        mg.add_row([[1, 2], [3]], 0)
        slots = mg.compute_slot_mapping(np.zeros(2, dtype=np.int64), np.array([1, 6]))
        assert [s.tolist() for s in slots] == [[5, 10], [25, 30]]
        with pytest.raises(BlockTableError, match="equal length"):
            MultiGroupBlockTable(
                max_num_reqs=2,
                max_model_len=32,
                max_num_batched_tokens=16,
                block_sizes=[4],
                kernel_block_sizes=[4, 4],
            )


class TestKVCacheTensors:
    def test_shared_tensor_views_and_writes(self) -> None:
        full = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float32)
        window = SlidingWindowSpec(
            block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float32, sliding_window=8
        )
        config = get_kv_cache_config(
            {"a": full, "b": window}, full.page_size_bytes * 10, SchedulerLimits(max_model_len=16)
        )
        caches = allocate_kv_caches(config)
        a, b = caches["a"], caches["b"]
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        assert a.shape == (10, 4, 2, 16) and a.data_ptr() == b.data_ptr()  # the two groups alias one tensor
        key = torch.randn(3, 2, 8)
        value = torch.randn(3, 2, 8)
        write_kv(a, key, value, torch.tensor([9, -1, 14]))
        assert torch.equal(a[2, 1, :, :8], key[0]) and torch.equal(a[3, 2, :, 8:], value[2])
        k, v = gather_kv(a, torch.tensor([0, 0, 2, 3]), 15, 8)
        assert torch.equal(k[9], key[0]) and torch.equal(v[14], value[2])
