"""A decoder's layers from its family's rules: which caches each layer holds, the attention's size, the
state's shapes; then the one hybrid rule every family shares (the attention block grows to hold a state).

:func:`build_decoder` is what a decoder family's ``build`` runs; a family says only what differs
(:class:`DecoderRules`: its layer pattern, its attention dims, its state layout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kvspec.contracts.spec import KVCacheSpec, MambaCacheMode
from kvspec.errors import ModelConfigError
from kvspec.intmath import cdiv
from kvspec.models.config_reader import ConfigReader, LayerCaches
from kvspec.models.state_shapes import StateLayout
from kvspec.specs.attention import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec
from kvspec.specs.dtypes import KVQuantMode, dtype_size
from kvspec.specs.mamba import MambaSpec

#: Attention block sizes are kept a multiple of this when padded up to hold a Mamba state.
KERNEL_BLOCK_ALIGNMENT = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class BuildSettings:
    """How to size a model's caches: ``block_size`` (tokens), the KV cache's dtype and quantisation, the
    model's dtype (states take it), tensor parallelism, the user's ``max_model_len`` (None: the model's),
    the Mamba cache mode and ``align_to_block_size`` (vLLM 0.34's hybrid block rule; 0.23 grew by 16)."""

    block_size: int
    kv_dtype: torch.dtype
    quant: KVQuantMode
    kv_cache_dtype: str
    model_dtype: torch.dtype
    tp: int
    max_model_len: int | None
    mamba_cache_mode: MambaCacheMode
    align_to_block_size: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class FamilyLayers:
    """What a family builds: one spec per cache layer, the model's context length (tokens), the encoder's
    input tokens (0 for a decoder) and notes for the user."""

    specs: dict[str, KVCacheSpec]
    max_len: int
    encoder_tokens: int = 0
    notes: tuple[str, ...] = ()


class DecoderRules(Protocol):
    """The rules of a decoder family that :func:`build_decoder` asks for."""

    @property
    def default_max_positions(self) -> Mapping[str, int]: ...

    def layer_caches(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]: ...

    def attention_dims(self, config: ConfigReader, tp: int) -> tuple[int, int]: ...

    def state_layout(self, config: ConfigReader, tp: int, model_dtype: torch.dtype) -> StateLayout: ...


_SUFFIX = {"full": "self_attn", "sliding": "self_attn", "chunked": "self_attn", "state": "mamba"}


def build_decoder(rules: DecoderRules, config: ConfigReader, settings: BuildSettings) -> FamilyLayers:
    """One spec per cache layer ("model.layers.{i}", or ".self_attn" / ".mamba" for a layer holding both),
    state layers sharing one :class:`MambaSpec` whose page the attention page matches (vLLM 0.34's
    ``Platform._align_hybrid_block_size``)."""
    num_layers = config.positive_int("num_hidden_layers")
    max_len = config.max_positions(settings.max_model_len, rules.default_max_positions)
    kinds = rules.layer_caches(config, num_layers)
    attention_layers = sum(1 for layer in kinds for k in layer if k != "state")
    kv_heads, head_dim = rules.attention_dims(config, settings.tp) if attention_layers else (1, 1)
    notes: list[str] = []
    block_size = settings.block_size
    state_spec: MambaSpec | None = None
    if any("state" in layer for layer in kinds):
        if not attention_layers:
            raise ModelConfigError(
                f"{config.model_type} config has no attention layer: a model of state layers only is not "
                "supported."
            )
        state = rules.state_layout(config, settings.tp, settings.model_dtype)
        state_spec, block_size = _hybrid_state(state, kv_heads * head_dim, settings, max_len, notes)
    common: dict[str, Any] = dict(
        block_size=block_size,
        num_kv_heads=kv_heads,
        head_size=head_dim,
        dtype=settings.kv_dtype,
        kv_quant_mode=settings.quant,
    )
    specs: dict[str, KVCacheSpec] = {}
    for i, layer_kinds in enumerate(kinds):
        for kind in layer_kinds:
            layer = f"model.layers.{i}" if len(layer_kinds) == 1 else f"model.layers.{i}.{_SUFFIX[kind]}"
            if kind == "state":
                assert state_spec is not None
                specs[layer] = state_spec
            elif kind == "sliding":
                specs[layer] = SlidingWindowSpec(sliding_window=config.window("sliding_window"), **common)
            elif kind == "chunked":
                specs[layer] = ChunkedLocalAttentionSpec(
                    attention_chunk_size=config.window("attention_chunk_size"), **common
                )
            else:
                specs[layer] = FullAttentionSpec(**common)
    skipped = sum(1 for layer in kinds if not layer)
    if skipped:
        notes.append(f"{skipped} of {num_layers} layers hold no cache (MLP or MoE only)")
    return FamilyLayers(specs=specs, max_len=max_len, notes=tuple(notes))


def _hybrid_state(
    state: StateLayout, kv_width: int, settings: BuildSettings, max_len: int, notes: list[str]
) -> tuple[MambaSpec, int]:
    """The state layers' spec and the attention block size that holds one state (``kv_width``: KV heads x
    head size of one attention layer on one rank)."""
    checkpoints = state.prefill_checkpoints
    block_size = settings.block_size
    spec = MambaSpec(
        block_size=block_size,
        shapes=state.shapes,
        dtypes=state.dtypes,
        mamba_type=state.mamba_type,
        mamba_cache_mode=settings.mamba_cache_mode,
        num_prefill_checkpoint_blocks=checkpoints,
        prefill_checkpoint_alignment=1 if checkpoints else None,
    )
    state_page = spec.unpadded_page_size_bytes
    attn_per_token = 2 * kv_width * dtype_size(settings.kv_dtype)
    # vLLM 0.34 (Platform._align_hybrid_block_size): the attention page must hold a whole state, so the
    # attention block grows in steps of the larger of the kernel's block (16) and the block size the user or
    # the release set (0.23 grew it in steps of 16 alone); the state page is padded to match.
    step = max(KERNEL_BLOCK_ALIGNMENT, block_size) if settings.align_to_block_size else KERNEL_BLOCK_ALIGNMENT
    needed = step * cdiv(state_page, step * attn_per_token)
    needed = KERNEL_BLOCK_ALIGNMENT * cdiv(needed, KERNEL_BLOCK_ALIGNMENT)
    if needed > block_size:
        notes.append(
            f"attention block size raised from {block_size} to {needed} tokens to hold a "
            f"{state.label} state of {state_page:,} bytes"
        )
        block_size = needed
    spec = dataclasses.replace(
        spec,
        block_size=block_size if settings.mamba_cache_mode != "none" else (settings.max_model_len or max_len),
        page_size_padded=max(block_size * attn_per_token, state_page),
    )
    return spec, block_size


__all__ = ["KERNEL_BLOCK_ALIGNMENT", "BuildSettings", "DecoderRules", "FamilyLayers", "build_decoder"]
