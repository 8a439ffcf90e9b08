"""Grouping, page-size unification, block counts, multi-worker configs and memory checks (vLLM §9.3)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import torch

from kvspec import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    SchedulerLimits,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from kvspec.contracts.release import VLLM_0_23, VLLM_0_34
from kvspec.contracts.traits import traits_of
from kvspec.errors import (
    ConflictingLayerSpecError,
    HybridUnificationError,
    InsufficientKVCacheMemoryError,
    PageSizeUnificationError,
    PlanningError,
    UnregisteredSpecError,
)
from kvspec.planning import (
    WorkerBudgets,
    add_kv_sharing_layers,
    auto_fit_from_groups,
    auto_fit_max_model_len,
    draft_groups_unidentified,
    estimate_max_model_len,
    generate_scheduler_kv_cache_config,
    get_kv_cache_config,
    get_kv_cache_configs,
    get_kv_cache_groups,
    get_max_concurrency,
    is_kv_cache_spec_uniform,
    mark_eagle_groups,
    max_memory_usage_bytes_from_groups,
    plan_num_blocks,
    project_groups_to_worker,
    unify_hybrid_kv_cache_specs,
)
from tests.helpers import ForeignSpec

F32 = torch.float32
LIMITS = SchedulerLimits(max_model_len=128, max_num_batched_tokens=64)  # full: 8 blocks, SW(128): 9
LARGE = SchedulerLimits(max_model_len=1024, max_num_batched_tokens=1024)


def full(head_size: int = 64, block_size: int = 16, **kw: object) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=head_size, dtype=F32, **kw)  # type: ignore[arg-type]


def sw(window: int = 128, head_size: int = 64, block_size: int = 16) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size, num_kv_heads=2, head_size=head_size, dtype=F32, sliding_window=window
    )


def chunked(chunk: int = 256) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype=F32, attention_chunk_size=chunk
    )


PAGE = 2 * 16 * 2 * 64 * 4  # 16,384 bytes per block and layer


def layers(prefix: str, spec: KVCacheSpec, n: int, start: int = 0) -> dict[str, KVCacheSpec]:
    return {f"{prefix}{i}": spec for i in range(start, start + n)}


def group_layout(config: KVCacheConfig) -> list[tuple[str, ...]]:
    return [g.layer_names for g in config.kv_cache_groups]


class TestOneWorker:
    def test_full_only(self) -> None:
        config = get_kv_cache_config(layers("l", full(), 2), PAGE * 2 * 64, LIMITS)
        assert config.num_blocks == 64
        assert group_layout(config) == [("l0", "l1")]
        assert config.kv_cache_tensors == (
            KVCacheTensor(size=PAGE * 64, shared_by=("l0",)),
            KVCacheTensor(size=PAGE * 64, shared_by=("l1",)),
        )

    def test_sliding_window_only(self) -> None:
        config = get_kv_cache_config(layers("l", sw(), 2), PAGE * 2 * 64, LIMITS)
        assert config.num_blocks == 64 and isinstance(
            config.kv_cache_groups[0].kv_cache_spec, SlidingWindowSpec
        )

    def test_hybrid_disabled_converts_to_full(self) -> None:
        specs = {"full0": full(), "sw0": sw()}
        config = get_kv_cache_config(specs, PAGE * 2 * 64, LIMITS, hybrid=False)
        (group,) = config.kv_cache_groups
        assert group.layer_names == ("full0", "sw0")
        assert (
            isinstance(group.kv_cache_spec, FullAttentionSpec) and group.kv_cache_spec.sliding_window == 128
        )
        assert config.num_blocks == 64

    def test_hybrid_groups_share_one_tensor(self) -> None:
        config = get_kv_cache_config({"full0": full(), "sw0": sw()}, PAGE * 64, LIMITS)
        assert group_layout(config) == [("full0",), ("sw0",)]
        assert config.kv_cache_tensors == (KVCacheTensor(size=PAGE * 64, shared_by=("full0", "sw0")),)
        assert config.num_blocks == 64

    def test_two_full_four_sw(self) -> None:
        specs = {**layers("full", full(), 2), **layers("sw", sw(), 4)}
        config = get_kv_cache_config(specs, PAGE * 2 * 64, LIMITS)
        assert group_layout(config) == [("full0", "full1"), ("sw0", "sw2"), ("sw1", "sw3")]
        assert [t.shared_by for t in config.kv_cache_tensors] == [
            ("full0", "sw0", "sw1"),
            ("full1", "sw2", "sw3"),
        ]
        assert config.num_blocks == 64

    def test_three_full_seven_sw_pads_to_nine(self) -> None:
        specs = {**layers("full", full(), 3), **layers("sw", sw(), 7)}
        config = get_kv_cache_config(specs, PAGE * 3 * 64, LIMITS)
        assert group_layout(config) == [
            ("full0", "full1", "full2"),
            ("sw0", "sw3", "sw6"),
            ("sw1", "sw4"),
            ("sw2", "sw5"),
        ]
        assert sum(3 for _ in config.kv_cache_groups[1:]) == 9  # 3 SW groups of 3 slots
        assert config.num_blocks == 64 and len(config.kv_cache_tensors) == 3

    def test_six_full_five_sw_pads_to_six(self) -> None:
        specs = {**layers("full", full(), 6), **layers("sw", sw(), 5)}
        config = get_kv_cache_config(specs, PAGE * 6 * 64, LIMITS)
        assert group_layout(config) == [
            tuple(f"full{i}" for i in range(6)),
            tuple(f"sw{i}" for i in range(5)),
        ]
        assert config.kv_cache_tensors[5].shared_by == ("full5",)
        assert config.num_blocks == 64

    def test_same_type_different_hidden_size_is_uniform_type(self) -> None:
        specs = {"a": full(64), "b": full(128)}
        config = get_kv_cache_config(specs, PAGE * 3 * 64, LIMITS)
        (group,) = config.kv_cache_groups
        assert isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs)
        assert config.num_blocks == 64
        assert config.kv_cache_tensors == (
            KVCacheTensor(size=PAGE * 64, shared_by=("a",)),
            KVCacheTensor(size=2 * PAGE * 64, shared_by=("b",)),
        )
        scheduler = generate_scheduler_kv_cache_config([config])
        assert scheduler.kv_cache_groups[0].kv_cache_spec == full(64)

    def test_different_type_and_size_doubles_block_size(self) -> None:
        config = get_kv_cache_config({"full0": full(128), "sw0": sw(head_size=64)}, 2 * PAGE * 64, LIMITS)
        specs = [g.kv_cache_spec for g in config.kv_cache_groups]
        assert [s.block_size for s in specs] == [16, 32]
        assert {s.page_size_bytes for s in specs} == {2 * PAGE}
        assert config.num_blocks == 64

    def test_non_divisible_page_sizes(self) -> None:
        with pytest.raises(PageSizeUnificationError, match="does not divide the largest page size"):
            get_kv_cache_config(
                {"full0": full(96), "sw0": sw(head_size=64)}, PAGE * 100, LIMITS, profile=VLLM_0_23
            )

    def test_num_blocks_override(self) -> None:
        config = get_kv_cache_config(layers("l", full(), 2), PAGE * 2 * 64, LIMITS, num_blocks_override=16)
        assert config.num_blocks == 16 and config.kv_cache_tensors[0].size == PAGE * 16

    def test_hidden_state_layers_get_their_own_groups(self) -> None:
        hidden = HiddenStateCacheSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=F32)
        # with full attention alone it is one uniform-type group (as in vLLM); in a hybrid it stands apart
        uniform = get_kv_cache_config(
            {"full0": full(), "h0": hidden}, PAGE * 2 * 64, LIMITS, profile=VLLM_0_23
        )
        assert isinstance(uniform.kv_cache_groups[0].kv_cache_spec, UniformTypeKVCacheSpecs)
        config = get_kv_cache_config(
            {"full0": full(), "sw0": sw(), "h0": hidden}, PAGE * 64, LIMITS, profile=VLLM_0_23
        )
        assert group_layout(config) == [("full0",), ("sw0",), ("h0",)]
        h = config.kv_cache_groups[2].kv_cache_spec
        assert h.page_size_bytes == PAGE and h.block_size == PAGE // (64 * 4)
        assert config.kv_cache_tensors == (KVCacheTensor(size=PAGE * 64, shared_by=("full0", "sw0", "h0")),)

    def test_attention_free(self) -> None:
        config = get_kv_cache_config({}, 1 << 30, LIMITS, profile=VLLM_0_23)
        assert config == KVCacheConfig(
            num_blocks=1, kv_cache_tensors=(), kv_cache_groups=(), release=VLLM_0_23.name
        )

    def test_the_planned_config_carries_the_profiles_retention(self) -> None:
        """vLLM 0.34's planner writes its retention (0: sparse) into every config; 0.23 plans dense (None),
        and a config built by hand keeps the dataclass default (None)."""
        specs = {"full0": full(), "sw0": sw()}
        assert get_kv_cache_config(specs, PAGE * 2 * 64, LIMITS).prefix_cache_retention_interval == 0
        assert (
            get_kv_cache_config(
                specs, PAGE * 2 * 64, LIMITS, profile=VLLM_0_23
            ).prefix_cache_retention_interval
            is None
        )
        every_block = VLLM_0_34.derive(prefix_cache_retention_interval=32)
        assert (
            get_kv_cache_config(
                specs, PAGE * 2 * 64, LIMITS, profile=every_block
            ).prefix_cache_retention_interval
            == 32
        )
        assert (
            KVCacheConfig(
                num_blocks=1, kv_cache_tensors=(), kv_cache_groups=()
            ).prefix_cache_retention_interval
            is None
        )

    def test_unregistered_spec_is_reported_with_its_layer(self) -> None:
        with pytest.raises(UnregisteredSpecError, match="layer bad: ForeignSpec"):
            get_kv_cache_config({"bad": ForeignSpec()}, PAGE, LIMITS)


class TestUniformityAndUnification:
    def test_is_uniform(self) -> None:
        assert is_kv_cache_spec_uniform({"a": full(), "b": full(sliding_window=1)})
        assert not is_kv_cache_spec_uniform({"a": full(), "b": sw()})
        assert is_kv_cache_spec_uniform({"a": sw(1), "b": sw(1)})
        assert not is_kv_cache_spec_uniform({"a": sw(1), "b": sw(2)})
        # vLLM raises ValueError here; kvspec answers the question
        assert not is_kv_cache_spec_uniform({"a": full(sliding_window=1), "b": full(sliding_window=2)})

    @pytest.mark.parametrize(
        "others",
        [{"sw": sw()}, {"ch": chunked()}, {"sw": sw(), "ch": chunked()}],
        ids=["sw", "chunked", "both"],
    )
    def test_unify_hybrid_specs(self, others: dict[str, KVCacheSpec]) -> None:
        out = unify_hybrid_kv_cache_specs({"full": full(), **others})
        assert all(type(s) is FullAttentionSpec for s in out.values())
        if "sw" in out:
            assert out["sw"].sliding_window == 128  # type: ignore[attr-defined]
        if "ch" in out:
            assert out["ch"].attention_chunk_size == 256  # type: ignore[attr-defined]

    def test_unify_without_full_fails(self) -> None:
        with pytest.raises(
            HybridUnificationError, match="failed to convert the KV cache specs to one unified type"
        ):
            unify_hybrid_kv_cache_specs({"sw": sw(), "ch": chunked()})

    def test_inputs_are_not_mutated(self) -> None:
        specs: dict[str, KVCacheSpec] = {"full0": full(128), "sw0": sw(head_size=64)}
        before = dict(specs)
        get_kv_cache_groups(specs)
        get_kv_cache_groups(specs, hybrid=False)
        assert specs == before


class TestPagePadding:
    """vLLM 0.34 pads a page that block-size scaling cannot bring to the common page (``pad_pages``)."""

    def test_a_page_that_does_not_divide_the_largest_is_padded_when_asked(self) -> None:
        wide = sw(head_size=96)  # 24,576 bytes: 16,384 does not divide it
        specs = {"full0": full(), "sw0": wide}
        with pytest.raises(PageSizeUnificationError, match="does not divide the largest page size"):
            get_kv_cache_groups(specs, profile=VLLM_0_23)
        groups = get_kv_cache_groups(specs, profile=VLLM_0_34)
        padded = {g.layer_names[0]: g.kv_cache_spec for g in groups}
        assert padded["sw0"] is wide  # the largest page is left alone
        assert padded["full0"] == dataclasses.replace(full(), page_size_padded=wide.page_size_bytes)
        assert padded["full0"].block_size == 16 and padded["full0"].page_size_bytes == 24_576
        # one layer per group, the groups overlaid on one tensor: a block costs one 24,576-byte page
        config = get_kv_cache_config(specs, PAGE * 2 * 32, LIMITS, profile=VLLM_0_34)
        assert config.num_blocks == PAGE * 2 * 32 // 24_576 == 42

    def test_a_page_that_divides_is_still_scaled_not_padded(self) -> None:
        groups = get_kv_cache_groups({"full0": full(), "sw0": sw(head_size=128)}, profile=VLLM_0_34)
        full_spec = next(g.kv_cache_spec for g in groups if g.layer_names == ("full0",))
        assert full_spec.block_size == 32 and getattr(full_spec, "page_size_padded") is None  # noqa: B009

    def test_a_mamba_state_is_padded_and_a_latent_page_is_not(self) -> None:
        mamba = MambaSpec(block_size=16, shapes=((4, 8),), dtypes=(F32,))  # 128 bytes, does not scale
        groups = get_kv_cache_groups({"full0": full(), "m0": mamba}, profile=VLLM_0_34)
        state = next(g.kv_cache_spec for g in groups if g.layer_names == ("m0",))
        assert state == dataclasses.replace(mamba, page_size_padded=PAGE) and state.block_size == 16
        latent = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
        assert not traits_of(latent).page_paddable and traits_of(full()).page_paddable
        with pytest.raises(PageSizeUnificationError, match="does not divide"):
            no_fallback = VLLM_0_34.derive(full_allocation_fallback=False)
            get_kv_cache_groups({"mla0": latent, "sw0": sw(head_size=96)}, profile=no_fallback)

    def test_a_hidden_state_block_divides_the_other_groups_blocks_under_0_34(self) -> None:
        """vLLM 0.34 (B plan:1222-1240): 544-token groups with a 1,114,112-byte page; a hidden-state layer of
        6,144 bytes a token fits 181 tokens, but takes 136, the largest divisor of 544 that fits, so a hit
        (a whole number of 544-token blocks) is a whole number of its blocks; the page stays padded."""
        full_spec = FullAttentionSpec(block_size=544, num_kv_heads=1, head_size=512, dtype=torch.bfloat16)
        mamba = MambaSpec(block_size=544, shapes=((557056,),), dtypes=(torch.bfloat16,))
        hidden = HiddenStateCacheSpec(block_size=544, num_kv_heads=3, head_size=1024, dtype=torch.bfloat16)
        specs: dict[str, KVCacheSpec] = {"full": full_spec, "mamba": mamba, "hidden": hidden}
        assert full_spec.page_size_bytes == mamba.page_size_bytes == 1_114_112

        def hidden_spec(pad: bool) -> KVCacheSpec:
            groups = get_kv_cache_groups(specs, profile=VLLM_0_34 if pad else VLLM_0_23)
            return next(g.kv_cache_spec for g in groups if g.layer_names == ("hidden",))

        assert hidden_spec(False).block_size == 181  # 0.23: as many tokens as the page holds
        assert hidden_spec(True).block_size == 136 and hidden_spec(True).page_size_bytes == 1_114_112


class TestEagleGroups:
    def test_the_groups_holding_draft_layers_are_the_eagle_groups(self) -> None:
        groups = get_kv_cache_groups({**layers("full", full(), 2), **layers("sw", sw(), 2)})
        marked = mark_eagle_groups(groups, {"sw1"})
        assert [g.is_eagle_group for g in marked] == ["sw1" in g.layer_names for g in groups]
        assert sum(g.is_eagle_group for g in marked) == 1
        assert [g.layer_names for g in marked] == [g.layer_names for g in groups]
        assert not any(g.is_eagle_group for g in mark_eagle_groups(marked, ()))

    def test_untagged_draft_layers_are_noticed_only_beside_state_layers(self) -> None:
        mamba = MambaSpec(block_size=16, shapes=((4, 8),), dtypes=(F32,), page_size_padded=PAGE)
        hybrid = get_kv_cache_groups({"full0": full(), "m0": mamba})
        assert draft_groups_unidentified(hybrid)
        assert not draft_groups_unidentified(mark_eagle_groups(hybrid, {"full0"}))
        assert not draft_groups_unidentified(get_kv_cache_groups({"full0": full(), "sw0": sw()}))


class TestMemory:
    def test_plan_num_blocks_takes_the_placements_block_cost(self) -> None:
        """An engine whose placement pads a block (alignment) says what a block costs each worker: the
        count and the null-block check use that cost, and the smallest worker's count wins."""
        groups = get_kv_cache_groups(layers("l", full(), 2))
        two = [groups, groups]

        def budgets(memory: list[int], **kw: Any) -> WorkerBudgets:
            return WorkerBudgets(worker_groups=two, available_bytes=memory, **kw)

        assert plan_num_blocks(budgets([PAGE * 2 * 20, PAGE * 2 * 30]), LIMITS) == 20
        padded = [PAGE * 2, PAGE * 4]
        assert plan_num_blocks(budgets([PAGE * 2 * 20] * 2, block_bytes=padded), LIMITS) == 10
        with pytest.raises(InsufficientKVCacheMemoryError, match="on worker 1"):  # 8 blocks, 7 usable
            plan_num_blocks(budgets([PAGE * 2 * 16] * 2, block_bytes=padded, reserve_null_block=True), LIMITS)
        assert (
            plan_num_blocks(budgets([PAGE * 2 * 18] * 2, block_bytes=padded, reserve_null_block=True), LIMITS)
            == 9
        )
        assert plan_num_blocks(budgets([1, 1], num_blocks_override=9, reserve_null_block=True), LIMITS) == 9
        # a worker without layers (a pipeline stage holding none) is skipped; the short one keeps its rank
        with pytest.raises(InsufficientKVCacheMemoryError, match="on worker 1"):
            plan_num_blocks(
                WorkerBudgets(worker_groups=[[], groups], available_bytes=[0, PAGE * 2 * 4]), LIMITS
            )
        empty = WorkerBudgets(worker_groups=[[], []], available_bytes=[0, 0])
        assert plan_num_blocks(empty, LIMITS) == 1  # no KV cache: the null block
        with pytest.raises(PlanningError, match="give one of each per worker"):
            budgets([PAGE])
        assert auto_fit_from_groups(budgets([PAGE * 2 * 10] * 2, block_bytes=padded), LARGE) == 80

    def test_estimate_max_model_len(self) -> None:
        spec = FullAttentionSpec(block_size=16, num_kv_heads=32, head_size=128, dtype=torch.float16)
        groups = get_kv_cache_groups(layers("l", spec, 32))
        assert estimate_max_model_len(groups, 8 * (1 << 30), SchedulerLimits(max_model_len=16385)) == 16384
        assert estimate_max_model_len(groups, 8 * (1 << 30), SchedulerLimits(max_model_len=16383)) == 16383

    def test_max_concurrency(self) -> None:
        limits = SchedulerLimits(max_model_len=16384, max_num_batched_tokens=1024)
        spec = FullAttentionSpec(block_size=16, num_kv_heads=32, head_size=128, dtype=torch.float16)
        window = SlidingWindowSpec(
            block_size=16, num_kv_heads=32, head_size=128, dtype=torch.float16, sliding_window=1024
        )

        def config(groups: list[KVCacheGroupSpec], num_blocks: int) -> KVCacheConfig:
            return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=(), kv_cache_groups=tuple(groups))

        g_full = KVCacheGroupSpec(layer_names=tuple(f"f{i}" for i in range(32)), kv_cache_spec=spec)
        g_sw = KVCacheGroupSpec(layer_names=tuple(f"s{i}" for i in range(32)), kv_cache_spec=window)
        assert get_max_concurrency(config([g_full], int(1024 * 1.5)), limits) == 1.5
        assert get_max_concurrency(config([g_sw], 129 * 3), limits) == 3
        assert get_max_concurrency(config([g_full, g_sw], 1153 * 3), limits) == 3

    def test_hybrid_memory_counts_padding_layers(self) -> None:
        specs = {**layers("full", full(), 3), **layers("sw", sw(), 7)}
        groups = get_kv_cache_groups(specs)
        per_full = (LIMITS.max_model_len // 16) * PAGE
        per_sw = sw().max_memory_usage_bytes(LIMITS)
        assert max_memory_usage_bytes_from_groups(groups, LIMITS) == 3 * PAGE * (
            per_full // PAGE + 3 * (per_sw // PAGE)
        )

    def test_not_enough_memory_names_the_numbers(self) -> None:
        spec = FullAttentionSpec(block_size=16, num_kv_heads=32, head_size=128, dtype=torch.float16)
        with pytest.raises(InsufficientKVCacheMemoryError) as info:
            get_kv_cache_config(
                layers("l", spec, 32), 4 * (1 << 30), SchedulerLimits(max_model_len=16384), profile=VLLM_0_23
            )
        err = info.value
        assert err.needed_bytes == 8 * (1 << 30) and err.available_bytes == 4 * (1 << 30)
        assert err.estimated_max_model_len == 8192
        assert re.search(
            r"max seq len \(16384\), 8\.00 GiB KV cache is needed.*\(4\.00 GiB\).*is 8192\.", str(err)
        )

    def test_no_memory_at_all(self) -> None:
        with pytest.raises(InsufficientKVCacheMemoryError, match="No available memory for the cache blocks"):
            get_kv_cache_config(layers("l", full(), 2), 0, LIMITS)

    def test_override_too_small_is_checked(self) -> None:
        with pytest.raises(InsufficientKVCacheMemoryError, match="max seq len"):
            get_kv_cache_config(layers("l", full(), 2), PAGE * 1000, LIMITS, num_blocks_override=4)

    def test_auto_fit(self) -> None:
        specs = layers("l", full(), 2)
        assert auto_fit_max_model_len([specs], [PAGE * 2 * 1000], LARGE, profile=VLLM_0_23) == 1024
        fitted = auto_fit_max_model_len([specs], [PAGE * 2 * 10], LARGE, profile=VLLM_0_23)
        assert fitted == 160  # 10 blocks of 16 tokens per layer
        hybrid = {"full0": full(), "sw0": sw()}
        assert 0 < auto_fit_max_model_len([hybrid], [PAGE * 20], LARGE) < 1024
        with pytest.raises(InsufficientKVCacheMemoryError, match="Cannot auto-fit max_model_len"):
            auto_fit_max_model_len([specs], [10], LARGE)

    def test_the_null_block_is_held_back_from_the_checks_when_asked(self) -> None:
        """vLLM 0.34 (``reserve_null_block``): a request of max_model_len tokens must fit the blocks beside
        the null block. 128 tokens need 8 blocks of 16: 8 blocks of memory pass without the reservation
        and are refused with it, 9 pass, and the blocks allocated still come from all the memory."""
        specs = layers("l", full(), 2)
        assert get_kv_cache_config(specs, PAGE * 2 * 8, LIMITS, profile=VLLM_0_23).num_blocks == 8
        with pytest.raises(InsufficientKVCacheMemoryError, match="max seq len") as info:
            get_kv_cache_config(specs, PAGE * 2 * 8, LIMITS, profile=VLLM_0_34)
        assert info.value.available_bytes == PAGE * 2 * 7 and info.value.estimated_max_model_len == 112
        assert get_kv_cache_config(specs, PAGE * 2 * 9, LIMITS, profile=VLLM_0_34).num_blocks == 9
        with pytest.raises(
            InsufficientKVCacheMemoryError, match="max seq len"
        ):  # the override's 8 blocks too
            get_kv_cache_config(specs, PAGE * 2 * 100, LIMITS, num_blocks_override=8, profile=VLLM_0_34)
        assert auto_fit_max_model_len([specs], [PAGE * 2 * 10], LARGE, profile=VLLM_0_34) == 144
        with pytest.raises(
            InsufficientKVCacheMemoryError, match="Cannot auto-fit"
        ):  # one block: the null one
            auto_fit_max_model_len([specs], [PAGE * 2], LARGE, profile=VLLM_0_34)


class TestMultipleWorkers:
    def test_identical_workers(self) -> None:
        specs = layers("l", full(), 2)
        configs = get_kv_cache_configs([specs, specs], [PAGE * 2 * 10] * 2, LIMITS)
        assert [c.num_blocks for c in configs] == [10, 10]

    def test_tensor_parallel_unequal_memory_takes_the_minimum(self) -> None:
        specs = layers("l", full(), 2)
        configs = get_kv_cache_configs([specs, specs], [PAGE * 2 * 100, PAGE * 2 * 70], LIMITS)
        assert [c.num_blocks for c in configs] == [70, 70]
        assert all(t.size == PAGE * 70 for c in configs for t in c.kv_cache_tensors)

    def test_pipeline_parallel_disjoint_layers(self) -> None:
        w0, w1 = layers("l", full(), 2), layers("l", full(), 2, start=2)
        configs = get_kv_cache_configs([w0, w1], [PAGE * 2 * 100, PAGE * 2 * 80], LIMITS)
        assert [c.num_blocks for c in configs] == [80, 80]
        assert [t.shared_by for t in configs[0].kv_cache_tensors] == [("l0",), ("l1",)]
        assert [t.shared_by for t in configs[1].kv_cache_tensors] == [("l2",), ("l3",)]

    def test_hybrid_pipeline_keeps_empty_groups(self) -> None:
        w0 = {"full0": full(), "full1": full()}
        w1 = {"sw0": sw(), "sw1": sw()}
        configs = get_kv_cache_configs([w0, w1], [PAGE * 2 * 40] * 2, LIMITS)
        assert [g.layer_names for g in configs[0].kv_cache_groups] == [("full0", "full1"), ()]
        assert [g.layer_names for g in configs[1].kv_cache_groups] == [(), ("sw0", "sw1")]
        assert isinstance(configs[0].kv_cache_groups[1].kv_cache_spec, SlidingWindowSpec)
        assert configs[0].num_blocks == configs[1].num_blocks == 40

    def test_one_full_two_sw_per_worker_gives_three_groups_sharing_a_tensor(self) -> None:
        w0 = {"full0": full(), "sw0": sw(), "sw1": sw()}
        w1 = {"full1": full(), "sw2": sw(), "sw3": sw()}
        configs = get_kv_cache_configs([w0, w1], [PAGE * 2 * 16] * 2, LIMITS)
        assert [g.layer_names for g in configs[0].kv_cache_groups] == [("full0",), ("sw0",), ("sw1",)]
        assert [t.shared_by for t in configs[0].kv_cache_tensors] == [("full0", "sw0", "sw1")]
        assert [t.shared_by for t in configs[1].kv_cache_tensors] == [("full1", "sw2", "sw3")]

    def test_conflicting_specs_for_one_layer(self) -> None:
        with pytest.raises(ConflictingLayerSpecError, match="layer l0 differ across workers"):
            get_kv_cache_configs([{"l0": full()}, {"l0": full(128)}], [PAGE * 100] * 2, LIMITS)

    def test_insufficient_memory_names_the_worker(self) -> None:
        specs = layers("l", full(), 2)
        with pytest.raises(InsufficientKVCacheMemoryError, match="on worker 1"):
            get_kv_cache_configs([specs, specs], [PAGE * 2 * 100, PAGE * 2], LIMITS)

    def test_project_narrows_uniform_specs(self) -> None:
        groups = get_kv_cache_groups({"a": full(64), "b": full(128)})
        (projected,) = project_groups_to_worker(groups, {"a": None})
        assert isinstance(projected.kv_cache_spec, UniformTypeKVCacheSpecs)
        assert list(projected.kv_cache_spec.kv_cache_specs) == ["a"]
        (empty,) = project_groups_to_worker(groups, {})
        assert empty.layer_names == () and empty.kv_cache_spec == groups[0].kv_cache_spec


# -- cross-layer KV sharing ------------------------------------------------------------------------


def _sharing_groups() -> tuple[KVCacheGroupSpec, ...]:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    return (
        KVCacheGroupSpec(layer_names=("l.0",), kv_cache_spec=spec),
        KVCacheGroupSpec(layer_names=("l.1",), kv_cache_spec=spec),
    )


def test_sharing_layers_join_their_targets_group_in_mapping_order() -> None:
    groups = _sharing_groups()
    out = add_kv_sharing_layers(groups, {"l.3": "l.1", "l.2": "l.0", "l.4": "l.1"})
    assert [g.layer_names for g in out] == [("l.0", "l.2"), ("l.1", "l.3", "l.4")]
    assert out[0].kv_cache_spec is groups[0].kv_cache_spec
    assert [g.layer_names for g in groups] == [("l.0",), ("l.1",)]  # values: the input is unchanged
    assert add_kv_sharing_layers(groups, {}) == groups


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"l.2": "l.9"}, "'l.9' is in no KV cache group"),
        ({"l.1": "l.0"}, "already belongs to KV cache group 1"),
        ({"l.2": "l.0", "l.3": "l.2"}, "which itself shares 'l.0'"),
    ],
)
def test_bad_sharing_maps_are_planning_errors(mapping: dict[str, str], message: str) -> None:
    with pytest.raises(PlanningError, match=message):
        add_kv_sharing_layers(_sharing_groups(), mapping)


def test_layers_of_one_spec_class_with_different_values_get_different_groups() -> None:
    """Two window sizes interleaved (4 : 4) beside full attention: each window is its own group, the layers
    in model order, and equal specs that are distinct objects still share a group."""

    def sw(window: int) -> SlidingWindowSpec:
        return SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=F32, sliding_window=window)

    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=F32)
    specs: dict[str, KVCacheSpec] = {}
    for i in range(12):
        specs[f"l{i}"] = full if i % 3 == 2 else sw(128 if i % 3 == 0 else 256)
    groups = get_kv_cache_groups(specs)
    by_window = {getattr(g.kv_cache_spec, "sliding_window", None): list(g.layer_names) for g in groups}
    assert by_window == {
        128: ["l0", "l3", "l6", "l9"],
        256: ["l1", "l4", "l7", "l10"],
        None: ["l2", "l5", "l8", "l11"],
    }
