"""A typed registry enforces its type arguments when the code runs, as every checker does statically: a spec
class outside ``S`` or a manager class outside ``M`` is a ``RegistryBoundError`` naming both classes, at
registration and at lookup, and a refused registration changes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, cast

import pytest
import torch

from kvspec import (
    FullAttentionManager,
    FullAttentionSpec,
    KVCacheManager,
    KVCacheSpec,
    MambaManager,
    MambaSpec,
    Registry,
    SlidingWindowManager,
    SlidingWindowSpec,
    default_registry,
    register_kv_cache_spec,
)
from kvspec.errors import ManagerProtocolError, RegistrationError, RegistryBoundError, UniformBaseError
from kvspec.registry.core import RegistryBounds


@dataclass(frozen=True, kw_only=True, slots=True)
class AcmeSpec(FullAttentionSpec):
    pass


@dataclass(frozen=True, kw_only=True, slots=True)
class AcmeWideSpec(AcmeSpec):
    pass


class AcmeManager(FullAttentionManager):
    pass


class AcmeFastManager(AcmeManager):
    pass


def acme(**kw: Any) -> AcmeSpec:
    return AcmeSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16, **kw)


def window() -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16, sliding_window=32
    )


def generic() -> Registry[AcmeSpec, AcmeManager]:
    return Registry[AcmeSpec, AcmeManager](name="acme")


def explicit() -> Registry[AcmeSpec, AcmeManager]:
    return Registry(name="acme", spec_bound=AcmeSpec, manager_bound=AcmeManager)


class AcmeRegistry(Registry[AcmeSpec, AcmeManager]):
    pass


def subclassed() -> Registry[AcmeSpec, AcmeManager]:
    return AcmeRegistry(name="acme")


FORMS = pytest.mark.parametrize(
    "make", [generic, explicit, subclassed], ids=["Registry[S, M]()", "bounds", "subclass"]
)


@FORMS
def test_subclasses_of_both_bounds_register_and_resolve(make: Any) -> None:
    registry = make()
    registry.register(AcmeSpec, AcmeManager, FullAttentionSpec)
    registry.register(AcmeWideSpec, AcmeFastManager, FullAttentionSpec)
    assert registry.get_manager_class(acme()) is AcmeManager
    assert registry.bounds.spec is AcmeSpec and registry.bounds.manager is AcmeManager


@FORMS
def test_a_manager_of_another_family_is_refused_naming_both_classes(make: Any) -> None:
    registry = make()
    with pytest.raises(RegistryBoundError) as info:
        registry.register(AcmeSpec, SlidingWindowManager, FullAttentionSpec)
    message = str(info.value)
    assert "Registry[AcmeSpec, AcmeManager]" in message
    assert "SlidingWindowManager (for AcmeSpec) is not a subclass of AcmeManager" in message
    assert isinstance(info.value, RegistrationError)
    assert len(registry) == 0


@FORMS
def test_a_spec_of_another_family_is_refused_at_registration_and_at_lookup(make: Any) -> None:
    registry = make()
    registry.register(AcmeSpec, AcmeManager, FullAttentionSpec)
    with pytest.raises(RegistryBoundError, match="SlidingWindowSpec is not a subclass of AcmeSpec"):
        registry.register(SlidingWindowSpec, AcmeManager)
    assert len(registry) == 1
    with pytest.raises(RegistryBoundError, match="SlidingWindowSpec is not a subclass of AcmeSpec"):
        registry.lookup(SlidingWindowSpec)
    with pytest.raises(RegistryBoundError, match="SlidingWindowSpec is not a subclass of AcmeSpec"):
        registry.get_manager_class(window())
    with pytest.raises(RegistryBoundError):
        registry.check({"layers.0": window()})
    # The parent class of the bound is outside it too (a plain FullAttentionSpec is not an AcmeSpec).
    with pytest.raises(RegistryBoundError, match="FullAttentionSpec is not a subclass of AcmeSpec"):
        registry.lookup(FullAttentionSpec)


def test_the_protocol_checks_come_before_the_bounds() -> None:
    """A spec class passed as the manager is named as what it is, not as a manager outside the bound."""
    with pytest.raises(ManagerProtocolError, match="is not a KVCacheManager"):
        generic().register(AcmeSpec, FullAttentionSpec)  # type: ignore[arg-type]
    with pytest.raises(UniformBaseError):
        generic().register(AcmeSpec, AcmeManager, SlidingWindowSpec)


def test_the_decorator_and_register_many_and_restore_keep_the_bounds() -> None:
    registry = generic()
    with pytest.raises(RegistryBoundError):
        register_kv_cache_spec(
            SlidingWindowManager, uniform_type_base_spec=FullAttentionSpec, registry=registry
        )(AcmeWideSpec)
    other_family = cast(Any, FullAttentionManager)  # checkers refuse it here too; this is the run-time side
    with pytest.raises(RegistryBoundError):
        registry.register_many(
            [(AcmeSpec, AcmeManager, FullAttentionSpec), (AcmeWideSpec, other_family, FullAttentionSpec)]
        )
    assert len(registry) == 0  # all or none
    loose: Registry[Any, Any] = Registry(name="loose")
    loose.register(SlidingWindowSpec, SlidingWindowManager)
    with pytest.raises(RegistryBoundError):
        registry.restore(loose.snapshot())
    assert len(registry) == 0


def test_a_manager_chosen_per_instance_and_a_role_manager_keep_the_bounds() -> None:
    registry = generic()
    window_manager: Any = SlidingWindowManager  # checkers refuse both below; this is the run-time side
    state_manager: Any = MambaManager
    registry.register(AcmeSpec, AcmeManager, FullAttentionSpec, manager_for=lambda s: window_manager)
    with pytest.raises(RegistryBoundError, match="SlidingWindowManager"):
        registry.get_manager_class(acme())
    with pytest.raises(RegistryBoundError, match="MambaManager"):
        registry.register_role_manager("state", state_manager)
    registry.register_role_manager("fast", AcmeFastManager)
    assert registry.manager_for_group(acme(), "fast") is AcmeFastManager


def test_union_and_protocol_bounds() -> None:
    union: Any = AcmeSpec | MambaSpec
    both: Registry[Any, Any] = Registry(name="two", spec_bound=union)
    both.register(AcmeSpec, FullAttentionManager, FullAttentionSpec)
    both.register(MambaSpec, MambaManager)
    with pytest.raises(RegistryBoundError, match=r"is not a subclass of .*AcmeSpec \| .*MambaSpec"):
        both.register(SlidingWindowSpec, SlidingWindowManager)

    class Windowed(Protocol):
        @property
        def sliding_window(self) -> int | None: ...

    windowed: Registry[Any, Any] = Registry(name="windowed", spec_bound=Windowed)
    windowed.register(SlidingWindowSpec, SlidingWindowManager)
    with pytest.raises(RegistryBoundError, match="MambaSpec is not a subclass of"):
        windowed.register(MambaSpec, MambaManager)


def test_protocol_bounds_and_bare_annotations_add_nothing_at_run_time() -> None:
    """The default registry's bounds are the protocols (checked member by member anyway); a registry only
    annotated as typed is erased when the code runs, so there only the checkers see the bounds."""
    assert (default_registry.bounds.spec, default_registry.bounds.manager) == (None, None)
    protocols = Registry[KVCacheSpec, KVCacheManager](name="protocols")
    assert (protocols.bounds.spec, protocols.bounds.manager) == (None, None)
    annotated: Registry[AcmeSpec, AcmeManager] = Registry(name="annotated")
    annotated.register(AcmeSpec, SlidingWindowManager, FullAttentionSpec)  # type: ignore[arg-type]
    assert annotated.lookup(AcmeSpec) is not None


def test_bound_checks_run_once_per_class_not_per_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is checked when a class is first resolved, then the lookup cache answers: no per-step cost."""
    registry = generic()
    registry.register(AcmeSpec, AcmeManager, FullAttentionSpec)
    checked: list[type] = []
    real = RegistryBounds.check_spec

    def spy(self: RegistryBounds, spec_cls: type) -> None:
        checked.append(spec_cls)
        real(self, spec_cls)

    monkeypatch.setattr(RegistryBounds, "check_spec", spy)
    registry.set_strict(False)  # a new lookup cache
    for _ in range(100):
        assert registry.get_manager_class(acme()) is AcmeManager
    assert checked == [AcmeSpec]
