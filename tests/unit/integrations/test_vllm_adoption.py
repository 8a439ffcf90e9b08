"""Adopting a platform's vLLM-side registrations (kvspec.integrations.vllm_adoption), without vLLM: classes that
stand for vLLM's own carry vLLM's module names. Each case kvspec cannot adopt is one AdoptionError naming the
class, the member and what to do; the adoption with vLLM itself is tested in tests/vllm and tests/vllm_ascend."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from kvspec import FullAttentionManager
from kvspec.contracts.manager import ManagerContext
from kvspec.contracts.spec import SchedulerLimits
from kvspec.contracts.traits import traits_of
from kvspec.errors import AdoptionError, RegistrationError
from kvspec.integrations import vllm_adoption as adoption
from kvspec.registry.core import Registry


@dataclasses.dataclass(frozen=True, kw_only=True)
class FullAttentionSpec:
    """Stands for vLLM's FullAttentionSpec (its fields, its page)."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    sliding_window: int | None = None

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * int(self.dtype.itemsize)

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        max_model_len: int = vllm_config.model_config.max_model_len
        return -(max_model_len // -self.block_size) * self.page_size_bytes

    def copy_with_new_block_size(self, block_size: int) -> FullAttentionSpec:
        return dataclasses.replace(self, block_size=block_size)

    @classmethod
    def merge(cls, specs: list[Any]) -> Any:
        assert all(s == specs[0] for s in specs), "layers of a group must be equal"
        return specs[0]

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, Any]) -> bool:
        return True


FullAttentionSpec.__module__ = "vllm.v1.kv_cache_interface"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlatformSpec(FullAttentionSpec):
    """A platform's spec: vLLM's full attention with 8 bytes of scales per token."""

    scale_bytes: int = 8

    @property
    def page_size_bytes(self) -> int:
        return super().page_size_bytes + self.block_size * self.scale_bytes


def platform_spec(**kw: Any) -> PlatformSpec:
    return PlatformSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16, **kw)


class SingleTypeKVCacheManager:
    """Stands for vLLM 0.23's manager base: its constructor and method names."""

    def __init__(
        self,
        kv_cache_spec: Any,
        block_pool: Any,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_pool = block_pool
        self.block_size = kv_cache_spec.block_size
        self.req_to_blocks: dict[str, list[Any]] = {}
        self.num_cached_block: dict[str, int] = {}

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Any],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        return 0

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[Any],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        self.block_pool.touch(new_computed_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[Any]:
        return self.block_pool.get_new_blocks(0)  # type: ignore[no-any-return]

    def cache_blocks(self, request: Any, num_tokens: int, retention_interval: int | None = None) -> None:
        pass

    def free(self, request_id: str) -> None:
        self.block_pool.free_blocks(self.req_to_blocks.pop(request_id, []))

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        pass

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Any,
        max_length: int,
        kv_cache_group_ids: list[int],
        block_pool: Any,
        kv_cache_spec: Any,
        drop_eagle_block: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[Any], ...]:
        return tuple([] for _ in kv_cache_group_ids)

    def new_step_starts(self) -> None:
        pass

    def take_new_block_ids(self) -> list[int]:
        return []


SingleTypeKVCacheManager.__module__ = "vllm.v1.core.single_type_kv_cache_manager"


class PlatformManager(SingleTypeKVCacheManager):
    """A platform's manager that keeps to vLLM's pool API (kvspec can run it as it is)."""

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[Any]:
        blocks: list[Any] = self.block_pool.get_new_blocks(1) if num_tokens > 0 else []
        self.req_to_blocks.setdefault(request_id, []).extend(blocks)
        return blocks


class ReadsPoolInternals(SingleTypeKVCacheManager):
    def free(self, request_id: str) -> None:
        self.block_pool.kv_offload_queue.append(request_id)


class NeedsEncoderTokens(SingleTypeKVCacheManager):
    def get_num_blocks_to_allocate(  # type: ignore[override]
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Any],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        num_encoder_tokens: int,
        apply_admission_cap: bool = False,
    ) -> int:
        return 0


class NoFree:
    def __init__(self, kv_cache_spec: Any, block_pool: Any) -> None:
        pass


def test_a_platform_spec_is_held_with_its_own_members_and_its_familys_traits() -> None:
    cls = adoption.adopted_spec_class(PlatformSpec, FullAttentionSpec)
    assert cls.vllm_class is PlatformSpec and cls.family == "FullAttentionSpec"
    spec = cls(platform_spec())
    assert spec.page_size_bytes == 2 * 16 * 2 * 64 * 2 + 16 * 8  # the platform's own page, scales included
    assert spec.max_memory_usage_bytes(SchedulerLimits(max_model_len=100)) == 7 * spec.page_size_bytes
    traits = traits_of(spec)
    assert traits.prefix_hits_left_closed and traits.kind == "full_attention"
    assert traits.device_views == ()  # the family's views would describe another page: one raw view instead
    assert cls.merge([spec, spec]) == spec
    assert spec.copy_with_new_block_size(32).block_size == 32
    assert adoption.adopted_spec_class(PlatformSpec, FullAttentionSpec) is cls  # adopting again: same class


