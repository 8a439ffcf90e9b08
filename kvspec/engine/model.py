"""A tiny decoder with random weights whose attention reads K/V through block tables.

It exists to prove the pipeline end to end: the same greedy tokens must come out of the paged path
(with or without prefix caching) and of a plain contiguous computation. float64 keeps both paths'
rounding far from any argmax tie.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kvspec.contracts.spec import KVCacheSpec
from kvspec.device.kv_cache import gather_kv, write_kv
from kvspec.specs.attention import FullAttentionSpec, SlidingWindowSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class TinyModelConfig:
    """Shape of the tiny model. ``layer_kinds``: "full" or "sliding" per layer."""

    layer_kinds: tuple[str, ...] = ("full", "sliding", "full", "sliding")
    sliding_window: int = 24
    hidden_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    vocab_size: int = 97
    max_model_len: int = 512
    seed: int = 0
    dtype: torch.dtype = field(default=torch.float64)

    def layer_names(self) -> list[str]:
        return [f"layers.{i}" for i in range(len(self.layer_kinds))]

    def kv_cache_specs(self, block_size: int) -> dict[str, KVCacheSpec]:
        specs: dict[str, KVCacheSpec] = {}
        for name, kind in zip(self.layer_names(), self.layer_kinds, strict=True):
            heads, size = self.num_kv_heads, self.head_dim
            if kind == "sliding":
                specs[name] = SlidingWindowSpec(
                    block_size=block_size,
                    num_kv_heads=heads,
                    head_size=size,
                    dtype=self.dtype,
                    sliding_window=self.sliding_window,
                )
            else:
                specs[name] = FullAttentionSpec(
                    block_size=block_size, num_kv_heads=heads, head_size=size, dtype=self.dtype
                )
        return specs


TINY_FULL = TinyModelConfig(layer_kinds=("full", "full", "full"))
TINY_HYBRID = TinyModelConfig()


@dataclass(frozen=True, kw_only=True, slots=True)
class PagedBatch:
    """One step's tokens. ``requests``: (block-table row, first position, number of new tokens)."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    requests: Sequence[tuple[int, int, int]]
    block_tables: Mapping[str, torch.Tensor]  # layer -> [rows, blocks] on the device
    slot_mappings: Mapping[str, torch.Tensor]  # layer -> [num_tokens]


class TinyDecoder:
    """Embedding + position embedding, pre-norm attention/MLP blocks, LM head."""

    def __init__(self, config: TinyModelConfig, device: str | torch.device = "cpu") -> None:
        self.config = config
        self.device = torch.device(device)
        gen = torch.Generator().manual_seed(config.seed)
        d, h, kv, hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim

        def rand(*shape: int) -> torch.Tensor:
            weights: torch.Tensor = (
                torch.randn(*shape, generator=gen, dtype=torch.float64) / float(shape[0]) ** 0.5
            )
            return weights.to(device=self.device, dtype=config.dtype)

        self.embed = rand(config.vocab_size, d) * d**0.5
        self.pos_embed = rand(config.max_model_len, d) * d**0.5
        self.layers = [
            {
                "wq": rand(d, h * hd),
                "wk": rand(d, kv * hd),
                "wv": rand(d, kv * hd),
                "wo": rand(h * hd, d),
                "w1": rand(d, 4 * d),
                "w2": rand(4 * d, d),
            }
            for _ in config.layer_kinds
        ]
        self.lm_head = rand(d, config.vocab_size)

    def _window(self, layer: int) -> int | None:
        return self.config.sliding_window if self.config.layer_kinds[layer] == "sliding" else None

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, window: int | None
    ) -> torch.Tensor:
        """q [Tq, H, hd], k/v [Tk, KV, hd] for key positions 0..Tk-1 -> [Tq, H*hd]."""
        cfg = self.config
        rep = cfg.num_heads // cfg.num_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / cfg.head_dim**0.5
        k_pos = torch.arange(k.shape[0], device=q.device)
        visible = k_pos[None, :] <= q_pos[:, None]
        if window is not None:
            visible &= (q_pos[:, None] - k_pos[None, :]) < window
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
        return out.reshape(q.shape[0], -1)

    def forward_paged(self, batch: PagedBatch, kv_caches: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logits of each request's last scheduled token, reading and writing K/V through block tables."""
        cfg = self.config
        h = self.embed[batch.token_ids] + self.pos_embed[batch.positions]
        names = cfg.layer_names()
        for i, w in enumerate(self.layers):
            x = F.layer_norm(h, (cfg.hidden_size,))
            q = (x @ w["wq"]).view(-1, cfg.num_heads, cfg.head_dim)
            k = (x @ w["wk"]).view(-1, cfg.num_kv_heads, cfg.head_dim)
            v = (x @ w["wv"]).view(-1, cfg.num_kv_heads, cfg.head_dim)
            cache = kv_caches[names[i]]
            write_kv(cache, k, v, batch.slot_mappings[names[i]])
            table = batch.block_tables[names[i]]
            outs = []
            start = 0
            for row, first_pos, n in batch.requests:
                keys, values = gather_kv(cache, table[row], first_pos + n, cfg.head_dim)
                outs.append(
                    self._attend(
                        q[start : start + n],
                        keys,
                        values,
                        batch.positions[start : start + n],
                        self._window(i),
                    )
                )
                start += n
            h = h + torch.cat(outs) @ w["wo"]
            h = h + F.gelu(F.layer_norm(h, (cfg.hidden_size,)) @ w["w1"]) @ w["w2"]
        last = torch.cumsum(torch.tensor([n for _, _, n in batch.requests], device=h.device), 0) - 1
        return F.layer_norm(h[last], (cfg.hidden_size,)) @ self.lm_head

    def forward_contiguous(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits of the last token, recomputing attention over the whole sequence (no cache)."""
        cfg = self.config
        ids = torch.tensor(list(token_ids), device=self.device)
        pos = torch.arange(len(ids), device=self.device)
        h = self.embed[ids] + self.pos_embed[pos]
        for i, w in enumerate(self.layers):
            x = F.layer_norm(h, (cfg.hidden_size,))
            q = (x @ w["wq"]).view(-1, cfg.num_heads, cfg.head_dim)
            k = (x @ w["wk"]).view(-1, cfg.num_kv_heads, cfg.head_dim)
            v = (x @ w["wv"]).view(-1, cfg.num_kv_heads, cfg.head_dim)
            h = h + self._attend(q, k, v, pos, self._window(i)) @ w["wo"]
            h = h + F.gelu(F.layer_norm(h, (cfg.hidden_size,)) @ w["w1"]) @ w["w2"]
        return F.layer_norm(h[-1], (cfg.hidden_size,)) @ self.lm_head

    def generate_contiguous(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        """Greedy decoding without any KV cache: the reference the paged engine must match."""
        tokens = list(prompt)
        out: list[int] = []
        for _ in range(max_tokens):
            nxt = int(torch.argmax(self.forward_contiguous(tokens)))
            out.append(nxt)
            tokens.append(nxt)
        return out
