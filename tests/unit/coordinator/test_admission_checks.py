"""kvspec's own API refuses misuse at the door (issue 34): each case was accepted (or failed deep inside)
before, and each refusal leaves nothing half-applied."""

from __future__ import annotations

import pytest

from kvspec import Request
from kvspec.errors import KVSpecTypeError, SchedulingError
from tests.helpers import free_ids, full_spec, ids, make_coordinator, make_request


def test_a_second_live_request_under_an_id_in_use_is_refused() -> None:
    """Before, the second request's table started with the first prompt's KV and freeing one freed both."""
    coord = make_coordinator([full_spec(16)], 20)
    first = make_request(coord, "r0", list(range(64)))
    assert coord.allocate_slots(first, 64) is not None
    before = free_ids(coord)
    second = make_request(coord, "r0", list(range(1000, 1064)))
    with pytest.raises(SchedulingError, match="Request id 'r0' is in use by a live request"):
        coord.allocate_slots(second, 64)
    assert free_ids(coord) == before  # nothing changed
    coord.free(first)
    assert coord.allocate_slots(second, 64) is not None  # the id is free again
    assert (
        ids(coord.get_blocks("r0").blocks[0]) and coord.get_blocks("r0").blocks[0][0].block_hash is not None
    )
    coord.free(second)
    coord.check_invariants()


def test_the_same_request_object_keeps_its_per_step_path() -> None:
    coord = make_coordinator([full_spec(16)], 20)
    request = make_request(coord, "r0", list(range(20)))
    assert coord.allocate_slots(request, 20) is not None
    request.num_computed_tokens = 20
    request.append_output_token_ids(5)
    assert coord.allocate_slots(request, 1) is not None
    coord.free(request)
    coord.check_invariants()


@pytest.mark.parametrize("method", ["allocate_slots", "free"])
def test_an_id_where_a_request_belongs_is_a_type_error(method: str) -> None:
    coord = make_coordinator([full_spec(16)], 20)
    args: tuple[object, ...] = ("r9", 10) if method == "allocate_slots" else ("r9",)
    with pytest.raises(KVSpecTypeError, match=rf"{method} takes the Request .* got str 'r9'"):
        getattr(coord, method)(*args)


def test_a_prompt_over_max_model_len_is_refused() -> None:
    coord = make_coordinator([full_spec(16)], 100, max_model_len=64)
    request = make_request(coord, "long", list(range(65)))
    with pytest.raises(SchedulingError, match="prompt of 65 tokens, over max_model_len 64"):
        coord.allocate_slots(request, 65)
    assert not coord.get_blocks("long").blocks[0]
    coord.check_invariants()


def test_computed_tokens_must_be_backed_by_hit_blocks() -> None:
    coord = make_coordinator([full_spec(16)], 20)
    request = make_request(coord, "r0", list(range(100)))
    with pytest.raises(SchedulingError, match="claims 64 computed tokens, but group 0's hit blocks hold 0"):
        coord.allocate_slots(request, 36, 64, None)
    # A real hit of 48 tokens (3 blocks) is accepted; claiming one more block than it holds is not.
    warm = make_request(coord, "warm", list(range(100)))
    assert coord.allocate_slots(warm, 100) is not None
    coord.free(warm)
    hit, tokens = coord.get_computed_blocks(request)
    assert tokens == 96
    with pytest.raises(SchedulingError, match="claims 112 computed tokens"):
        coord.allocate_slots(request, 1, 112, hit)
    assert coord.allocate_slots(request, 100 - tokens, tokens, hit) is not None
    coord.free(request)
    coord.check_invariants()


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ("hello world", "prompt_token_ids must be a list of token ids .ints., got str"),
        (b"\x01\x02", "got bytes"),
        ([1.0, 2.0], "token ids must be ints, got float 1.0"),
        ([1, 2, "3"], "token ids must be ints, got str '3'"),
        (42, "got int"),
    ],
)
def test_token_ids_that_are_not_ints_are_refused(tokens: object, message: str) -> None:
    with pytest.raises(KVSpecTypeError, match=message):
        Request("r", tokens)  # type: ignore[arg-type]
