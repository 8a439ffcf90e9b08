"""The registry: built-ins, custom specs, error paths, atomicity, strict mode, snapshots, plugins."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from typing_extensions import Self

from kvspec import (
    Capabilities,
    ChunkedLocalAttentionManager,
    ChunkedLocalAttentionSpec,
    CrossAttentionManager,
    CrossAttentionSpec,
    FullAttentionManager,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    KVCacheSpec,
    MambaManager,
    MambaSpec,
    MLAAttentionSpec,
    PluginError,
    Registry,
    SchedulerLimits,
    SinkFullAttentionManager,
    SinkFullAttentionSpec,
    SlidingWindowManager,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    SpecCollection,
    TQFullAttentionSpec,
    apply_platform_hook,
    default_registry,
    load_plugins,
    register_kv_cache_spec,
)
from kvspec.errors import (
    CapabilityError,
    ConflictingRegistrationError,
    KVSpecTypeError,
    ManagerProtocolError,
    MissingManagerError,
    SpecProtocolError,
    UniformBaseError,
    UnregisteredSpecError,
)
from kvspec.registry.builtins import register_builtins
from tests.helpers import ForeignSpec

BF16 = torch.bfloat16
ATTN: dict[str, Any] = dict(block_size=64, num_kv_heads=8, head_size=128, dtype=BF16)

BUILTINS: list[tuple[KVCacheSpec, type, type]] = [
    (FullAttentionSpec(**ATTN), FullAttentionManager, FullAttentionSpec),
    (TQFullAttentionSpec(**ATTN, tq_slot_size=64), FullAttentionManager, FullAttentionSpec),
    (
        MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=BF16),
        FullAttentionManager,
        FullAttentionSpec,
    ),
    (
        HiddenStateCacheSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=BF16),
        FullAttentionManager,
        FullAttentionSpec,
    ),
    (SinkFullAttentionSpec(**ATTN, sink_len=64), SinkFullAttentionManager, FullAttentionSpec),
    (SlidingWindowSpec(**ATTN, sliding_window=128), SlidingWindowManager, SlidingWindowSpec),
    (
        SlidingWindowMLASpec(block_size=64, num_kv_heads=1, head_size=576, dtype=BF16, sliding_window=128),
        SlidingWindowManager,
        SlidingWindowMLASpec,
    ),
    (
        ChunkedLocalAttentionSpec(**ATTN, attention_chunk_size=256),
        ChunkedLocalAttentionManager,
        ChunkedLocalAttentionSpec,
    ),
    (MambaSpec(block_size=64, shapes=((4, 8),), dtypes=(BF16,)), MambaManager, MambaSpec),
    (CrossAttentionSpec(**ATTN), CrossAttentionManager, CrossAttentionSpec),
]


@pytest.mark.parametrize(("spec", "manager", "base"), BUILTINS, ids=lambda x: type(x).__name__)
def test_builtin_specs_registered(spec: KVCacheSpec, manager: type, base: type) -> None:
    assert default_registry.get_manager_class(spec) is manager
    assert default_registry.get_uniform_type_base_spec(spec) is base


def test_builtins_registered_eagerly_in_a_fresh_registry_too() -> None:
    reg: Registry[KVCacheSpec, Any] = Registry()
    assert len(reg) == 0
    register_builtins(reg)
    assert len(reg) == 12
    register_builtins(reg)  # idempotent
    assert len(reg) == 12


@pytest.mark.parametrize(("spec", "manager", "base"), BUILTINS, ids=lambda x: type(x).__name__)
def test_custom_spec_register(spec: KVCacheSpec, manager: type, base: type) -> None:
    parent = type(spec)

    @register_kv_cache_spec(manager, uniform_type_base_spec=base)
    @dataclass(frozen=True, kw_only=True, slots=True)
    class Custom(parent):  # type: ignore[valid-type,misc]
        extra_field: int = 7

    fields = dataclasses.fields(spec)  # type: ignore[arg-type]
    custom = Custom(**{f.name: getattr(spec, f.name) for f in fields if f.init})
    assert default_registry.get_manager_class(custom) is manager
    assert default_registry.get_uniform_type_base_spec(custom) is base
    assert default_registry.lookup(Custom) is not None


def test_register_requires_manager() -> None:
    @dataclass(frozen=True, kw_only=True, slots=True)
    class Lonely(FullAttentionSpec):
        pass

    before = default_registry.snapshot()
    with pytest.raises(MissingManagerError, match="manager_class is required"):
        default_registry.register(Lonely, None)
    assert default_registry.snapshot() == before


def test_unregistered_spec_without_registered_parent() -> None:
    orphan = ForeignSpec()
    assert default_registry.get_manager_class(orphan) is None
    assert default_registry.get_uniform_type_base_spec(orphan) is None
    with pytest.raises(
        UnregisteredSpecError, match="Unsupported KV cache spec type for layer layer_0: ForeignSpec"
    ):
        default_registry.check({"layer_0": orphan})
    with pytest.raises(UnregisteredSpecError, match="Unsupported KV cache spec type"):
        default_registry.is_uniform_type([orphan, orphan])


def test_unregistered_subclass_inherits_parent_manager() -> None:
    @dataclass(frozen=True, kw_only=True, slots=True)
    class Child(FullAttentionSpec):
        pass

    child = Child(**ATTN)
    assert default_registry.get_manager_class(child) is FullAttentionManager
    assert default_registry.is_uniform_type([FullAttentionSpec(**ATTN), child])


def test_strict_mode_rejects_unregistered_subclass() -> None:
    @dataclass(frozen=True, kw_only=True, slots=True)
    class NpuFull(FullAttentionSpec):
        pass

    default_registry.set_strict(True)
    with pytest.raises(UnregisteredSpecError, match=r"strict registry 'default'.*FullAttentionManager"):
        default_registry.get_manager_class(NpuFull(**ATTN))
    assert default_registry.get_manager_class(FullAttentionSpec(**ATTN)) is FullAttentionManager
    default_registry.register(NpuFull, FullAttentionManager, FullAttentionSpec)
    assert default_registry.get_manager_class(NpuFull(**ATTN)) is FullAttentionManager


@pytest.mark.parametrize(("spec", "manager", "base"), BUILTINS, ids=lambda x: type(x).__name__)
def test_builtin_specs_are_uniform_with_a_copy(spec: KVCacheSpec, manager: type, base: type) -> None:
    assert default_registry.is_uniform_type([spec, dataclasses.replace(spec)])  # type: ignore[type-var]


def test_full_attention_family_is_uniform() -> None:
    family = [spec for spec, _, base in BUILTINS if base is FullAttentionSpec]
    assert len(family) == 5
    assert default_registry.is_uniform_type(family)


def test_type_specific_uniform_fields() -> None:
    reg = default_registry
    s1, s2 = SlidingWindowSpec(**ATTN, sliding_window=128), SlidingWindowSpec(**ATTN, sliding_window=256)
    assert not reg.is_uniform_type([s1, s2])
    m1 = SlidingWindowMLASpec(block_size=64, num_kv_heads=1, head_size=576, dtype=BF16, sliding_window=128)
    assert not reg.is_uniform_type([m1, dataclasses.replace(m1, sliding_window=64)])
    c1 = ChunkedLocalAttentionSpec(**ATTN, attention_chunk_size=256)
    assert not reg.is_uniform_type([c1, dataclasses.replace(c1, attention_chunk_size=512)])
    mb = MambaSpec(block_size=64, shapes=((4, 8),), dtypes=(BF16,))
    assert not reg.is_uniform_type([mb, dataclasses.replace(mb, num_speculative_blocks=1)])


def _builtin(cls: type) -> KVCacheSpec:
    return next(s for s, _, _ in BUILTINS if type(s) is cls)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (FullAttentionSpec, CrossAttentionSpec),
        (FullAttentionSpec, SlidingWindowSpec),
        (FullAttentionSpec, ChunkedLocalAttentionSpec),
        (FullAttentionSpec, MambaSpec),
        (SlidingWindowMLASpec, SlidingWindowSpec),
        (ChunkedLocalAttentionSpec, SlidingWindowSpec),
        (MambaSpec, CrossAttentionSpec),
    ],
)
def test_different_uniform_groups_are_not_uniform_in_either_order(a: type, b: type) -> None:
    x, y = _builtin(a), _builtin(b)
    assert not default_registry.is_uniform_type([x, y])
    # vLLM 0.23 says (SW, SW_MLA) with one window is uniform and (SW_MLA, SW) is not; kvspec is symmetric.
    assert not default_registry.is_uniform_type([y, x])


def test_sliding_window_and_its_mla_variant_are_symmetric_with_equal_windows() -> None:
    sw_ = SlidingWindowSpec(**ATTN, sliding_window=128)
    swmla = SlidingWindowMLASpec(block_size=64, num_kv_heads=1, head_size=576, dtype=BF16, sliding_window=128)
    assert (
        default_registry.is_uniform_type([sw_, swmla])
        is default_registry.is_uniform_type([swmla, sw_])
        is False
    )


def test_different_block_sizes_are_not_uniform() -> None:
    assert not default_registry.is_uniform_type(
        [FullAttentionSpec(**ATTN), FullAttentionSpec(**{**ATTN, "block_size": 32})]
    )


def test_registered_custom_spec_uses_base_uniform_rule() -> None:
    @register_kv_cache_spec(FullAttentionManager, uniform_type_base_spec=FullAttentionSpec)
    @dataclass(frozen=True, kw_only=True, slots=True)
    class AscendFull(FullAttentionSpec):
        scale_dim: int = 0

    assert default_registry.is_uniform_type([FullAttentionSpec(**ATTN), AscendFull(**ATTN)])


class TestRegistrationErrors:
    def test_uniform_base_must_be_a_parent(self) -> None:
        @dataclass(frozen=True, kw_only=True, slots=True)
        class Odd(FullAttentionSpec):
            pass

        before = default_registry.snapshot()
        with pytest.raises(UniformBaseError, match="must inherit from its declared uniform_type_base_spec"):
            default_registry.register(Odd, FullAttentionManager, SlidingWindowSpec)
        assert default_registry.snapshot() == before

    def test_conflicting_registration_is_rejected(self) -> None:
        with pytest.raises(
            ConflictingRegistrationError, match="Conflicting registration for KVCacheSpec FullAttentionSpec"
        ):
            default_registry.register(FullAttentionSpec, SlidingWindowManager)
        assert default_registry.get_manager_class(FullAttentionSpec(**ATTN)) is FullAttentionManager

    def test_identical_re_registration_is_idempotent(self) -> None:
        @dataclass(frozen=True, kw_only=True, slots=True)
        class Twice(FullAttentionSpec):
            pass

        default_registry.register(Twice, FullAttentionManager, FullAttentionSpec)
        default_registry.register(Twice, FullAttentionManager, FullAttentionSpec)
        assert sum(r.spec_cls is Twice for r in default_registry.registrations()) == 1

    def test_not_a_spec_class(self) -> None:
        class NotASpec:
            def max_memory_usage_bytes(self, limits: SchedulerLimits) -> int:
                return 0

            def copy_with_new_block_size(self, block_size: int) -> Self:
                return self

            @classmethod
            def merge(cls, specs: Sequence[Self]) -> Self:
                return specs[0]

            def is_uniform_with_collection(self, specs: SpecCollection) -> bool:
                return True

        with pytest.raises(SpecProtocolError, match="missing block_size, page_size_bytes"):
            default_registry.register(NotASpec, FullAttentionManager)  # type: ignore[arg-type]

    def test_non_class_spec_is_a_type_error(self) -> None:
        with pytest.raises(KVSpecTypeError, match="spec_cls must be a class, got FullAttentionSpec"):
            default_registry.register(FullAttentionSpec(**ATTN), FullAttentionManager)  # type: ignore[arg-type]
        with pytest.raises(
            SpecProtocolError, match=r"builtins\.int is not a KVCacheSpec: missing block_size"
        ):
            default_registry.register(int, FullAttentionManager)  # type: ignore[arg-type]

    def test_manager_missing_protocol_members(self) -> None:
        class HalfManager:
            def free(self, request_id: str) -> None:
                pass

        @dataclass(frozen=True, kw_only=True, slots=True)
        class Spec2(FullAttentionSpec):
            pass

        # kvspec's own check runs first (no beartype message) and names every missing member.
        with pytest.raises(
            ManagerProtocolError, match="missing allocate_new_blocks, allocate_new_computed_blocks"
        ):
            default_registry.register(Spec2, HalfManager)  # type: ignore[arg-type]

    def test_capabilities_validated(self) -> None:
        with pytest.raises(CapabilityError, match="dotted lower-case"):
            Capabilities(identifier="Bad Name")
        with pytest.raises(CapabilityError, match="storage_layout"):
            Capabilities(identifier="acme.x", storage_layout="weird")
        with pytest.raises(CapabilityError, match="unknown: \\['gpu9'\\]"):
            Capabilities(identifier="acme.x", devices=frozenset({"gpu9"}))
        caps = Capabilities(
            identifier="acme.paged_mla", storage_layout="paged_latent", devices=frozenset({"npu"})
        )

        @register_kv_cache_spec(
            FullAttentionManager, uniform_type_base_spec=FullAttentionSpec, capabilities=caps
        )
        @dataclass(frozen=True, kw_only=True, slots=True)
        class AcmeMLA(MLAAttentionSpec):
            pass

        entry = default_registry.lookup(AcmeMLA)
        assert entry is not None and entry.capabilities == caps
        with pytest.raises(ConflictingRegistrationError):
            default_registry.register(AcmeMLA, FullAttentionManager, FullAttentionSpec)


class TestSnapshotsAndAtomicity:
    def test_isolated_undoes_registrations(self) -> None:
        @dataclass(frozen=True, kw_only=True, slots=True)
        class Temp(FullAttentionSpec):
            pass

        with default_registry.isolated():
            default_registry.register(Temp, FullAttentionManager, FullAttentionSpec)
            assert Temp in default_registry
        assert Temp not in default_registry

    def test_register_many_is_all_or_nothing(self) -> None:
        @dataclass(frozen=True, kw_only=True, slots=True)
        class Good(FullAttentionSpec):
            pass

        before = len(default_registry)
        with pytest.raises(ConflictingRegistrationError):
            default_registry.register_many(
                [(Good, FullAttentionManager, None), (FullAttentionSpec, SlidingWindowManager, None)]
            )
        assert len(default_registry) == before and Good not in default_registry

    def test_lookup_cache_is_invalidated_on_registration(self) -> None:
        @dataclass(frozen=True, kw_only=True, slots=True)
        class Sub(SlidingWindowSpec):
            pass

        spec = Sub(**ATTN, sliding_window=64)
        assert default_registry.get_manager_class(spec) is SlidingWindowManager
        default_registry.register(Sub, FullAttentionManager, SlidingWindowSpec)
        assert default_registry.get_manager_class(spec) is FullAttentionManager

    def test_isolated_in_one_thread_keeps_what_another_thread_registers(self) -> None:
        mine: type = dataclass(frozen=True, kw_only=True, slots=True)(type("Mine", (FullAttentionSpec,), {}))
        theirs: type = dataclass(frozen=True, kw_only=True, slots=True)(
            type("Theirs", (FullAttentionSpec,), {})
        )
        inner: type = dataclass(frozen=True, kw_only=True, slots=True)(
            type("Inner", (FullAttentionSpec,), {})
        )
        with default_registry.isolated():
            default_registry.register(mine, FullAttentionManager, FullAttentionSpec)
            worker = threading.Thread(
                target=lambda: default_registry.register(theirs, FullAttentionManager, FullAttentionSpec)
            )
            worker.start()
            worker.join()
            with default_registry.isolated():  # nested blocks of one thread undo in order
                default_registry.register(inner, FullAttentionManager, FullAttentionSpec)
            assert inner not in default_registry and mine in default_registry
        assert mine not in default_registry  # this thread's registration is undone
        assert theirs in default_registry  # the other thread's stays
        assert default_registry.get_manager_class(FullAttentionSpec(**ATTN)) is FullAttentionManager

    def test_concurrent_registration_is_consistent(self) -> None:
        classes: list[type] = [
            dataclass(frozen=True, kw_only=True, slots=True)(type(f"T{i}", (FullAttentionSpec,), {}))
            for i in range(64)
        ]
        errors: list[BaseException] = []

        def work(chunk: list[type]) -> None:
            try:
                for cls in chunk:
                    default_registry.register(cls, FullAttentionManager, FullAttentionSpec)
                    assert default_registry.lookup(cls) is not None
            except BaseException as exc:  # pragma: no cover - only on failure
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(classes[i::4],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert all(cls in default_registry for cls in classes)

    def test_listing(self) -> None:
        classes = [r.spec_cls for r in default_registry.registrations()]
        assert len(classes) == 12
        assert classes == sorted(classes, key=lambda c: f"{c.__module__}.{c.__qualname__}")
        assert all(r.source == "builtin" for r in default_registry.registrations())
        assert all(r.capabilities is not None for r in default_registry.registrations())


class _FakeDist:
    def __init__(self, name: str) -> None:
        self.name = name


class _FakeEntryPoint:
    def __init__(self, name: str, hook: object, dist: str = "acme-kv") -> None:
        self.name, self.value, self._hook = name, f"fake:{name}", hook
        self.dist = _FakeDist(dist)

    def load(self) -> object:
        if isinstance(self._hook, BaseException):
            raise self._hook
        return self._hook


class TestPlugins:
    @pytest.fixture
    def plugins(self, monkeypatch: pytest.MonkeyPatch) -> list[_FakeEntryPoint]:
        eps: list[_FakeEntryPoint] = []
        monkeypatch.setattr(
            importlib.metadata, "entry_points", lambda group: eps if group == "kvspec.plugins" else []
        )
        monkeypatch.delenv("KVSPEC_PLUGINS", raising=False)
        return eps

    @staticmethod
    def _spec_class(name: str) -> type:
        return dataclass(frozen=True, kw_only=True, slots=True)(type(name, (FullAttentionSpec,), {}))

    def test_all_plugins_load_by_default(self, plugins: list[_FakeEntryPoint]) -> None:
        a, b = self._spec_class("PluginA"), self._spec_class("PluginB")
        plugins.append(_FakeEntryPoint("a", lambda reg: reg.register(a, FullAttentionManager)))
        plugins.append(_FakeEntryPoint("b", lambda reg: reg.register(b, FullAttentionManager)))
        assert load_plugins() == ["a", "b"]
        assert a in default_registry and b in default_registry

    def test_allow_list_from_environment(
        self, plugins: list[_FakeEntryPoint], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        a, b = self._spec_class("PluginA"), self._spec_class("PluginB")
        plugins.append(_FakeEntryPoint("a", lambda reg: reg.register(a, FullAttentionManager)))
        plugins.append(_FakeEntryPoint("b", lambda reg: reg.register(b, FullAttentionManager)))
        monkeypatch.setenv("KVSPEC_PLUGINS", "b")
        assert load_plugins() == ["b"]
        assert a not in default_registry and b in default_registry
        monkeypatch.setenv("KVSPEC_PLUGINS", "")
        assert load_plugins() == []

    def test_failing_plugin_leaves_nothing(self, plugins: list[_FakeEntryPoint]) -> None:
        a = self._spec_class("PluginA")

        def bad(reg: Registry[Any, Any]) -> None:
            reg.register(a, FullAttentionManager)
            reg.register(FullAttentionSpec, SlidingWindowManager)  # conflicts

        good = self._spec_class("PluginGood")
        plugins.append(_FakeEntryPoint("a_good", lambda reg: reg.register(good, FullAttentionManager)))
        plugins.append(_FakeEntryPoint("bad", bad))
        with pytest.raises(
            PluginError,
            match=r"'bad' failed to register \(ConflictingRegistrationError: Conflicting registration.*"
            r"Plugins registered before it: a_good\.",
        ):
            load_plugins()
        assert a not in default_registry
        assert good in default_registry  # an earlier plugin's registrations stay, and the message says so

    def test_an_allowed_name_two_distributions_declare_is_refused(
        self, plugins: list[_FakeEntryPoint], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        good, evil = self._spec_class("Good"), self._spec_class("Evil")
        plugins.append(
            _FakeEntryPoint("npu", lambda reg: reg.register(good, FullAttentionManager), "vendor-npu")
        )
        plugins.append(
            _FakeEntryPoint("npu", lambda reg: reg.register(evil, FullAttentionManager), "typosquat")
        )
        monkeypatch.setenv("KVSPEC_PLUGINS", "npu")
        with pytest.raises(
            PluginError, match=r"declared by several distributions \(typosquat:npu, vendor-npu:npu\)"
        ):
            load_plugins()
        assert good not in default_registry and evil not in default_registry
        monkeypatch.setenv("KVSPEC_PLUGINS", "vendor-npu:npu")
        assert load_plugins() == ["npu"]
        assert good in default_registry and evil not in default_registry

    def test_allow_list_names_must_match_an_entry_point(
        self, plugins: list[_FakeEntryPoint], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        a = self._spec_class("PluginA")
        plugins.append(_FakeEntryPoint("acme", lambda reg: reg.register(a, FullAttentionManager)))
        monkeypatch.setenv("KVSPEC_PLUGINS", "acme,acne")
        with pytest.raises(
            PluginError, match=r"'acne' named in the allow-list matches no installed .*acme-kv:acme"
        ):
            load_plugins()
        assert a not in default_registry  # nothing loaded: the list is checked before any plugin runs
        with pytest.raises(KVSpecTypeError, match="letter by letter"):
            load_plugins(allow="acme")

    def test_import_failure_and_non_callable(self, plugins: list[_FakeEntryPoint]) -> None:
        plugins.append(_FakeEntryPoint("broken", ImportError("no module named acme")))
        with pytest.raises(PluginError, match="failed to import \\(ImportError: no module named acme\\)"):
            load_plugins()
        plugins[:] = [_FakeEntryPoint("value", 42)]
        with pytest.raises(PluginError, match="not callable"):
            load_plugins()

    def test_platform_hook_is_atomic(self) -> None:
        a = self._spec_class("NpuSpec")

        class GoodPlatform:
            def register_custom_kv_cache_specs(self, registry: Registry[Any, Any]) -> None:
                registry.register(a, FullAttentionManager, FullAttentionSpec)

        class BadPlatform:
            def register_custom_kv_cache_specs(self, registry: Registry[Any, Any]) -> None:
                registry.register(a, FullAttentionManager, FullAttentionSpec)
                raise RuntimeError("driver missing")

        with default_registry.isolated():
            with pytest.raises(PluginError, match="driver missing"):
                apply_platform_hook(BadPlatform())
            assert a not in default_registry
            apply_platform_hook(GoodPlatform())
            apply_platform_hook(GoodPlatform())  # idempotent
            assert a in default_registry
