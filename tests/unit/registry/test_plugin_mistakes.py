"""Typical plugin mistakes, one test each: every one gets a clear KVSpecError subclass, at registration or
from the conformance kit, naming what is wrong; none passes silently or crashes later in the core."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pytest
import torch
from typing_extensions import Self

from kvspec import (
    BlockPool,
    FullAttentionManager,
    FullAttentionSpec,
    HitQuery,
    HitResult,
    KVCacheBlock,
    KVSpecError,
    ManagerContext,
    Registry,
    Request,
    SchedulerLimits,
    SingleTypeKVCacheManager,
    SlidingWindowManager,
    SlidingWindowSpec,
    SpecCollection,
    SpecTraits,
    default_registry,
    register_kv_cache_spec,
)
from kvspec.device.kv_cache import page_views_of
from kvspec.errors import (
    ConflictingRegistrationError,
    DeviceError,
    KVSpecTypeError,
    ManagerProtocolError,
    ManagerSignatureError,
    MissingManagerError,
    PluginContractError,
    RegistrationError,
    RegistryBoundError,
    SpecClassError,
    SpecProtocolError,
    TraitsError,
    UniformBaseError,
)
from kvspec.registry.builtins import register_builtins
from kvspec.testing import check_plugin

ATTN: dict[str, Any] = dict(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16)


def fresh() -> Registry[Any, Any]:
    reg: Registry[Any, Any] = Registry(name="mistakes")
    register_builtins(reg)
    return reg


# -- a correct from-scratch spec and manager, which each mistake below breaks in one place ----------


@dataclass(frozen=True, kw_only=True, slots=True)
class GoodSpec:
    block_size: int = 16
    num_kv_heads: int = 2

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * 4

    def max_memory_usage_bytes(self, limits: SchedulerLimits) -> int:
        return -(limits.max_model_len // -self.block_size) * self.page_size_bytes

    def copy_with_new_block_size(self, block_size: int) -> Self:
        return dataclasses.replace(self, block_size=block_size)

    @classmethod
    def merge(cls, specs: Sequence[Self]) -> Self:
        return specs[0]

    def is_uniform_with_collection(self, specs: SpecCollection) -> bool:
        return all(isinstance(s, type(self)) for s in (specs.values() if isinstance(specs, dict) else specs))

    def kv_cache_traits(self) -> SpecTraits:
        return SpecTraits(prefix_hits_left_closed=True, kind="good", zero_new_blocks=True)


def variant(name: str, **members: Any) -> type:
    """GoodSpec with some members replaced (None deletes one), as a new frozen dataclass."""
    ns = {
        k: v
        for k, v in vars(GoodSpec).items()
        if not k.startswith("__") and k not in ("block_size", "num_kv_heads")
    }
    ns.update(members)
    ns = {k: v for k, v in ns.items() if v is not None}
    ns["__annotations__"] = {"block_size": int, "num_kv_heads": int}
    ns["block_size"], ns["num_kv_heads"] = 16, 2
    return dataclass(frozen=True, kw_only=True)(type(name, (), ns))


def test_the_good_spec_and_manager_pass() -> None:
    report = check_plugin(GoodSpec(), FullAttentionManager)
    assert "event kind 'good'" in report.checks


# -- spec classes rejected at registration ---------------------------------------------------------

SPEC_CLASS_MISTAKES: list[tuple[str, Callable[[], type], type[KVSpecError], str]] = [
    (
        "missing block_size",
        lambda: variant("NoBlockSize", __annotations__=None),
        SpecProtocolError,
        "missing",
    ),
    (
        "missing page_size_bytes",
        lambda: variant("NoPage", page_size_bytes=None),
        SpecProtocolError,
        "missing page_size_bytes",
    ),
    (
        "missing max_memory_usage_bytes",
        lambda: variant("NoMem", max_memory_usage_bytes=None),
        SpecProtocolError,
        "missing max_memory_usage_bytes",
    ),
    (
        "missing copy_with_new_block_size",
        lambda: variant("NoCopy", copy_with_new_block_size=None),
        SpecProtocolError,
        "missing copy_with_new_block_size",
    ),
    ("missing merge", lambda: variant("NoMerge", merge=None), SpecProtocolError, "missing merge"),
    (
        "missing is_uniform_with_collection",
        lambda: variant("NoUni", is_uniform_with_collection=None),
        SpecProtocolError,
        "missing is_uniform_with_collection",
    ),
    (
        "page_size_bytes as a method",
        lambda: variant("PageMethod", page_size_bytes=lambda self: 64),
        SpecClassError,
        "page_size_bytes is a method",
    ),
    (
        "merge not a classmethod",
        lambda: variant("PlainMerge", merge=lambda self, specs: specs[0]),
        SpecClassError,
        "merge must be a @classmethod",
    ),
    (
        "max_memory_usage_bytes as a property",
        lambda: variant("MemProp", max_memory_usage_bytes=property(lambda self: 1)),
        SpecClassError,
        "max_memory_usage_bytes must be a method",
    ),
    (
        "max_memory_usage_bytes without limits",
        lambda: variant("MemNoArg", max_memory_usage_bytes=lambda self: 1),
        SpecClassError,
        "must take 1 argument",
    ),
    (
        "kv_cache_traits as an attribute",
        lambda: variant("TraitsAttr", kv_cache_traits=SpecTraits()),
        SpecClassError,
        "kv_cache_traits must be a method",
    ),
    (
        "to_full_attention without a template",
        lambda: variant("ConvNoArg", to_full_attention=lambda self: self),
        SpecClassError,
        "to_full_attention",
    ),
]


@pytest.mark.parametrize(
    ("label", "make", "error", "fragment"), SPEC_CLASS_MISTAKES, ids=[m[0] for m in SPEC_CLASS_MISTAKES]
)
def test_spec_class_mistakes_are_refused_at_registration(
    label: str, make: Callable[[], type], error: type[KVSpecError], fragment: str
) -> None:
    reg = fresh()
    cls = make() if label != "missing block_size" else _no_block_size()
    with pytest.raises(error, match=fragment):
        reg.register(cls, FullAttentionManager)
    assert cls not in reg


def _no_block_size() -> type:
    ns = {
        k: v
        for k, v in vars(GoodSpec).items()
        if not k.startswith("__") and k not in ("block_size", "num_kv_heads")
    }
    ns["page_size_bytes"] = property(lambda self: 64)
    return dataclass(frozen=True)(type("NoBlockSize", (), ns))


def test_mutable_spec_is_refused() -> None:
    @dataclass(kw_only=True)
    class Mutable:
        block_size: int = 16
        page_size_bytes: int = 64
        max_memory_usage_bytes = GoodSpec.max_memory_usage_bytes
        copy_with_new_block_size = GoodSpec.copy_with_new_block_size
        merge = classmethod(lambda cls, specs: specs[0])
        is_uniform_with_collection = GoodSpec.is_uniform_with_collection

    with pytest.raises(SpecClassError, match="not hashable"):
        fresh().register(Mutable, FullAttentionManager)
    Mutable.__hash__ = lambda self: 0  # type: ignore[method-assign]
    with pytest.raises(SpecClassError, match="mutable dataclass"):
        fresh().register(Mutable, FullAttentionManager)


def test_non_dataclass_spec_without_immutability_is_refused() -> None:
    class Plain:
        block_size = 16
        page_size_bytes = 64
        max_memory_usage_bytes = GoodSpec.max_memory_usage_bytes
        copy_with_new_block_size = GoodSpec.copy_with_new_block_size
        merge = classmethod(lambda cls, specs: specs[0])
        is_uniform_with_collection = GoodSpec.is_uniform_with_collection

    with pytest.raises(SpecClassError, match="is mutable"):
        fresh().register(Plain, FullAttentionManager)


def test_instance_instead_of_class() -> None:
    with pytest.raises(KVSpecTypeError, match="spec_cls must be a class, got GoodSpec"):
        fresh().register(GoodSpec(), FullAttentionManager)  # type: ignore[arg-type]
    with pytest.raises(KVSpecTypeError, match="manager_class for GoodSpec must be a class"):
        fresh().register(GoodSpec, FullAttentionManager.__new__(FullAttentionManager))  # type: ignore[arg-type]


def test_no_manager_and_wrong_base_and_conflict() -> None:
    reg = fresh()
    with pytest.raises(MissingManagerError, match="manager_class is required"):
        reg.register(GoodSpec, None)
    with pytest.raises(UniformBaseError, match="must inherit from its declared uniform_type_base_spec"):
        reg.register(GoodSpec, FullAttentionManager, FullAttentionSpec)
    reg.register(GoodSpec, FullAttentionManager)
    with pytest.raises(ConflictingRegistrationError, match="already run by FullAttentionManager"):
        reg.register(GoodSpec, SlidingWindowManager)


# -- manager classes rejected at registration ------------------------------------------------------


class OldStyleHit(SingleTypeKVCacheManager):
    @classmethod
    def find_longest_cache_hit(  # type: ignore[override]
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: Any,
        use_eagle: bool,
        alignment_tokens: int,
    ) -> tuple[list[KVCacheBlock], ...]:
        return ()


class HitNotClassmethod(SingleTypeKVCacheManager):
    def find_longest_cache_hit(self, query: HitQuery) -> HitResult:  # type: ignore[override]
        return HitResult(())


class SwappedParams(FullAttentionManager):
    def allocate_new_blocks(  # type: ignore[override]
        self, request_id: str, num_tokens_main_model: int, num_tokens: int
    ) -> list[KVCacheBlock]:
        return []


class FreeTakesInt(FullAttentionManager):
    def free(self, request_id: int) -> None:  # type: ignore[override]
        pass


class AllocReturnsInt(FullAttentionManager):
    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> int:  # type: ignore[override]
        return 0


class OldConstructor(FullAttentionManager):
    def __init__(self, kv_cache_spec: Any, block_pool: BlockPool, *, enable_caching: bool) -> None:
        pass


class NoDefaultCap(FullAttentionManager):
    def get_num_blocks_to_allocate(  # type: ignore[override]
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool,
    ) -> int:
        return 0


class ExtraRequiredParam(FullAttentionManager):
    def free(self, request_id: str, now: float) -> None:  # type: ignore[override]
        pass


class HalfManager:
    def free(self, request_id: str) -> None:
        pass


MANAGER_MISTAKES: list[tuple[str, type, type[KVSpecError], str]] = [
    (
        "missing members",
        HalfManager,
        ManagerProtocolError,
        "missing allocate_new_blocks, allocate_new_computed_blocks",
    ),
    (
        "9-parameter hit search",
        OldStyleHit,
        ManagerSignatureError,
        r"takes 7 required parameter\(s\); the KVCacheManager protocol passes 1: find_longest_cache_hit\(query\)",
    ),
    (
        "hit search not a classmethod",
        HitNotClassmethod,
        ManagerSignatureError,
        "find_longest_cache_hit must be a @classmethod",
    ),
    (
        "parameters in another order",
        SwappedParams,
        ManagerSignatureError,
        "parameter 2 is 'num_tokens_main_model', the protocol's is 'num_tokens'",
    ),
    (
        "free takes an int",
        FreeTakesInt,
        ManagerSignatureError,
        "takes request_id: int, the protocol's is str",
    ),
    (
        "allocate_new_blocks returns an int",
        AllocReturnsInt,
        ManagerSignatureError,
        "returns int, the protocol's is list",
    ),
    (
        "9-parameter constructor",
        OldConstructor,
        ManagerSignatureError,
        r"takes 2 required parameter\(s\); the KVCacheManager protocol passes 1: __init__\(context\)",
    ),
    ("default dropped", NoDefaultCap, ManagerSignatureError, "'apply_admission_cap' needs the default False"),
    (
        "extra required parameter",
        ExtraRequiredParam,
        ManagerSignatureError,
        r"takes 2 required parameter\(s\); .* free\(request_id\)",
    ),
]


@pytest.mark.parametrize(
    ("label", "manager", "error", "fragment"), MANAGER_MISTAKES, ids=[m[0] for m in MANAGER_MISTAKES]
)
def test_manager_mistakes_are_refused_at_registration(
    label: str, manager: type, error: type[KVSpecError], fragment: str
) -> None:
    reg = fresh()
    with pytest.raises(error, match=fragment):
        reg.register(GoodSpec, manager)
    assert GoodSpec not in reg


# -- values a plugin returns: caught by the kit ----------------------------------------------------

VALUE_MISTAKES: list[tuple[str, dict[str, Any], str]] = [
    (
        "float page size",
        {"page_size_bytes": property(lambda self: 65536 / 3)},
        "page_size_bytes must be an int, got float",
    ),
    ("zero page size", {"page_size_bytes": property(lambda self: 0)}, "page_size_bytes must be >= 1"),
    (
        "negative memory",
        {"max_memory_usage_bytes": lambda self, limits: -1},
        r"max_memory_usage_bytes\(max_model_len=1\) must be >= 0",
    ),
    (
        "float memory",
        {"max_memory_usage_bytes": lambda self, limits: 1.5},
        "max_memory_usage_bytes.* must be an int, got float",
    ),
    (
        "memory shrinking with length",
        {"max_memory_usage_bytes": lambda self, limits: 10**6 // limits.max_model_len},
        "shrinks as max_model_len grows",
    ),
    (
        "copy ignores the block size",
        {"copy_with_new_block_size": lambda self, block_size: self},
        r"copy_with_new_block_size\(32\) returned .* block_size=16",
    ),
    ("merge returns None", {"merge": classmethod(lambda cls, specs: None)}, "merge"),
    (
        "uniformity wrong for a dict",
        {"is_uniform_with_collection": lambda self, specs: all(hasattr(s, "block_size") for s in specs)},
        "answers False for a dict and True for a list",
    ),
    (
        "uniform check raises on a dict",
        {"is_uniform_with_collection": lambda self, specs: all(s.block_size for s in specs)},
        "raised AttributeError for vLLM's layer -> spec dict",
    ),
]


@pytest.mark.parametrize(("label", "members", "fragment"), VALUE_MISTAKES, ids=[m[0] for m in VALUE_MISTAKES])
def test_value_mistakes_are_caught_by_the_kit(label: str, members: dict[str, Any], fragment: str) -> None:
    cls = variant(label.title().replace(" ", ""), **members)
    with pytest.raises(PluginContractError, match=fragment):
        check_plugin(cls(), FullAttentionManager)


def test_traits_that_are_not_traits() -> None:
    cls = variant("DictTraits", kv_cache_traits=lambda self: {"kind": "x"})
    with pytest.raises(TraitsError, match=r"kv_cache_traits\(\) must return a kvspec.SpecTraits, got dict"):
        check_plugin(cls(), FullAttentionManager)
    with pytest.raises(TraitsError, match="admission_extra_blocks must be an int >= 0"):
        SpecTraits(admission_extra_blocks=-1)
    with pytest.raises(TraitsError, match="kind must be a non-empty str"):
        SpecTraits(kind="")


def test_device_view_past_the_page() -> None:
    from kvspec import PageView

    cls = variant(
        "WideView",
        kv_cache_traits=lambda self: SpecTraits(
            device_views=(PageView(name="kv", dtype=torch.float32, shape=(1000,)),)
        ),
    )
    with pytest.raises(
        DeviceError, match="device view 'kv' of 4000 bytes at offset 0, past its page of 128 bytes"
    ):
        page_views_of(cls())


class FloatCountManager(FullAttentionManager):
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        n = super().get_num_blocks_to_allocate(
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            num_tokens_main_model,
            apply_admission_cap,
        )
        return n * 1.0  # type: ignore[return-value]


class LeakyManager(FullAttentionManager):
    """Forgets the request but never gives its blocks back."""

    def free(self, request_id: str) -> None:
        self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)


class WrongHitManager(FullAttentionManager):
    """Returns cached blocks in reverse order: right blocks, wrong positions."""

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        hit = FullAttentionManager.find_longest_cache_hit(query)
        return HitResult(tuple(list(reversed(blocks)) for blocks in hit.blocks))


class ForeignBlockManager(FullAttentionManager):
    """Hands out blocks of its own private pool."""

    def setup(self) -> None:
        self._private = BlockPool(8)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        return self._private.get_new_blocks(1)


MANAGER_BEHAVIOUR_MISTAKES: list[tuple[type, str]] = [
    (FloatCountManager, "get_num_blocks_to_allocate .* must be an int, got float"),
    (LeakyManager, "pool or ref counts inconsistent"),
    (WrongHitManager, "not cached under this request's hash"),
    (ForeignBlockManager, "not a block of this coordinator's pool"),
]


@pytest.mark.parametrize(
    ("manager", "fragment"),
    MANAGER_BEHAVIOUR_MISTAKES,
    ids=[m[0].__name__ for m in MANAGER_BEHAVIOUR_MISTAKES],
)
def test_manager_behaviour_mistakes_are_caught_by_the_kit(manager: type, fragment: str) -> None:
    with pytest.raises(PluginContractError, match=fragment):
        check_plugin(GoodSpec(), manager)


# -- registry calls that used to answer silently ---------------------------------------------------


def test_get_manager_class_with_a_class_is_an_error() -> None:
    with pytest.raises(KVSpecTypeError, match=r"takes a spec instance, got a class; use registry\.lookup"):
        default_registry.get_manager_class(FullAttentionSpec)  # type: ignore[arg-type]
    assert default_registry.get_manager_class(FullAttentionSpec(**ATTN)) is FullAttentionManager


def test_restore_validates_every_entry() -> None:
    reg = fresh()
    snap = reg.snapshot()
    entry = dataclasses.replace(snap.entries[FullAttentionSpec], manager_cls=int)
    bad = dataclasses.replace(snap, entries={**snap.entries, FullAttentionSpec: entry})
    with pytest.raises(RegistrationError):
        reg.restore(bad)
    assert reg.lookup(FullAttentionSpec).manager_cls is FullAttentionManager  # type: ignore[union-attr]


def test_is_uniform_with_collection_accepts_vllms_dict_for_every_builtin() -> None:
    from tests.unit.testing.test_plugin_kit import BUILTIN_PAIRS

    for spec, _ in BUILTIN_PAIRS:
        same = [spec, spec.copy_with_new_block_size(spec.block_size)]
        assert (
            spec.is_uniform_with_collection({"a": same[0], "b": same[1]})
            is spec.is_uniform_with_collection(same)
            is True
        )
        other = FullAttentionSpec(**ATTN) if not isinstance(spec, FullAttentionSpec) else None
        if other is not None:
            assert spec.is_uniform_with_collection(
                {"a": spec, "b": other}
            ) is spec.is_uniform_with_collection([spec, other])


def test_unknown_typecheck_mode_lists_the_valid_ones() -> None:
    from kvspec.contracts.checking import typecheck_mode
    from kvspec.errors import UnsupportedConfigurationError

    assert typecheck_mode(None) == "api" and typecheck_mode(" FULL ") == "full"
    for value in ("0", "false", "none"):
        with pytest.raises(UnsupportedConfigurationError, match="use one of off, api, full"):
            typecheck_mode(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class TypedPluginSpec(FullAttentionSpec):
    extra: int = 0


def test_plugin_constructors_are_type_checked_like_builtins() -> None:
    reg = fresh()
    reg.register(TypedPluginSpec, FullAttentionManager, FullAttentionSpec)
    with pytest.raises(KVSpecTypeError):
        TypedPluginSpec(**ATTN, extra="three")  # type: ignore[arg-type]


def test_requests_are_untouched_by_the_mistake_tests() -> Iterator[None] | None:
    # Building a Request never needs a registry: the mistakes above cannot leak into scheduling state.
    assert Request("x", [1, 2, 3]).num_tokens == 3
    return None


def test_manager_context_is_the_only_constructor_argument() -> None:
    pool = BlockPool(8)
    manager = FullAttentionManager(ManagerContext.for_spec(FullAttentionSpec(**ATTN), pool))
    assert manager.block_size == 16 and manager.tracks_new_block_ids
    with pytest.raises(TypeError):
        FullAttentionManager(FullAttentionSpec(**ATTN), pool, enable_caching=True)  # type: ignore[call-arg,arg-type]


class RequiredKeyword(FullAttentionManager):
    def free(self, request_id: str, *, now: float) -> None:  # type: ignore[override]
        pass


def test_required_keyword_only_parameter_is_refused() -> None:
    with pytest.raises(ManagerSignatureError, match="extra parameter 'now' has no default"):
        fresh().register(GoodSpec, RequiredKeyword)


def test_planning_refuses_a_float_page_size_naming_the_layer() -> None:
    from kvspec import SpecValidationError
    from kvspec.planning import get_kv_cache_config

    reg = fresh()
    cls = variant("FloatPage", page_size_bytes=property(lambda self: 65536 / 3))
    reg.register(cls, FullAttentionManager)
    with pytest.raises(
        SpecValidationError, match=r"Layer l0: FloatPage\.page_size_bytes is 21845\.33.* \(float\)"
    ):
        get_kv_cache_config({"l0": cls()}, 1 << 20, SchedulerLimits(max_model_len=64), registry=reg)


def test_a_plugin_with_type_checking_only_annotations_still_constructs() -> None:
    """A constructor whose annotations name TYPE_CHECKING-only imports is left unchecked instead of
    failing every construction with beartype's unresolvable-forward-reference error."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        from __future__ import annotations
        from dataclasses import dataclass
        from typing import TYPE_CHECKING
        import torch
        from kvspec import FullAttentionManager, FullAttentionSpec, default_registry
        if TYPE_CHECKING:
            from decimal import Decimal

        @dataclass(frozen=True, kw_only=True, slots=True)
        class FwdSpec(FullAttentionSpec):
            extra: Decimal | None = None

        default_registry.register(FwdSpec, FullAttentionManager, FullAttentionSpec)
        from decimal import Decimal as D
        print(FwdSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16, extra=D(1)).extra)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1"


