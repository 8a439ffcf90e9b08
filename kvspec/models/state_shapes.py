"""Recurrent-state shapes of state-space and linear-attention layers, by vLLM 0.34's rules.

A Mamba1, Mamba2, Gated DeltaNet, lightning-attention or short-convolution layer keeps a fixed-size state per request instead
of per-token KV. Its shapes (elements, one TP rank's share) follow vLLM 0.34's
``MambaStateShapeCalculator``: the convolution state is laid out (state length, channels) (vLLM's default
"SD" layout; the bytes are the same either way), channels and heads divide by the tensor-parallel size,
and a Mamba2 layer whose groups do not divide by TP replicates groups so each rank holds the groups its
heads read. A state that does not divide evenly is refused (vLLM's ``divide`` asserts).

Dtypes follow ``MambaStateDtypeCalculator``: the convolution state takes the model dtype (vLLM's
``mamba_cache_dtype="auto"``), the temporal (SSM / recurrent) state the same unless the model or the user
asks for another (Nemotron-H: float32 unless its config names one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec.errors import ModelConfigError

Shape = tuple[int, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class StateLayout:
    """The state tensors of one layer on one TP rank: ``shapes[i]`` elements of ``dtypes[i]``; ``kind`` its
    calculator, ``mamba_type`` the ``MambaSpec.mamba_type`` it is cached as (vLLM's
    ``MambaAttentionBackendEnum`` member, lower case), ``label`` its name for people and
    ``prefill_checkpoints`` the blocks its mixer exports per prompt (vLLM's ``MambaMixer2``: one)."""

    kind: str  # "mamba1" | "mamba2" | "gated_delta_net" | "linear_attention" | "short_conv"
    shapes: tuple[Shape, ...]
    dtypes: tuple[torch.dtype, ...]
    mamba_type: str
    label: str
    prefill_checkpoints: int = 0


def _divide(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise ModelConfigError(
            f"{what} ({value}) is not divisible by tensor_parallel_size={tp}; use a divisor of {value}."
        )
    return value // tp


def extra_groups_for_head_shards(n_groups: int, tp: int) -> int:
    """Groups added so every rank holds the groups its heads read (0 when TP divides the groups)."""
    return 0 if n_groups % tp == 0 else tp - n_groups


def mamba1_state(
    *,
    tp: int,
    intermediate_size: int,
    state_size: int,
    conv_kernel: int,
    dtypes: tuple[torch.dtype, torch.dtype],
) -> StateLayout:
    """Mamba1 (Jamba): conv state (conv_kernel - 1, d_inner / tp), SSM state (d_inner / tp, d_state)."""
    channels = _divide(intermediate_size, tp, "mamba inner size")
    return StateLayout(
        kind="mamba1",
        shapes=((conv_kernel - 1, channels), (channels, state_size)),
        dtypes=dtypes,
        mamba_type="mamba1",
        label="Mamba1",
    )


def mamba2_state(
    *,
    tp: int,
    intermediate_size: int,
    n_groups: int,
    num_heads: int,
    head_dim: int,
    state_size: int,
    conv_kernel: int,
    dtypes: tuple[torch.dtype, torch.dtype],
    num_speculative_tokens: int = 0,
) -> StateLayout:
    """Mamba2: conv state (conv_kernel - 1 + spec, (d_inner + 2 * groups * d_state) / tp), SSM state
    (heads / tp, head_dim, d_state)."""
    groups = n_groups + extra_groups_for_head_shards(n_groups, tp)
    conv_dim = intermediate_size + 2 * groups * state_size
    return StateLayout(
        kind="mamba2",
        mamba_type="mamba2",
        label="Mamba2",
        prefill_checkpoints=1,
        shapes=(
            (conv_kernel - 1 + num_speculative_tokens, _divide(conv_dim, tp, "mamba2 conv channels")),
            (_divide(num_heads, tp, "mamba2 heads"), head_dim, state_size),
        ),
        dtypes=dtypes,
    )


def gated_delta_net_state(
    *,
    tp: int,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    conv_kernel: int,
    dtypes: tuple[torch.dtype, torch.dtype],
    num_speculative_tokens: int = 0,
) -> StateLayout:
    """Gated DeltaNet (Qwen3-Next's linear attention): conv state (conv_kernel - 1 + spec,
    (2 * k_heads * k_dim + v_heads * v_dim) / tp), recurrent state (v_heads / tp, v_dim, k_dim)."""
    conv_dim = head_k_dim * num_k_heads * 2 + head_v_dim * num_v_heads
    return StateLayout(
        kind="gated_delta_net",
        mamba_type="gdn_attn",
        label="Gated DeltaNet",
        shapes=(
            (
                conv_kernel - 1 + num_speculative_tokens,
                _divide(conv_dim, tp, "gated delta net conv channels"),
            ),
            (_divide(num_v_heads, tp, "gated delta net value heads"), head_v_dim, head_k_dim),
        ),
        dtypes=dtypes,
    )


def linear_attention_state(*, tp: int, num_heads: int, head_dim: int, dtype: torch.dtype) -> StateLayout:
    """Lightning (linear) attention, MiniMax's: one (heads / tp, head_dim, head_dim) state."""
    return StateLayout(
        kind="linear_attention",
        mamba_type="linear",
        label="lightning attention",
        shapes=((_divide(num_heads, tp, "lightning attention heads"), head_dim, head_dim),),
        dtypes=(dtype,),
    )


def short_conv_state(
    *, tp: int, conv_dim: int, conv_kernel: int, dtype: torch.dtype, num_speculative_tokens: int = 0
) -> StateLayout:
    """Short convolution (LFM2's conv blocks): one conv state (conv_kernel - 1 + spec, conv_dim / tp) of the
    model dtype (vLLM 0.34's ``short_conv_state_shape`` / ``short_conv_state_dtype``)."""
    return StateLayout(
        kind="short_conv",
        mamba_type="short_conv",
        label="short convolution",
        shapes=((conv_kernel - 1 + num_speculative_tokens, _divide(conv_dim, tp, "short conv channels")),),
        dtypes=(dtype,),
    )
