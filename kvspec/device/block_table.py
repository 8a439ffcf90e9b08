"""Per-request rows of block ids for a batch, and the slot mapping that tells kernels where to write.

Rows are edited on a host (numpy) view; ``commit_block_table`` copies the used rows to the device in
one non-blocking copy per step (from pinned memory where the device supports it). Slot mapping is
vectorised: ``slot = block_table[req, pos // B] * B + pos % B`` for every token at once, -1 for
padding and for tokens another context-parallel rank stores.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from kvspec.contracts.checking import check_api
from kvspec.device.backends import DeviceBackend, get_backend
from kvspec.errors import BlockTableError
from kvspec.intmath import cdiv

PAD_SLOT_ID = -1
IntArray = npt.NDArray[np.int64] | npt.NDArray[np.int32]


class HostDeviceBuffer:
    """A host tensor (pinned if the backend allows), its numpy view, and a device twin."""

    __slots__ = ("cpu", "device", "np")

    def __init__(self, *shape: int, dtype: torch.dtype, backend: DeviceBackend) -> None:
        self.cpu = torch.zeros(*shape, dtype=dtype, pin_memory=backend.pin_memory)
        self.np = self.cpu.numpy()
        self.device = torch.zeros(*shape, dtype=dtype, device=backend.device)

    def copy_to_device(self, n: int | None = None) -> torch.Tensor:
        """Non-blocking copy of the first ``n`` rows (all if None); returns the device slice."""
        if n is None:
            self.device.copy_(self.cpu, non_blocking=True)
            return self.device
        self.device[:n].copy_(self.cpu[:n], non_blocking=True)
        return self.device[:n]


def map_to_kernel_blocks(block_ids: IntArray, blocks_per_kv_block: int) -> IntArray:
    """Split each allocation block into ``k`` kernel blocks: id -> id*k + [0..k)."""
    if blocks_per_kv_block == 1:
        return block_ids
    offsets = np.arange(blocks_per_kv_block, dtype=np.int64)
    out: IntArray = (block_ids.astype(np.int64).reshape(-1, 1) * blocks_per_kv_block + offsets).reshape(-1)
    return out


class BlockTable:
    """Block ids of up to ``max_num_reqs`` requests for one KV cache group.

    ``block_size`` is the allocation (manager) block size in tokens; a smaller ``kernel_block_size``
    makes each allocation block ``block_size // kernel_block_size`` kernel blocks.
    """

    @check_api
    def __init__(
        self,
        *,
        block_size: int,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        max_num_batched_tokens: int,
        device: str | torch.device = "cpu",
        kernel_block_size: int | None = None,
        cp_world_size: int = 1,
        cp_rank: int = 0,
        cp_kv_cache_interleave_size: int = 1,
    ) -> None:
        kernel = block_size if kernel_block_size is None else kernel_block_size
        if min(block_size, kernel, max_num_reqs, max_num_blocks_per_req, max_num_batched_tokens) <= 0:
            raise BlockTableError("BlockTable sizes must all be positive.")
        if block_size % kernel:
            raise BlockTableError(
                f"kernel_block_size {kernel} must divide kv_manager_block_size size {block_size} evenly"
            )
        if not 0 <= cp_rank < cp_world_size:
            raise BlockTableError(f"cp_rank {cp_rank} is outside [0, {cp_world_size}).")
        self.backend = get_backend(device)
        self.manager_block_size = block_size
        self.block_size = kernel
        self.blocks_per_kv_block = block_size // kernel
        self.max_num_reqs = max_num_reqs
        self.max_num_blocks_per_req = max_num_blocks_per_req * self.blocks_per_kv_block
        self.max_num_batched_tokens = max_num_batched_tokens
        self.cp_world_size = cp_world_size
        self.cp_rank = cp_rank
        self.cp_interleave = cp_kv_cache_interleave_size
        self.block_table = HostDeviceBuffer(
            max_num_reqs, self.max_num_blocks_per_req, dtype=self.backend.block_id_dtype, backend=self.backend
        )
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)
        self.slot_mapping = HostDeviceBuffer(
            max_num_batched_tokens, dtype=self.backend.slot_mapping_dtype, backend=self.backend
        )

    # -- rows ---------------------------------------------------------------------------------

    def append_row(self, block_ids: Sequence[int] | IntArray, row_idx: int) -> None:
        """Append allocation block ids to a row (mapped to kernel blocks)."""
        if len(block_ids) == 0:
            return
        ids = map_to_kernel_blocks(np.asarray(block_ids, dtype=np.int64), self.blocks_per_kv_block)
        start = int(self.num_blocks_per_row[row_idx])
        end = start + len(ids)
        if end > self.max_num_blocks_per_req:
            raise BlockTableError(
                f"Row {row_idx} would hold {end} blocks; the table has room for {self.max_num_blocks_per_req}."
            )
        self.block_table.np[row_idx, start:end] = ids
        self.num_blocks_per_row[row_idx] = end

    def add_row(self, block_ids: Sequence[int] | IntArray, row_idx: int) -> None:
        """Replace a row's blocks."""
        self.num_blocks_per_row[row_idx] = 0
        self.append_row(block_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        n = int(self.num_blocks_per_row[row_idx])
        self.block_table.np[row_idx, :n] = 0
        self.num_blocks_per_row[row_idx] = 0

    def move_row(self, src: int, tgt: int) -> None:
        n = int(self.num_blocks_per_row[src])
        self.block_table.np[tgt, :n] = self.block_table.np[src, :n]
        self.num_blocks_per_row[tgt] = n

    def swap_row(self, src: int, tgt: int) -> None:
        self.num_blocks_per_row[[src, tgt]] = self.num_blocks_per_row[[tgt, src]]
        self.block_table.np[[src, tgt]] = self.block_table.np[[tgt, src]]

    def clear(self) -> None:
        self.block_table.cpu.zero_()
        self.block_table.device.zero_()
        self.num_blocks_per_row[:] = 0

    def row(self, row_idx: int) -> IntArray:
        out: IntArray = self.block_table.np[row_idx, : self.num_blocks_per_row[row_idx]]
        return out

    # -- device -------------------------------------------------------------------------------

    def commit_block_table(self, num_reqs: int) -> torch.Tensor:
        """One non-blocking host-to-device copy of the first ``num_reqs`` rows."""
        return self.block_table.copy_to_device(num_reqs)

    def compute_slot_mapping(self, req_indices: IntArray, positions: IntArray) -> IntArray:
        """Slots of tokens (row ``req_indices[i]``, position ``positions[i]``) into the host buffer.

        Tokens after the last are padded with -1 up to ``max_num_batched_tokens``.
        """
        n = len(positions)
        if n > self.max_num_batched_tokens:
            raise BlockTableError(f"{n} tokens exceed max_num_batched_tokens={self.max_num_batched_tokens}.")
        out = self.slot_mapping.np
        bs = self.block_size
        cp = self.cp_world_size
        if cp == 1:
            block_numbers = self.block_table.np[req_indices, positions // bs]
            np.add(
                block_numbers.astype(np.int64, copy=False) * bs, positions % bs, out=out[:n], casting="unsafe"
            )
        else:
            interleave = self.cp_interleave
            virtual = bs * cp
            block_numbers = self.block_table.np[req_indices, positions // virtual].astype(np.int64)
            voff = positions % virtual
            local = (voff // interleave) % cp == self.cp_rank
            loff = (voff // (cp * interleave)) * interleave + voff % interleave
            out[:n] = np.where(local, block_numbers * bs + loff, PAD_SLOT_ID)
        out[n:] = PAD_SLOT_ID
        result: IntArray = out[:n]
        return result

    def commit_slot_mapping(self, num_tokens: int | None = None) -> torch.Tensor:
        """Copy the slot mapping (padding included when ``num_tokens`` is None) to the device."""
        return self.slot_mapping.copy_to_device(num_tokens)


class MultiGroupBlockTable:
    """One BlockTable per KV cache group, updated together (each group has its own block ids)."""

    @check_api
    def __init__(
        self,
        *,
        max_num_reqs: int,
        max_model_len: int,
        max_num_batched_tokens: int,
        block_sizes: Sequence[int],
        device: str | torch.device = "cpu",
        kernel_block_sizes: Sequence[int] | None = None,
        max_num_blocks: Sequence[int] | None = None,
        cp_world_size: int = 1,
        cp_rank: int = 0,
        cp_kv_cache_interleave_size: int = 1,
    ) -> None:
        kernels = list(block_sizes) if kernel_block_sizes is None else list(kernel_block_sizes)
        if len(kernels) != len(block_sizes):
            raise BlockTableError(
                f"block_sizes ({len(block_sizes)}) and kernel_block_sizes ({len(kernels)}) must have equal length."
            )
        if max_num_blocks is None:
            max_num_blocks = [cdiv(max_model_len, bs * cp_world_size) for bs in block_sizes]
        self.tables = [
            BlockTable(
                block_size=bs,
                max_num_reqs=max_num_reqs,
                max_num_blocks_per_req=nb,
                max_num_batched_tokens=max_num_batched_tokens,
                device=device,
                kernel_block_size=k,
                cp_world_size=cp_world_size,
                cp_rank=cp_rank,
                cp_kv_cache_interleave_size=cp_kv_cache_interleave_size,
            )
            for bs, k, nb in zip(block_sizes, kernels, max_num_blocks, strict=True)
        ]

    def __getitem__(self, group: int) -> BlockTable:
        return self.tables[group]

    def __len__(self) -> int:
        return len(self.tables)

    def append_row(self, block_ids: Sequence[Sequence[int]], row_idx: int) -> None:
        for table, ids in zip(self.tables, block_ids, strict=True):
            table.append_row(ids, row_idx)

    def add_row(self, block_ids: Sequence[Sequence[int]], row_idx: int) -> None:
        for table, ids in zip(self.tables, block_ids, strict=True):
            table.add_row(ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        for table in self.tables:
            table.clear_row(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        for table in self.tables:
            table.move_row(src, tgt)

    def swap_row(self, src: int, tgt: int) -> None:
        for table in self.tables:
            table.swap_row(src, tgt)

    def commit_block_table(self, num_reqs: int) -> list[torch.Tensor]:
        return [table.commit_block_table(num_reqs) for table in self.tables]

    def compute_slot_mapping(self, req_indices: IntArray, positions: IntArray) -> list[IntArray]:
        return [table.compute_slot_mapping(req_indices, positions) for table in self.tables]

    def commit_slot_mapping(self, num_tokens: int | None = None) -> list[torch.Tensor]:
        return [table.commit_slot_mapping(num_tokens) for table in self.tables]

    def clear(self) -> None:
        for table in self.tables:
            table.clear()


def query_start_loc_to_req_indices(query_start_loc: IntArray) -> IntArray:
    """[0, 3, 5] -> [0, 0, 0, 1, 1]: the row of every scheduled token."""
    counts = np.diff(query_start_loc)
    out: IntArray = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    return out