def test_a_platform_merge_assertion_is_a_spec_merge_error() -> None:
    from kvspec.errors import SpecMergeError

    cls = adoption.adopted_spec_class(PlatformSpec, FullAttentionSpec)
    with pytest.raises(SpecMergeError, match=r"PlatformSpec\.merge refused: layers of a group must be equal"):
        cls.merge([cls(platform_spec()), cls(platform_spec(scale_bytes=4))])


def test_an_adopted_class_registers_in_a_registry_like_any_spec() -> None:
    cls = adoption.adopted_spec_class(PlatformSpec, FullAttentionSpec)
    registry: Registry[Any, Any] = Registry(name="adopted")
    registry.register(
        cls, adoption.adopted_manager_class(PlatformManager), adoption.adopted_family(FullAttentionSpec)
    )
    manager = registry.get_manager_class(cls(platform_spec()))
    assert manager is not None and issubclass(manager, adoption.AdoptedManager)


def test_the_adopted_manager_runs_the_platforms_code_on_kvspecs_pool() -> None:
    from kvspec import BlockPool

    manager_cls = adoption.adopted_manager_class(PlatformManager)
    pool = BlockPool(num_gpu_blocks=8)
    spec = adoption.adopted_spec_class(PlatformSpec, FullAttentionSpec)(platform_spec())
    manager = manager_cls(ManagerContext.for_spec(spec, pool))
    assert isinstance(manager.vllm_manager, PlatformManager)
    assert manager.vllm_manager.kv_cache_spec is spec.vllm_spec  # the platform's own object
    new = manager.allocate_new_blocks("r", 10, 10)
    assert len(new) == 1 and pool.get_num_free_blocks() == 6  # kvspec's pool gave the block
    assert list(manager.iter_held_blocks()) == new
    manager.free("r")
    assert pool.get_num_free_blocks() == 7


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (
            ReadsPoolInternals,
            "ReadsPoolInternals.free reads block_pool.kv_offload_queue, which kvspec's block pool",
        ),
        (
            NeedsEncoderTokens,
            "get_num_blocks_to_allocate needs 'num_encoder_tokens', which kvspec's coordinator",
        ),
        (NoFree, "NoFree has no get_num_blocks_to_allocate, which kvspec's coordinator calls"),
    ],
    ids=["pool internals", "an argument kvspec lacks", "a missing method"],
)
def test_a_manager_kvspec_cannot_run_as_it_is_is_refused_naming_the_member(cls: type, message: str) -> None:
    with pytest.raises(AdoptionError, match=message):
        adoption.adopted_manager_class(cls)
    assert issubclass(AdoptionError, RegistrationError)


def test_a_vllm_manager_kvspec_does_not_reproduce_is_refused() -> None:
    class RSWAWithSinksManager(SingleTypeKVCacheManager):
        pass

    RSWAWithSinksManager.__module__ = "vllm.v1.core.single_type_kv_cache_manager"
    with pytest.raises(AdoptionError, match="is a manager of vLLM's that kvspec does not reproduce"):
        adoption.adopted_manager_class(RSWAWithSinksManager)
    assert adoption.adopted_manager_class(type("FullAttentionManager", (), {"__module__": "vllm.x"})) is (
        FullAttentionManager
    )


def test_a_spec_deriving_from_no_vllm_family_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Standalone:
        block_size: int = 16

    with pytest.raises(AdoptionError, match="Standalone derives from no vLLM spec family kvspec knows"):
        adoption.adopted_spec_class(Standalone, Standalone)


def test_a_spec_whose_family_cannot_be_built_from_its_fields_is_refused() -> None:
    cls = adoption.adopted_spec_class(PlatformSpec, FullAttentionSpec)
    with pytest.raises(AdoptionError, match="family FullAttentionSpec, whose kvspec spec cannot be built"):
        cls(platform_spec(sliding_window=-3))


def test_a_spec_value_kvspec_cannot_use_is_refused_at_start() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class HalfBlocks(PlatformSpec):
        @property
        def page_size_bytes(self) -> int:
            return int(super().page_size_bytes * 1.5) + 0.5  # type: ignore[return-value]

    spec = adoption.adopted_spec_class(HalfBlocks, FullAttentionSpec)(
        HalfBlocks(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16)
    )
    with pytest.raises(
        AdoptionError, match=r"HalfBlocks.page_size_bytes is .*\(float\); kvspec needs a positive int"
    ):
        adoption.check_adopted_spec(spec)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class NoMemory(PlatformSpec):
        def max_memory_usage_bytes(self, vllm_config: Any) -> int:
            return 0

    empty = adoption.adopted_spec_class(NoMemory, FullAttentionSpec)(
        NoMemory(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16)
    )
    adoption.check_adopted_spec(empty)  # without limits: the values alone
    with pytest.raises(AdoptionError, match=r"NoMemory\.max_memory_usage_bytes gave 0 for max_model_len=64"):
        adoption.check_adopted_spec(empty, SchedulerLimits(max_model_len=64))


def test_sub_block_hits_are_refused_for_an_adopted_manager() -> None:
    from kvspec import BlockPool

    spec = adoption.adopted_spec_class(PlatformSpec, FullAttentionSpec)(platform_spec())
    context = dataclasses.replace(
        ManagerContext.for_spec(spec, BlockPool(num_gpu_blocks=4)), partial_hash_hits=True
    )
    with pytest.raises(AdoptionError, match="cannot run with sub-block prefix hits"):
        adoption.adopted_manager_class(PlatformManager)(context)
