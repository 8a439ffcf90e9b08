"""The whole manager contract (issue 35): what a coordinator calls is the ``KVCacheManager`` protocol plus the
capability protocols a manager declares, checked at registration; vLLM's attribute names are the base
manager's documented surface, so a manager ported from vLLM runs unchanged."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

from examples.compressed_latent.plugin import CompressedLatentSpec
from kvspec import (
    FullAttentionManager,
    FullAttentionSpec,
    HitQuery,
    HitResult,
    KVCacheBlock,
    ManagerContext,
    MLAAttentionSpec,
    Registry,
    RequestView,
    SchedulerLimits,
    SlidingWindowSpec,
)
from kvspec.contracts.manager import (
    BOUNDARY_STATES,
    EXTERNAL_BLOCKS,
    MANAGER_CAPABILITIES,
    RETENTION,
    SUB_BLOCK_HITS,
    BoundaryState,
    declared_capabilities,
)
from kvspec.coordinator import KVCacheCoordinator
from kvspec.errors import ManagerProtocolError, ManagerSignatureError, PluginContractError
from kvspec.intmath import cdiv
from kvspec.managers.base import BASE_CAPABILITIES, SingleTypeKVCacheManager
from kvspec.planning import get_kv_cache_config
from kvspec.registry.builtins import default_registry
from kvspec.testing import check_plugin
from tests.helpers import make_request

F16 = torch.float16


# -- a manager ported from vLLM (vllm-ascend's CompressAttentionManager shape) --------------------------------


class CompressAttentionManager(FullAttentionManager):
    """vllm-ascend's DeepSeek V4 compressed-MLA manager as a platform ports it: its bodies are written the
    way vLLM's manager subclasses are, reading and writing ``self.req_to_blocks``, ``self.num_cached_block``,
    ``self._null_block``, ``self.block_pool``, ``self.kv_cache_spec`` and ``self.kv_cache_group_id``. A block
    has ``block_size`` rows of ``compress_ratio`` tokens each; allocation divides tokens by the ratio, caching
    keys logical blocks of ``block_size * compress_ratio`` tokens."""

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        ratio = self.kv_cache_spec.compress_ratio  # type: ignore[attr-defined]
        num_required_blocks = cdiv(cdiv(num_tokens, ratio), self.kv_cache_spec.block_size)
        if request_id in self.num_cached_block:  # running: no new hit blocks
            return max(num_required_blocks - len(self.req_to_blocks[request_id]), 0)
        held = len(self.req_to_blocks.get(request_id, ()))
        num_new_blocks = max(num_required_blocks - len(new_computed_blocks) - held, 0)
        num_evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and b is not self._null_block)
        return num_new_blocks + num_evictable

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        ratio = self.kv_cache_spec.compress_ratio  # type: ignore[attr-defined]
        req_blocks = self.req_to_blocks[request_id]
        num_new_blocks = cdiv(cdiv(num_tokens, ratio), self.kv_cache_spec.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: RequestView, num_tokens: int) -> None:
        logical_block_size = self.kv_cache_spec.block_size * self.kv_cache_spec.compress_ratio  # type: ignore[attr-defined]
        num_cached_blocks = self.num_cached_block.get(request.request_id, 0)
        num_full_blocks = num_tokens // logical_block_size
        if num_cached_blocks >= num_full_blocks:
            return
        self.block_pool.cache_full_blocks(
            request,
            self.req_to_blocks[request.request_id],
            num_cached_blocks,
            num_full_blocks,
            logical_block_size,
            self.kv_cache_group_id,
        )
        self.num_cached_block[request.request_id] = num_full_blocks

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        hit = super().find_longest_cache_hit(query)
        logical = query.traits.block_tokens(query.kv_cache_spec.block_size)
        return HitResult(hit.blocks, num_tokens=hit.num_blocks * logical)


COMPRESSED = CompressedLatentSpec(block_size=16, head_size=32, dtype=F16, compress_ratio=4)


def test_a_manager_ported_from_vllm_passes_the_kit_in_a_hybrid() -> None:
    report = check_plugin(COMPRESSED, CompressAttentionManager)
    assert any("beside full attention" in c for c in report.checks), report
    assert any("prefix hit" in c for c in report.checks), report


@pytest.fixture
def compressed_registry() -> Iterator[Registry[Any, Any]]:
    with default_registry.isolated():
        default_registry.register(CompressedLatentSpec, CompressAttentionManager)
        yield default_registry


@pytest.mark.usefixtures("compressed_registry")
def test_the_port_reads_and_writes_vllms_state_names() -> None:
    """The port's state is the base manager's state: a hit found by kvspec's search is the blocks the port
    cached under vLLM's names, counted in logical tokens, and freeing returns every block."""
    config = get_kv_cache_config(
        {"l0": COMPRESSED, "l1": COMPRESSED}, 0, SchedulerLimits(max_model_len=1024), num_blocks_override=24
    )
    coord = KVCacheCoordinator(config, SchedulerLimits(max_model_len=1024))
    (manager,) = coord.managers
    assert isinstance(manager, CompressAttentionManager)
    first = make_request(coord, "a", list(range(1, 201)))
    coord.allocate_slots(first, 200, 0, None)
    assert len(manager.req_to_blocks["a"]) == 4  # cdiv(cdiv(200, 4), 16)
    assert manager.num_cached_block["a"] == 3  # 3 full logical blocks of 64 tokens
    assert manager.num_cached_blocks("a") == 3  # the kvspec-native view of the same dict
    assert manager._null_block is coord.block_pool.null_block
    first.num_computed_tokens = 200
    coord.free(first)
    assert "a" not in manager.req_to_blocks and "a" not in manager.num_cached_block
    second = make_request(coord, "b", [*range(1, 131), 7, 7, 7])
    blocks, hit = coord.get_computed_blocks(second)
    assert hit == 128 and len(blocks.blocks[0]) == 2
    coord.check_invariants()


