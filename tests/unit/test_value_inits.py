"""Values that write their own ``__init__`` (a fast path for the compiled build) keep the dataclass contract:
keyword-only parameters named and defaulted as the fields are, every field set, and still frozen."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvspec.blocks.events import BlockRemoved, BlockStored
from kvspec.blocks.request import Request
from kvspec.engine.instance import InstanceLoad
from kvspec.engine.scheduler import ScheduledRequest


def _samples() -> dict[type[Any], dict[str, Any]]:
    """Per class, one value per field (of its type: the compiled build checks them), distinct per field."""
    return {
        BlockStored: dict(
            block_hashes=[b"h1", b"h2"],
            parent_block_hash=b"p",
            token_ids=[1, 2],
            block_size=16,
            lora_id=3,
            medium="GPU",
            lora_name="lora",
            cache_salt="salt",
            extra_keys=[("k",), None],
            group_idx=4,
            kv_cache_spec_kind="full_attention",
            kv_cache_spec_sliding_window=5,
            lookahead_token_ids=[[7], [8]],
            session_id="session",
        ),
        BlockRemoved: dict(block_hashes=[b"h"], medium="CPU", group_idx=6),
        ScheduledRequest: dict(
            request=Request("r", [1]), num_computed=7, num_new_tokens=8, new_block_ids=([9],), resumed=True
        ),
        InstanceLoad: dict(index=1, waiting=2, running=3, prefill_tokens=4, active_blocks=5, num_blocks=6),
    }


@pytest.mark.parametrize(
    "cls", [BlockStored, BlockRemoved, ScheduledRequest, InstanceLoad], ids=lambda c: c.__name__
)
def test_own_init_matches_the_fields(cls: type[Any]) -> None:
    # Behaviour only: the compiled build's __init__ has no inspectable signature.
    fields = dataclasses.fields(cls)
    values = _samples()[cls]
    assert list(values) == [f.name for f in fields]  # a new field needs a sample (and the __init__ it)
    # Every field is set from its own argument: a distinct value per field comes back where it went.
    value = cls(**values)
    assert {name: getattr(value, name) for name in values} == values
    assert value == cls(**values) and dataclasses.replace(value) == value
    # Fields with defaults may be left out and take them; the others may not; nothing is positional.
    required = {f.name: values[f.name] for f in fields if f.default is dataclasses.MISSING}
    defaulted = cls(**required)
    for f in fields:
        if f.default is not dataclasses.MISSING:
            assert getattr(defaulted, f.name) == f.default, f.name
    for name in required:
        with pytest.raises(TypeError):
            cls(**{k: v for k, v in required.items() if k != name})
    with pytest.raises(TypeError):
        cls(*values.values())
    with pytest.raises(TypeError):
        cls(**values, not_a_field=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, fields[0].name, None)
