"""A group that is not prefix-cacheable (vLLM's prefix_cacheable=False: a ring buffer beside full
attention) never caches and is left out of the hit search; the other groups cache and hit as usual
(issue 18, item 5: supports_prefix_caching=False turned caching off for the whole model)."""

from __future__ import annotations

import dataclasses

import torch

from kvspec import FullAttentionManager, FullAttentionSpec, SpecTraits, default_registry
from kvspec.testing import check_plugin
from tests.helpers import full_spec, ids, make_coordinator, make_request, schedule


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RingSpec(FullAttentionSpec):
    """A recent-tokens ring kept per request and never shared between requests."""

    def kv_cache_traits(self) -> SpecTraits:
        return dataclasses.replace(
            FullAttentionSpec.kv_cache_traits(self), prefix_cacheable=False, kind="acme_ring"
        )


def _ring() -> RingSpec:
    return RingSpec(block_size=16, num_kv_heads=2, head_size=1, dtype=torch.float32)


def test_other_groups_cache_and_hit_beside_a_group_that_is_never_cached() -> None:
    default_registry.register(RingSpec, FullAttentionManager, FullAttentionSpec)
    coord = make_coordinator([full_spec(), _ring()], 64)
    shared = list(range(1, 49))
    schedule(coord, make_request(coord, "a", [*shared, *range(100, 116)]))
    full_blocks, ring_blocks = coord.get_block_ids("a")
    assert len(full_blocks) == len(ring_blocks) == 4
    assert all(coord.block_pool.blocks[i].block_hash is not None for i in full_blocks)
    assert all(coord.block_pool.blocks[i].block_hash is None for i in ring_blocks)

    second = make_request(coord, "b", [*shared, 7, 8, 9, 10, 11])
    computed, hit = coord.get_computed_blocks(second)
    assert hit == 48
    assert ids(computed.blocks[0]) == full_blocks[:3] and list(computed.blocks[1]) == []
    new = coord.allocate_slots(second, second.num_tokens - hit, hit, computed)
    assert new is not None
    assert [len(g) for g in new.get_block_ids()] == [1, 4]  # the ring holds every token afresh
    coord.check_invariants()


def test_a_spec_that_is_never_cached_passes_the_kit_with_caching_on() -> None:
    report = check_plugin(_ring(), FullAttentionManager, uniform_type_base_spec=FullAttentionSpec)
    assert any("caching on" in check for check in report.checks)