def test_vllm_state_names_are_the_base_managers_own() -> None:
    """``req_to_blocks``, ``num_cached_block`` and ``_null_block`` are attributes of every built-in manager
    (they were private and renamed once, which broke every vLLM-shaped subclass)."""
    config = get_kv_cache_config({"f": _full()}, 0, SchedulerLimits(max_model_len=64), num_blocks_override=8)
    coord = KVCacheCoordinator(config, SchedulerLimits(max_model_len=64))
    manager = coord.managers[0]
    request = make_request(coord, "r", list(range(40)))
    coord.allocate_slots(request, 40, 0, None)
    assert isinstance(manager, SingleTypeKVCacheManager)
    assert [b.block_id for b in manager.req_to_blocks["r"]] == coord.get_block_ids("r")[0]
    assert manager.num_cached_block["r"] == 2  # 40 tokens: two full 16-token blocks published


# -- a manager written from scratch, declaring capabilities ------------------------------------------------------


def _full(block_size: int = 16) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=8, dtype=F16)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScratchSpec(FullAttentionSpec):
    """Full attention a platform runs with its own manager."""


def _scratch() -> ScratchSpec:
    return ScratchSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=F16)


class ScratchPrefixManager:
    """Full attention with prefix caching, no kvspec base class: every protocol member, and the hooks of
    the three capabilities it declares (external tokens attached in two phases, boundary states, retention).
    It records the order of the two-phase calls."""

    manager_capabilities: ClassVar[frozenset[str]] = frozenset({EXTERNAL_BLOCKS, BOUNDARY_STATES, RETENTION})
    calls: ClassVar[list[str]] = []

    def __init__(self, context: ManagerContext) -> None:
        self.context = context
        self.pool = context.block_pool
        self.block_size = context.block_size
        self.group = context.kv_cache_group_id
        self.blocks: dict[str, list[KVCacheBlock]] = {}
        self.cached: dict[str, int] = {}
        self.new_ids: list[int] = []
        self.retention: int | None = context.prefix_cache_retention_interval

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        held = len(self.blocks.get(request_id, ())) + len(new_computed_blocks)
        evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        return max(cdiv(num_tokens, self.block_size) - held, 0) + evictable

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        self.calls.append(f"attach:{self.group}")
        self.add_local_computed_blocks(
            request_id, new_computed_blocks, num_local_computed_tokens, num_external_computed_tokens
        )
        self.allocate_external_computed_blocks(
            request_id, num_local_computed_tokens, num_external_computed_tokens
        )

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        self.calls.append(f"local:{self.group}")
        if self.context.enable_caching:
            self.pool.touch(list(new_computed_blocks))
        self.blocks.setdefault(request_id, []).extend(new_computed_blocks)
        self.cached[request_id] = len(new_computed_blocks)

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None:
        self.calls.append(f"external:{self.group}")
        blocks = self.blocks.setdefault(request_id, [])
        need = cdiv(num_local_computed_tokens + num_external_computed_tokens, self.block_size) - len(blocks)
        if need > 0:
            new = self.pool.get_new_blocks(need)
            blocks.extend(new)
            if record_for_zeroing:
                self.new_ids.extend(b.block_id for b in new)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        blocks = self.blocks.setdefault(request_id, [])
        need = cdiv(num_tokens, self.block_size) - len(blocks)
        new = self.pool.get_new_blocks(need) if need > 0 else []
        blocks.extend(new)
        self.new_ids.extend(b.block_id for b in new)
        return new

    def cache_blocks(self, request: RequestView, num_tokens: int) -> None:
        done, full = self.cached.get(request.request_id, 0), num_tokens // self.block_size
        if full > done:
            blocks = self.blocks[request.request_id]
            self.pool.cache_full_blocks(request, blocks, done, full, self.block_size, self.group)
            self.cached[request.request_id] = full

    def free(self, request_id: str) -> None:
        self.pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)))

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        self.cached.pop(request_id, None)
        return self.blocks.pop(request_id, [])

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        pass

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0

    def get_blocks(self, request_id: str) -> Sequence[KVCacheBlock]:
        return self.blocks.get(request_id, [])

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        size = query.traits.block_tokens(query.kv_cache_spec.block_size)
        limit = min(query.max_length // size, len(query.block_hashes))
        hit: tuple[list[KVCacheBlock], ...] = tuple([] for _ in query.kv_cache_group_ids)
        for block_hash in query.block_hashes[:limit]:
            found = query.block_pool.get_cached_block(block_hash, query.kv_cache_group_ids)
            if found is None:
                break
            for blocks, block in zip(hit, found):
                blocks.append(block)
        if query.use_eagle and hit[0]:
            for blocks in hit:
                blocks.pop()
        keep = len(hit[0]) * size // query.alignment_tokens * query.alignment_tokens // size
        return HitResult(tuple(blocks[:keep] for blocks in hit))

    def new_step_starts(self) -> None:
        pass

    def iter_held_blocks(self) -> Iterator[KVCacheBlock]:
        for blocks in self.blocks.values():
            yield from (b for b in blocks if not b.is_null)

    def take_new_block_ids(self) -> list[int]:
        ids, self.new_ids = self.new_ids, []
        return ids

    def take_boundary_states(self) -> list[BoundaryState]:
        return []

    def set_prefix_cache_retention_interval(self, interval: int | None) -> None:
        self.retention = interval


def test_a_from_scratch_manager_passes_the_kit_in_a_hybrid() -> None:
    report = check_plugin(_scratch(), ScratchPrefixManager, uniform_type_base_spec=FullAttentionSpec)
    assert any("beside full attention" in c for c in report.checks), report
    assert any("prefix hit" in c for c in report.checks), report


def _scratch_hybrid() -> KVCacheCoordinator:
    """Full attention run by the scratch manager beside a sliding window (two decoder groups)."""
    window = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=F16, sliding_window=32)
    limits = SchedulerLimits(max_model_len=512)
    config = get_kv_cache_config({"f": _scratch(), "w": window}, 0, limits, num_blocks_override=80)
    return KVCacheCoordinator(config, limits)