# -- the checker audit's mistakes (tests/typing/reject/reject_plugin_audit.py), at run time -------------


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditSpec(FullAttentionSpec):
    pass


class AuditManager(FullAttentionManager):
    pass


def _ported_manager() -> type:
    """A manager ported from vLLM 0.23 as it was: its hit search takes vLLM's seven arguments."""

    def find_longest_cache_hit(
        cls: type,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: Any,
        use_eagle: bool,
        alignment_tokens: int,
    ) -> tuple[list[KVCacheBlock], ...]:
        return ()

    return type(
        "PortedManager",
        (FullAttentionManager,),
        {"find_longest_cache_hit": classmethod(find_longest_cache_hit)},
    )


def _float_memory() -> type:
    def max_memory_usage_bytes(self: Any, limits: SchedulerLimits) -> float:
        return 1.5

    return dataclass(frozen=True, kw_only=True)(
        type("FloatMemory", (FullAttentionSpec,), {"max_memory_usage_bytes": max_memory_usage_bytes})
    )


def _str_page() -> type:
    def page_size_bytes(self: Any) -> str:
        return "64KiB"

    return dataclass(frozen=True, kw_only=True)(
        type("StrPage", (FullAttentionSpec,), {"page_size_bytes": property(page_size_bytes)})
    )


