"""A compressed block domain (examples/compressed_latent): a block of 16 rows holds 64 tokens.

What it needs from kvspec, each shown here: ``SpecTraits.tokens_per_block`` (allocation, caching, hashing
and hits count logical tokens), ``HitResult.num_tokens`` (hits reported in logical tokens),
``ManagerContext.max_model_len`` (the manager sizes a block-table row) and ``Registry.register(...,
manager_for=...)`` (the manager is chosen per spec instance).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from examples.compressed_latent.plugin import (
    CompressedLatentManager,
    CompressedLatentSpec,
    register,
)
from kvspec import FullAttentionManager, Registry, default_registry
from kvspec.errors import ManagerProtocolError, UnsupportedConfigurationError
from kvspec.testing import check_plugin
from tests.helpers import make_coordinator, make_request

LATENT: dict[str, Any] = dict(block_size=16, head_size=32, dtype=torch.float16)


@pytest.fixture
def registered() -> Iterator[None]:
    with default_registry.isolated():
        register(default_registry)
        yield


@pytest.mark.usefixtures("registered")
def test_blocks_and_hits_count_logical_tokens() -> None:
    coord = make_coordinator([CompressedLatentSpec(**LATENT, compress_ratio=4)], 40, max_model_len=1024)
    assert coord.scheduler_block_size == 64 and coord.hash_block_size == 64
    prompt = list(range(1, 201))
    first = make_request(coord, "a", prompt)
    blocks, hit = coord.get_computed_blocks(first)
    assert hit == 0
    new = coord.allocate_slots(first, 200, 0, blocks)
    assert new is not None and len(new.get_block_ids()[0]) == 4  # cdiv(200, 64), not cdiv(200, 16)
    first.num_computed_tokens = 200
    coord.free(first)
    second = make_request(coord, "b", prompt[:130] + [9999] * 20)
    blocks, hit = coord.get_computed_blocks(second)
    assert hit == 128 and len(blocks.get_block_ids()[0]) == 2  # two 64-token blocks, in logical tokens


@pytest.mark.usefixtures("registered")
def test_the_manager_is_chosen_per_instance() -> None:
    compressed = CompressedLatentSpec(**LATENT, compress_ratio=4)
    plain = CompressedLatentSpec(**{**LATENT, "head_size": 64}, compress_ratio=1)
    assert default_registry.get_manager_class(compressed) is CompressedLatentManager
    assert default_registry.get_manager_class(plain) is FullAttentionManager
    coord = make_coordinator([compressed, plain], 64, max_model_len=1024)
    assert [type(m) for m in coord.managers] == [CompressedLatentManager, FullAttentionManager]
    assert coord.scheduler_block_size == 64 and coord.hash_block_size == 16
    # The context carries the scheduler's limits; the manager sized its block-table row from them.
    assert coord.managers[0].context.max_model_len == 1024  # type: ignore[attr-defined]
    assert coord.managers[0].max_blocks_per_request == 16  # type: ignore[attr-defined]


def test_a_selector_returning_a_non_manager_is_refused_when_chosen() -> None:
    registry: Registry[Any, Any] = Registry(name="selector")
    registry.register(CompressedLatentSpec, CompressedLatentManager, manager_for=lambda spec: dict)
    with pytest.raises(ManagerProtocolError):
        registry.get_manager_class(CompressedLatentSpec(**LATENT))


@pytest.mark.usefixtures("registered")
def test_the_manager_reports_hits_in_logical_tokens_and_bounds_a_request() -> None:
    coord = make_coordinator([CompressedLatentSpec(**LATENT, compress_ratio=4)], 40, max_model_len=256)
    request = make_request(coord, "a", list(range(1, 129)))
    new = coord.allocate_slots(request, 128, 0, None)
    assert new is not None
    request.num_computed_tokens = 128
    coord.cache_blocks(request, 128)
    again = make_request(coord, "b", [*range(1, 129), 1])
    _, hit = coord.get_computed_blocks(again)
    assert hit == 128
    manager = coord.managers[0]
    with pytest.raises(UnsupportedConfigurationError, match="more than the 4 a block-table row holds"):
        manager.allocate_new_blocks("big", 5 * 64, 5 * 64)


@pytest.mark.usefixtures("registered")
def test_the_example_passes_the_kit_compressed_and_not() -> None:
    report = check_plugin(CompressedLatentSpec(**LATENT, compress_ratio=4), CompressedLatentManager)
    assert "acme_compressed_latent" in str(report.checks)
    check_plugin(CompressedLatentSpec(**LATENT, compress_ratio=1), FullAttentionManager)