def test_a_declared_capability_is_called_and_an_undeclared_one_is_not() -> None:
    with default_registry.isolated():
        default_registry.register(ScratchSpec, ScratchPrefixManager, uniform_type_base_spec=FullAttentionSpec)
        coord = _scratch_hybrid()
        scratch = coord.managers[0]
        assert isinstance(scratch, ScratchPrefixManager)
        # Two-phase external attach: every group's hit, then every group's external blocks (the halves are
        # called by the coordinator, never the one-call attach).
        ScratchPrefixManager.calls.clear()
        request = make_request(coord, "r", list(range(100)))
        assert coord.allocate_slots(request, 20, 0, None, num_external_computed_tokens=48) is not None
        assert ScratchPrefixManager.calls == ["local:0", "external:0"]
        assert len(scratch.blocks["r"]) == cdiv(68, 16)  # 48 external + 20 new tokens
        # Retention changes reach the manager that declares it.
        coord.set_prefix_cache_retention_interval(64)
        assert scratch.retention == 64
        # It declares no sub-block hits: the coordinator never asks it for block copies.
        assert SUB_BLOCK_HITS not in declared_capabilities(ScratchPrefixManager)
        assert coord.take_block_copies() == ([], [])
        coord.free(request)
        coord.check_invariants()


def test_the_two_phase_attach_runs_only_when_every_decoder_declares_it() -> None:
    """A hybrid whose other manager lacks the hooks attaches external tokens per group in one call."""
    with default_registry.isolated():
        default_registry.register(ScratchSpec, ScratchPrefixManager, uniform_type_base_spec=FullAttentionSpec)
        assert _scratch_hybrid()._two_phase_external
    without = type("NoTwoPhase", (ScratchPrefixManager,), {"manager_capabilities": frozenset({RETENTION})})
    with default_registry.isolated():
        default_registry.register(ScratchSpec, without, uniform_type_base_spec=FullAttentionSpec)
        coord = _scratch_hybrid()
        assert not coord._two_phase_external
        ScratchPrefixManager.calls.clear()
        request = make_request(coord, "r", list(range(100)))
        assert coord.allocate_slots(request, 20, 0, None, num_external_computed_tokens=48) is not None
        # The coordinator made the one call; the manager ran both halves itself.
        assert ScratchPrefixManager.calls == ["attach:0", "local:0", "external:0"]


