"""vLLM 0.34's R-SWA (issue 19, item 2): the prompt stays, of the generated tokens only the last
``rswa_window`` are kept. Block tables, free counts and the final free-queue order were read off vLLM
0.34.0's own KVCacheManager on the same calls (24 blocks of 16 tokens, window 32, a 40-token prompt,
then 100 decode steps), run here with the VLLM_0_34 release profile."""

from __future__ import annotations

import pytest
import torch

from kvspec import (
    FullAttentionSpec,
    KVCacheCoordinator,
    RSWAManager,
    RSWASpec,
    SchedulerLimits,
    default_registry,
)
from kvspec.contracts.release import VLLM_0_34
from kvspec.errors import SpecValidationError
from kvspec.testing import check_plugin
from tests.helpers import free_ids, make_config, make_request

SPEC = RSWASpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32, rswa_window=32)


def test_the_gap_between_prompt_and_window_is_freed_as_vllm_0_34_frees_it() -> None:
    coord = KVCacheCoordinator(
        make_config([SPEC], 24), SchedulerLimits(max_model_len=1024), profile=VLLM_0_34
    )
    assert isinstance(coord.managers[0], RSWAManager)
    request = make_request(coord, "a", list(range(1, 41)))
    blocks, hit = coord.get_computed_blocks(request)
    assert coord.allocate_slots(request, 40, hit, blocks) is not None
    request.num_computed_tokens = 40
    request.append_output_token_ids(7)
    seen = {}
    for step in range(1, 101):
        assert coord.allocate_slots(request, 1, 0, None) is not None
        request.num_computed_tokens += 1
        request.append_output_token_ids(7)
        if step in (1, 10, 30, 60, 100):
            seen[step] = (list(coord.get_block_ids("a")[0]), coord.block_pool.get_num_free_blocks())
    assert seen == {
        1: ([1, 2, 3], 20),
        10: ([1, 2, 3, 4], 19),
        30: ([1, 2, 3, 4, 5], 18),
        60: ([1, 2, 3, 0, 5, 6, 7], 17),  # block 3 holds the prompt's tail and stays; 4 is in the gap
        100: ([1, 2, 3, 0, 0, 0, 7, 8, 9], 17),
    }
    coord.free(request)
    assert free_ids(coord) == [
        9,
        10,
        11,
        12,
        13,
        14,
        15,
        16,
        17,
        18,
        19,
        20,
        21,
        22,
        23,
        4,
        5,
        6,
        8,
        7,
        3,
        2,
        1,
    ]


def test_the_spec_is_full_attention_for_grouping_and_the_kit() -> None:
    assert default_registry.get_manager_class(SPEC) is RSWAManager
    assert default_registry.get_uniform_type_base_spec(SPEC) is FullAttentionSpec
    limits = SchedulerLimits(max_model_len=1024)
    assert SPEC.max_memory_usage_bytes(limits) == 64 * SPEC.page_size_bytes  # no admission cap
    with pytest.raises(SpecValidationError, match="rswa_window"):
        RSWASpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32, rswa_window=0)
    check_plugin(SPEC, RSWAManager)
