"""Group roles (vLLM 0.34's ``register_role_manager`` / ``get_manager_class(spec, role)``): a group whose
role has a registered manager runs it, whatever its spec; registrations are checked, conflict, and are
undone by ``isolated()``, ``restore()`` and a failed ``transaction()`` like spec registrations."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from kvspec import (
    FullAttentionManager,
    FullAttentionSpec,
    KVCacheCoordinator,
    Registry,
    SchedulerLimits,
    SlidingWindowManager,
    default_registry,
)
from kvspec.errors import ConflictingRegistrationError, KVSpecTypeError, ManagerProtocolError
from kvspec.integrations.vllm import KVCacheSpecRegistry
from kvspec.planning.config import KVCacheConfig, KVCacheGroupSpec
from kvspec.registry.builtins import register_builtins

FULL = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16)


class SourceManager(FullAttentionManager):
    """Stands in for vLLM 0.34's HiSparseSourceManager."""


def _registry() -> Registry[Any, Any]:
    registry: Registry[Any, Any] = Registry(name="roles")
    register_builtins(registry)
    return registry


def test_a_roles_manager_wins_over_the_specs() -> None:
    registry = _registry()
    registry.register_role_manager("hisparse_source", SourceManager)
    assert registry.get_manager_class(FULL, "hisparse_source") is SourceManager
    assert registry.get_manager_class(FULL, "default") is FullAttentionManager  # no manager for that role
    assert registry.get_manager_class(FULL) is FullAttentionManager
    registry.register_role_manager("hisparse_source", SourceManager)  # the same again: a no-op
    with pytest.raises(ConflictingRegistrationError, match="group role 'hisparse_source'"):
        registry.register_role_manager("hisparse_source", SlidingWindowManager)
    with pytest.raises(ManagerProtocolError):
        registry.register_role_manager("other", dict)
    with pytest.raises(KVSpecTypeError, match="non-empty str"):
        registry.register_role_manager("", SourceManager)


def test_the_coordinator_builds_a_groups_role_manager() -> None:
    registry = _registry()
    registry.register_role_manager("hisparse_source", SourceManager)
    other = dataclasses.replace(FULL, head_size=128)
    config = KVCacheConfig(
        num_blocks=32,
        kv_cache_tensors=(),
        kv_cache_groups=(
            KVCacheGroupSpec(layer_names=("a",), kv_cache_spec=FULL, role="hisparse_source"),
            KVCacheGroupSpec(layer_names=("b",), kv_cache_spec=other),
        ),
    )
    coord = KVCacheCoordinator(config, SchedulerLimits(max_model_len=256), registry=registry)
    assert [type(m) for m in coord.managers] == [SourceManager, FullAttentionManager]


def test_isolated_restore_and_transaction_undo_role_registrations() -> None:
    registry = _registry()
    with registry.isolated():
        registry.register_role_manager("r", SourceManager)
        assert registry.role_manager("r") is SourceManager
    assert registry.role_manager("r") is None
    saved = registry.snapshot()
    registry.register_role_manager("r", SourceManager)
    registry.restore(saved)
    assert registry.role_manager("r") is None
    with pytest.raises(RuntimeError), registry.transaction():
        registry.register_role_manager("r", SourceManager)
        raise RuntimeError("a plugin failed half-way")
    assert registry.role_manager("r") is None


def test_vllms_names_for_roles() -> None:
    KVCacheSpecRegistry.use(_registry())
    try:
        KVCacheSpecRegistry.register_role_manager("hisparse_source", SourceManager)
        assert KVCacheSpecRegistry.get_manager_class(FULL, role="hisparse_source") is SourceManager
        with pytest.raises(AssertionError, match="Conflicting manager registration"):
            KVCacheSpecRegistry.register_role_manager("hisparse_source", SlidingWindowManager)
    finally:
        KVCacheSpecRegistry.use(default_registry)
