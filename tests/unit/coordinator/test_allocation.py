"""allocate_slots: one path computes every group's token targets (admission and running steps alike)."""

from __future__ import annotations

import pytest
import torch

from kvspec import CrossAttentionSpec, KVCacheCoordinator, SchedulerLimits
from tests.helpers import full_spec, make_config, make_request


def _encoder_decoder(num_blocks: int) -> KVCacheCoordinator:
    cross = CrossAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    return KVCacheCoordinator(
        make_config([full_spec(), cross], num_blocks),
        SchedulerLimits(max_model_len=448, max_num_encoder_input_tokens=1500),
        enable_caching=False,
    )


def test_cross_attention_group_is_sized_by_the_encoder_once() -> None:
    """vLLM 0.23.0: a 20-token prompt with 32 encoder tokens, then 60 one-token decode steps, ends with
    [5, 2] blocks per group and 192 free blocks of 199. The cross group must not follow the decoder."""
    coord = _encoder_decoder(200)
    request = make_request(coord, "r", list(range(20)))
    new = coord.allocate_slots(request, 20, num_encoder_tokens=32)
    assert new is not None and [len(g) for g in new.get_block_ids()] == [2, 2]
    request.num_computed_tokens = 20
    for step in range(60):
        request.append_output_token_ids(7)
        new = coord.allocate_slots(request, 1)
        assert new is not None
        # The cross group never gets a block after admission.
        assert len(new.get_block_ids()[1]) == 0, f"step {step}"
        request.num_computed_tokens += 1
        coord.check_invariants()
    assert [len(g) for g in coord.get_block_ids("r")] == [5, 2]
    assert coord.num_free_blocks == 192


def test_running_step_with_numpy_counts_takes_the_same_path() -> None:
    """Counts of another integer type (numpy) give exactly the blocks plain ints give."""
    np = pytest.importorskip("numpy")
    plain, converted = _encoder_decoder(40), _encoder_decoder(40)
    for coord, as_int in ((plain, int), (converted, np.int64)):
        request = make_request(coord, "r", list(range(20)))
        assert coord.allocate_slots(request, as_int(20), num_encoder_tokens=as_int(32)) is not None
        request.num_computed_tokens = 20
        for _ in range(30):
            request.append_output_token_ids(7)
            assert coord.allocate_slots(request, as_int(1)) is not None
            request.num_computed_tokens += 1
    assert plain.get_block_ids("r") == converted.get_block_ids("r")
    assert [len(g) for g in plain.get_block_ids("r")] == [4, 2]
    assert plain.num_free_blocks == converted.num_free_blocks == 33


def test_encoder_tokens_are_refused_atomically_when_they_do_not_fit() -> None:
    """The encoder's blocks count against the free queue at admission: a request whose encoder input does
    not fit is refused and changes nothing."""
    coord = _encoder_decoder(6)  # 5 usable blocks
    request = make_request(coord, "r", list(range(20)))
    assert coord.allocate_slots(request, 20, num_encoder_tokens=64) is None  # 2 + 4 > 5
    assert coord.num_free_blocks == 5 and coord.get_block_ids("r") == ([], [])
    coord.check_invariants()
    assert coord.allocate_slots(request, 20, num_encoder_tokens=48) is not None  # 2 + 3
    assert coord.num_free_blocks == 0
