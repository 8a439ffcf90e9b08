"""Declared behaviour (kvspec.contracts.traits): validation, the admission cap, and where traits come from."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from kvspec import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec, SpecTraits, traits_of
from kvspec.contracts.traits import DEFAULT_TRAITS, admission_cap
from kvspec.errors import TraitsError

ATTN = dict(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("own_group", 1, "SpecTraits.own_group must be a bool, got 1"),
        ("admission_lookback_tokens", -1, "admission_lookback_tokens must be None or an int >= 0, got -1"),
        ("admission_extra_blocks", True, "admission_extra_blocks must be an int >= 0, got True"),
        ("kind", "", "SpecTraits.kind must be a non-empty str or None"),
        ("hybrid_off_families", ["kv"], "hybrid_off_families must be a tuple of str"),
        ("device_views", ("x",), "device_views must be a tuple of PageView"),
    ],
)
def test_bad_traits_are_refused_naming_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(TraitsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SpecTraits(**{field: value})  # type: ignore[arg-type]


def test_admission_cap_formula() -> None:
    """cdiv(min(lookback + max_num_batched_tokens, max_model_len), block_size) + extra (vLLM's numbers)."""
    assert (
        admission_cap(
            lookback_tokens=4095,
            extra_blocks=1,
            block_size=16,
            max_num_batched_tokens=2048,
            max_model_len=8192,
        )
        == 385
    )  # cdiv(6143, 16) + 1
    assert (
        admission_cap(
            lookback_tokens=4095,
            extra_blocks=1,
            block_size=16,
            max_num_batched_tokens=8192,
            max_model_len=8192,
        )
        == 513
    )  # capped by max_model_len: 512 + 1
    assert SpecTraits().admission_cap_blocks(16, 2048, 8192) is None


@pytest.mark.parametrize(
    "spec",
    [
        SlidingWindowSpec(**ATTN, sliding_window=4096),  # type: ignore[arg-type]
        SlidingWindowSpec(**ATTN, sliding_window=17),  # type: ignore[arg-type]
        ChunkedLocalAttentionSpec(**ATTN, attention_chunk_size=8192),  # type: ignore[arg-type]
    ],
)
@pytest.mark.parametrize(("batched", "max_len"), [(2048, 131072), (512, 1024), (8192, 8192)])
def test_a_spec_and_its_traits_give_one_admission_cap(
    spec: SlidingWindowSpec, batched: int, max_len: int
) -> None:
    traits = traits_of(spec)
    assert spec.max_admission_blocks_per_request(batched, max_len) == traits.admission_cap_blocks(
        spec.block_size, batched, max_len
    )
    lookback = traits.admission_lookback_tokens
    assert lookback is not None
    expected = -(-min(lookback + batched, max_len) // spec.block_size) + traits.admission_extra_blocks
    assert spec.max_admission_blocks_per_request(batched, max_len) == expected


def test_traits_come_from_the_spec_or_default() -> None:
    full = FullAttentionSpec(**ATTN)  # type: ignore[arg-type]
    assert traits_of(full).prefix_hits_left_closed and traits_of(full).kind == "full_attention"

    @dataclass(frozen=True)
    class Bare:
        block_size: int = 16

    assert traits_of(Bare()) is DEFAULT_TRAITS

    @dataclass(frozen=True)
    class Declared:
        block_size: int = 16

        def kv_cache_traits(self) -> SpecTraits:
            return SpecTraits(kind="acme", zero_new_blocks=True)

    assert traits_of(Declared()) == SpecTraits(kind="acme", zero_new_blocks=True)