def _without(member: str) -> type:
    """ScratchPrefixManager's body less ``member`` (a class that still declares its capability)."""
    body = {
        k: v for k, v in vars(ScratchPrefixManager).items() if k not in (member, "__dict__", "__weakref__")
    }
    return type(f"ScratchWithout_{member}", (), body)


@pytest.mark.parametrize(
    ("member", "capability"),
    [
        ("allocate_external_computed_blocks", EXTERNAL_BLOCKS),
        ("add_local_computed_blocks", EXTERNAL_BLOCKS),
        ("take_boundary_states", BOUNDARY_STATES),
        ("set_prefix_cache_retention_interval", RETENTION),
    ],
)
def test_removing_a_declared_hook_fails_registration_naming_it(member: str, capability: str) -> None:
    registry: Registry[Any, Any] = Registry(name="scratch")
    with pytest.raises(
        ManagerProtocolError, match=f"declares the '{capability}' capability but lacks {member}"
    ):
        registry.register(ScratchSpec, _without(member))


def test_a_hook_with_the_wrong_parameters_and_an_unknown_capability_are_refused() -> None:
    def take_boundary_states(self: object, request_id: str) -> list[BoundaryState]:
        return []

    wrong = type("WrongHook", (ScratchPrefixManager,), {"take_boundary_states": take_boundary_states})
    with pytest.raises(ManagerSignatureError, match="take_boundary_states"):
        Registry[Any, Any](name="scratch").register(ScratchSpec, wrong)
    unknown = type("Unknown", (ScratchPrefixManager,), {"manager_capabilities": frozenset({"teleport"})})
    with pytest.raises(ManagerProtocolError, match=r"unknown capability.*teleport"):
        Registry[Any, Any](name="scratch").register(ScratchSpec, unknown)


