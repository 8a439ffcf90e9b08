"""The worker side of the reference engine: block-table rows, slot mapping, KV caches and the model."""

from __future__ import annotations

import numpy as np
import torch

from kvspec.device.block_table import MultiGroupBlockTable
from kvspec.device.kv_cache import allocate_kv_caches
from kvspec.engine.model import PagedBatch, TinyDecoder
from kvspec.engine.scheduler import SchedulerOutput
from kvspec.errors import KVSpecError
from kvspec.planning.config import KVCacheConfig


class ModelRunner:
    """Keeps one block-table row per running request and runs the tiny model on each step's batch."""

    def __init__(
        self,
        model: TinyDecoder,
        config: KVCacheConfig,
        *,
        max_num_reqs: int,
        max_num_batched_tokens: int,
        device: str | torch.device = "cpu",
    ) -> None:
        self.model = model
        self.device = torch.device(device)
        caches = allocate_kv_caches(config, self.device)
        self.kv_caches: dict[str, torch.Tensor] = {}
        for name, cache in caches.items():
            if not isinstance(cache, torch.Tensor):
                raise KVSpecError(f"The tiny model has attention layers only; {name} is not one.")
            self.kv_caches[name] = cache
        self.layer_group = {n: gid for gid, g in enumerate(config.kv_cache_groups) for n in g.layer_names}
        self.block_tables = MultiGroupBlockTable(
            max_num_reqs=max_num_reqs,
            max_model_len=model.config.max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            block_sizes=[g.kv_cache_spec.block_size for g in config.kv_cache_groups],
            device=self.device,
        )
        self.rows: dict[str, int] = {}
        self.free_rows = list(range(max_num_reqs - 1, -1, -1))

    def release(self, request_id: str) -> None:
        row = self.rows.pop(request_id, None)
        if row is not None:
            self.block_tables.clear_row(row)
            self.free_rows.append(row)

    def execute(self, output: SchedulerOutput) -> list[int]:
        """Run the scheduled tokens; return the greedy next token of each scheduled request."""
        for request in output.preempted:
            self.release(request.request_id)
        token_ids: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        requests: list[tuple[int, int, int]] = []
        for item in output.scheduled:
            rid = item.request.request_id
            if item.resumed or rid not in self.rows:
                self.release(rid)
                row = self.free_rows.pop()
                self.rows[rid] = row
                self.block_tables.add_row(item.new_block_ids, row)
            else:
                row = self.rows[rid]
                self.block_tables.append_row(item.new_block_ids, row)
            first, n = item.num_computed, item.num_new_tokens
            token_ids.extend(item.request.all_token_ids[first : first + n])
            positions.extend(range(first, first + n))
            rows.extend([row] * n)
            requests.append((row, first, n))
        pos = np.asarray(positions, dtype=np.int64)
        req_idx = np.asarray(rows, dtype=np.int64)
        num_rows = max(self.rows.values()) + 1
        self.block_tables.compute_slot_mapping(req_idx, pos)
        tables = self.block_tables.commit_block_table(num_rows)
        slots = self.block_tables.commit_slot_mapping(len(pos))
        names = self.model.config.layer_names()
        batch = PagedBatch(
            token_ids=torch.tensor(token_ids, device=self.device),
            positions=torch.from_numpy(pos).to(self.device),
            requests=requests,
            block_tables={n: tables[self.layer_group[n]] for n in names},
            slot_mappings={n: slots[self.layer_group[n]] for n in names},
        )
        logits = self.model.forward_paged(batch, self.kv_caches)
        return [int(t) for t in torch.argmax(logits, dim=-1).tolist()]