def _str_block_size() -> type:
    ns: dict[str, Any] = {
        k: v
        for k, v in vars(GoodSpec).items()
        if not k.startswith("__") and k not in ("block_size", "num_kv_heads")
    }
    ns["__annotations__"] = {"block_size": str}
    ns["block_size"] = "16"
    return dataclass(frozen=True, kw_only=True)(type("StrBlockSize", (), ns))


AUDIT_MISTAKES: list[tuple[str, Callable[[Registry[Any, Any]], object], type[KVSpecError], str]] = [
    (
        "1a an old-signature manager, decorator form",
        lambda reg: register_kv_cache_spec(_ported_manager(), registry=reg)(AuditSpec),
        ManagerSignatureError,
        "find_longest_cache_hit",
    ),
    (
        "1b the spec passed as the manager",
        lambda reg: register_kv_cache_spec(cast(Any, FullAttentionSpec), registry=reg)(AuditSpec),
        ManagerProtocolError,
        "FullAttentionSpec .*is not a KVCacheManager",
    ),
    (
        "1c a typed registry given another family's manager",
        lambda reg: Registry[AuditSpec, AuditManager](name="audit").register(
            AuditSpec, cast(Any, SlidingWindowManager), FullAttentionSpec
        ),
        RegistryBoundError,
        "SlidingWindowManager .*is not a subclass of AuditManager",
    ),
    (
        "2a no page_size_bytes, decorator form",
        lambda reg: register_kv_cache_spec(FullAttentionManager, registry=reg)(
            variant("NoPageDecorated", page_size_bytes=None)
        ),
        SpecProtocolError,
        "missing page_size_bytes",
    ),
    (
        "2b no page_size_bytes, call form",
        lambda reg: reg.register(variant("NoPageCalled", page_size_bytes=None), FullAttentionManager),
        SpecProtocolError,
        "missing page_size_bytes",
    ),
    (
        "3 max_memory_usage_bytes returns float",
        lambda reg: reg.register(_float_memory(), FullAttentionManager),
        SpecClassError,
        "max_memory_usage_bytes returns float, the protocol's is int",
    ),
    (
        "3 page_size_bytes returns str",
        lambda reg: reg.register(_str_page(), FullAttentionManager),
        SpecClassError,
        "page_size_bytes: the property returns str, the KVCacheSpec protocol's is int",
    ),
    (
        "3 block_size declared str",
        lambda reg: reg.register(_str_block_size(), FullAttentionManager),
        SpecClassError,
        "block_size: the field is declared str",
    ),
]


@pytest.mark.parametrize(
    ("label", "mistake", "error", "fragment"), AUDIT_MISTAKES, ids=[m[0] for m in AUDIT_MISTAKES]
)
def test_the_checker_audits_mistakes_are_refused_at_run_time(
    label: str, mistake: Callable[[Registry[Any, Any]], object], error: type[KVSpecError], fragment: str
) -> None:
    reg = fresh()
    before = reg.snapshot()
    with pytest.raises(error, match=fragment):
        mistake(reg)
    assert reg.snapshot() == before


def test_a_spec_that_is_not_a_subclass_of_its_uniform_base_is_caught_at_run_time_only() -> None:
    """No checker can express it (a type variable's bound cannot depend on another argument): the run-time
    check is the one that catches it (docs/PLUGINS.md, the checker table)."""

    @dataclass(frozen=True, kw_only=True, slots=True)
    class WindowedSpec(FullAttentionSpec):
        pass

    with pytest.raises(UniformBaseError, match="must inherit from its declared uniform_type_base_spec"):
        fresh().register(WindowedSpec, FullAttentionManager, SlidingWindowSpec)