def test_the_base_manager_declares_every_capability_but_sub_block_hits() -> None:
    assert BASE_CAPABILITIES == frozenset(MANAGER_CAPABILITIES) - {SUB_BLOCK_HITS}
    assert declared_capabilities(FullAttentionManager) == BASE_CAPABILITIES | {SUB_BLOCK_HITS}
    assert declared_capabilities(object) == frozenset()


# -- architecture: the coordinator never tests a manager's class -------------------------------------------------

KVSPEC = pathlib.Path(__file__).resolve().parents[3] / "kvspec"


def _class_tests(path: pathlib.Path) -> list[str]:
    """isinstance/issubclass calls naming a manager class, and getattr probes of manager flags, in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
            if "Manager" in ast.unparse(node.args[1]):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        if node.func.id == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            if str(node.args[1].value).startswith("supports_"):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_class_tests_of_managers_outside_the_managers_package() -> None:
    offenders = [
        hit
        for path in sorted(KVSPEC.rglob("*.py"))
        if "managers" not in path.relative_to(KVSPEC).parts
        and "integrations" not in path.relative_to(KVSPEC).parts
        for hit in _class_tests(path)
    ]
    assert offenders == []


def test_the_architecture_check_finds_a_class_test() -> None:
    """The check above can fail: a coordinator-like module testing a manager's class is reported."""
    probe = KVSPEC.parent / "tests" / "unit" / "managers" / "_class_test_probe.txt"
    probe.write_text(
        "def f(m):\n    return isinstance(m, SingleTypeKVCacheManager) or getattr(m, 'supports_x', 0)\n"
    )
    try:
        assert len(_class_tests(probe)) == 2
    finally:
        probe.unlink()


# -- what the kit catches in a vLLM-shaped port: vllm-ascend's AscendMLAAttentionSpec.merge ------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class MergeDropsModelVersion(MLAAttentionSpec):
    """vllm-ascend's ``AscendMLAAttentionSpec.merge`` shape: it rebuilds the merged spec from the first spec's
    fields it knows and so forgets ``model_version`` (DeepSeek V4's 584-byte fp8 token)."""

    scale_dim: int = 0

    @classmethod
    def merge(cls, specs: Sequence[MLAAttentionSpec]) -> MergeDropsModelVersion:
        first = specs[0]
        return cls(
            block_size=first.block_size,
            num_kv_heads=first.num_kv_heads,
            head_size=first.head_size,
            dtype=first.dtype,
            cache_dtype_str=first.cache_dtype_str,
            compress_ratio=first.compress_ratio,
        )


def test_the_kit_refuses_a_merge_that_drops_model_version() -> None:
    """The merged spec of one group would size DeepSeek V4's pages as V3's (656 bytes a token, not 584): the
    kit refuses it, naming the merge (docs/PLUGINS.md's worked example)."""
    spec = MergeDropsModelVersion(
        block_size=64,
        num_kv_heads=1,
        head_size=512,
        dtype=torch.bfloat16,
        cache_dtype_str="fp8_ds_mla",
        model_version="deepseek_v4",
    )
    assert MergeDropsModelVersion.merge([spec]).page_size_bytes != spec.page_size_bytes
    with pytest.raises(PluginContractError, match=r"MergeDropsModelVersion\.merge"):
        check_plugin(spec, FullAttentionManager, uniform_type_base_spec=MLAAttentionSpec)
