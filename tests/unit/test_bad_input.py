"""Bad input to the per-step API and to the value types: a clear KVSpecError, and nothing half-applied
(after every rejected call the pool's invariants hold and the free block count is unchanged)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvspec import (
    BlockHasher,
    KVCacheBlocks,
    KVSpecError,
    MambaSpec,
    Request,
    SchedulerLimits,
    SchedulingError,
    SpecValidationError,
)
from kvspec.coordinator import as_count
from kvspec.errors import KVSpecTypeError
from tests.helpers import full_spec, make_coordinator, make_request, schedule, sw_spec


def _unchanged(coord: Any, call: Any, error: type[Exception], match: str) -> None:
    free = coord.num_free_blocks
    held = {rid: coord.get_block_ids(rid) for rid in ("a", "b")}
    with pytest.raises(error, match=match):
        call()
    coord.check_invariants()
    assert coord.num_free_blocks == free
    assert {rid: coord.get_block_ids(rid) for rid in ("a", "b")} == held


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_new_tokens": -16}, "num_new_tokens"),
        ({"num_new_tokens": 16, "num_new_computed_tokens": -16}, "num_new_computed_tokens"),
        ({"num_new_tokens": 16, "num_lookahead_tokens": -4}, "num_lookahead_tokens"),
        ({"num_new_tokens": 16, "num_external_computed_tokens": -1}, "num_external_computed_tokens"),
        ({"num_new_tokens": 16, "num_encoder_tokens": -1}, "num_encoder_tokens"),
        ({"num_new_tokens": 16, "reserved_blocks": -3}, "reserved_blocks"),
    ],
)
def test_negative_or_non_int_counts_are_refused(kwargs: dict[str, Any], name: str) -> None:
    coord = make_coordinator([full_spec(), sw_spec(32)], 32)
    a = make_request(coord, "a", list(range(40)))
    schedule(coord, a)
    b = make_request(coord, "b", list(range(100, 140)))
    _unchanged(
        coord, lambda: coord.allocate_slots(b, **kwargs), SchedulingError, f"{name} must be an int >= 0"
    )
    # The running request's short path refuses negative lookahead and reservations too.
    if name in ("num_lookahead_tokens", "reserved_blocks"):
        a.append_output_token_ids(1)
        _unchanged(coord, lambda: coord.allocate_slots(a, **kwargs), SchedulingError, name)


def test_non_int_count_is_a_kvspec_error_with_or_without_beartype() -> None:
    coord = make_coordinator([full_spec()], 16)
    b = make_request(coord, "b", list(range(40)))
    # Counts are checked in allocate_slots' body (a compiled signature would answer mypyc's bare
    # TypeError), so this is kvspec's SchedulingError in every KVSPEC_TYPECHECK mode and build.
    _unchanged(coord, lambda: coord.allocate_slots(b, 16.0), SchedulingError, "num_new_tokens")  # type: ignore[arg-type]
    _unchanged(coord, lambda: coord.allocate_slots(b, True), SchedulingError, "num_new_tokens")
    _unchanged(coord, lambda: coord.allocate_slots(b, "16"), SchedulingError, "num_new_tokens")  # type: ignore[arg-type]
    schedule(coord, b)
    b.append_output_token_ids(1)
    # The running request's short path refuses them too.
    half: Any = 0.5
    _unchanged(
        coord, lambda: coord.allocate_slots(b, 1, num_lookahead_tokens=half), SchedulingError, "lookahead"
    )
    bad: Any = 16.0
    with pytest.raises(SchedulingError, match=r"num_new_tokens must be an int >= 0, got 16\.0"):
        as_count("num_new_tokens", bad)


def test_integer_counts_of_any_integer_type_are_taken() -> None:
    """numpy and 0-d tensor integers are counts (``__index__``), and give what a Python int gives."""
    import numpy as np

    assert as_count("n", np.int64(7)) == 7 and type(as_count("n", np.int64(7))) is int
    assert as_count("n", torch.tensor(5)) == 5
    assert as_count("n", 0) == 0
    with pytest.raises(SchedulingError, match=r"n must be an int >= 0, got np\.int32\(-1\)"):
        as_count("n", np.int32(-1))
    plain = make_coordinator([full_spec()], 16)
    typed = make_coordinator([full_spec()], 16)
    a, c = make_request(plain, "a", list(range(40))), make_request(typed, "a", list(range(40)))
    got = typed.allocate_slots(c, np.int64(40))
    want = plain.allocate_slots(a, 40)
    assert got is not None and want is not None and got.get_block_ids() == want.get_block_ids()
    c.num_computed_tokens = 40
    c.append_output_token_ids(1)
    assert typed.allocate_slots(c, torch.tensor(1)) is not None
    typed.check_invariants()


def test_request_without_or_with_a_foreign_hasher_is_refused_before_taking_blocks() -> None:
    coord = make_coordinator([full_spec()], 16)
    unhashed = Request("a", list(range(40)))
    _unchanged(coord, lambda: coord.allocate_slots(unhashed, 40), SchedulingError, "has no block_hasher")
    wrong = Request("a", list(range(40)), block_hasher=BlockHasher(8, seed="x"))
    _unchanged(
        coord,
        lambda: coord.allocate_slots(wrong, 40),
        SchedulingError,
        "block_hasher of 8 tokens, but this coordinator hashes blocks of 16",
    )
    # Without prefix caching no hash is read, so no hasher is needed.
    plain = make_coordinator([full_spec()], 16, enable_caching=False)
    assert plain.allocate_slots(Request("a", list(range(40))), 40) is not None


def test_blocks_from_another_coordinator_are_refused() -> None:
    one = make_coordinator([full_spec()], 16)
    two = make_coordinator([full_spec()], 16)
    donor = make_request(one, "x", list(range(48)))
    schedule(one, donor)
    hit, n = one.get_computed_blocks(make_request(one, "y", [*range(48), 1]))
    assert n == 48
    b = make_request(two, "b", [*range(48), 1])
    free_one = one.num_free_blocks
    _unchanged(
        two,
        lambda: two.allocate_slots(b, 1, n, hit),
        SchedulingError,
        "not a block of this coordinator's pool",
    )
    assert one.num_free_blocks == free_one
    one.check_invariants()
    wrong_groups = KVCacheBlocks(((), ()))
    _unchanged(two, lambda: two.allocate_slots(b, 49, 0, wrong_groups), SchedulingError, "has 2 groups")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"max_model_len": 4096, "max_num_batched_tokens": "8192"},
            KVSpecTypeError,
            "max_num_batched_tokens must be an int, got str",
        ),
        ({"max_model_len": True}, KVSpecTypeError, "max_model_len must be an int, got bool"),
        ({"max_model_len": 1.5}, KVSpecTypeError, "max_model_len must be an int, got float"),
        ({"max_model_len": 0}, SpecValidationError, "max_model_len must be >= 1"),
        ({"max_model_len": 64, "max_num_encoder_input_tokens": -1}, SpecValidationError, ">= 0"),
        ({"max_model_len": 64, "decode_context_parallel_size": 0}, SpecValidationError, ">= 1"),
        ({"max_model_len": 64, "mamba_cache_mode": "some"}, SpecValidationError, "mamba_cache_mode"),
    ],
)
def test_scheduler_limits_refuse_bad_values(
    kwargs: dict[str, Any], error: type[KVSpecError], match: str
) -> None:
    with pytest.raises(error, match=match):
        SchedulerLimits(**kwargs)


def test_mamba_shapes_are_checked_element_by_element() -> None:
    """Every element of every shape, every time (beartype alone samples one element per call)."""
    for _ in range(20):
        with pytest.raises(KVSpecError, match=r"2\.5"):
            MambaSpec(block_size=16, shapes=((16, 2.5),), dtypes=(torch.float32,))  # type: ignore[arg-type]
    with pytest.raises(SpecValidationError, match="non-empty tuples"):
        MambaSpec(block_size=16, shapes=((4,), (3, True)), dtypes=(torch.float32, torch.float32))
    # Without beartype (KVSPEC_TYPECHECK=off) the spec's own check still refuses it.
    import subprocess
    import sys

    code = (
        "import torch; from kvspec import MambaSpec\n"
        "try:\n    MambaSpec(block_size=16, shapes=((16, 2.5),), dtypes=(torch.float32,))\n"
        "except Exception as e:\n    print(type(e).__name__, e)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "KVSPEC_TYPECHECK": "off"},
    ).stdout
    assert out.startswith("SpecValidationError MambaSpec.shapes must hold non-empty tuples of positive ints")


def test_coordinator_refuses_bad_hash_settings_at_construction() -> None:
    from kvspec import KVCacheCoordinator, UnsupportedConfigurationError
    from kvspec.errors import UnknownHashFunctionError
    from tests.helpers import make_config

    config = make_config([full_spec()], 16)
    limits = SchedulerLimits(max_model_len=256)
    with pytest.raises(UnsupportedConfigurationError, match="hash_block_size must be a positive int"):
        KVCacheCoordinator(config, limits, hash_block_size=0)
    with pytest.raises(UnknownHashFunctionError, match="Unsupported hash function: 'md5'"):
        KVCacheCoordinator(config, limits, hash_algorithm="md5")
