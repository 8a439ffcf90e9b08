"""conftest for the kvspec run of vLLM's tests (copied next to them by run_suite.py).

It routes vLLM's KV-cache manager to kvspec's adapter (``kvspec.integrations.vllm_kv_cache_manager``)
before the test modules import it, so every decision the tests check comes from kvspec. Tests listed in
``expected_differences.py`` are skipped (expected differences, out of scope) or marked as strict xfails
(known gaps), each with its reason.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.environ["KVSPEC_SUITE_ROOT"], "tests", "vllm_suite"))

from importlib.metadata import version as _version

from expected_differences import lists_for  # type: ignore[import-not-found]

# The stock run's marker and CPU platform, shared (importing it sets the platform).
from stock_conftest import caplog_vllm, pytest_configure  # type: ignore[import-not-found]  # noqa: F401

from kvspec.integrations import vllm_kv_cache_manager


def _kvspec_managers_count_as_vllms() -> None:
    """A test that looks for vLLM's manager class by isinstance (``CrossAttentionManager``) finds kvspec's
    manager of the same name: each kvspec manager is registered as a virtual subclass (vLLM's managers are
    ABCs). A name translation only: the object the test inspects is kvspec's."""
    import vllm.v1.core.single_type_kv_cache_manager as vllm_managers

    import kvspec.managers as kvspec_managers

    for name in dir(kvspec_managers):
        ours, theirs = getattr(kvspec_managers, name), getattr(vllm_managers, name, None)
        if isinstance(ours, type) and isinstance(theirs, type) and hasattr(theirs, "register"):
            theirs.register(ours)


def _vllm_names_on_kvspec_blocks() -> None:
    """vLLM's names for the same things on kvspec's block and free queue (the queue is the same sentinel-
    bounded linked list; vLLM calls its sentinels fake_free_list_head/tail, a block's hash reset
    reset_hash()). Names only: the objects are kvspec's."""
    from kvspec.blocks import pool

    pool.FreeKVCacheBlockQueue.fake_free_list_head = property(lambda q: q._head)  # type: ignore[attr-defined]
    pool.FreeKVCacheBlockQueue.fake_free_list_tail = property(lambda q: q._tail)  # type: ignore[attr-defined]

    def reset_hash(block: pool.KVCacheBlock) -> None:
        block.block_hash = None

    pool.KVCacheBlock.reset_hash = reset_hash  # type: ignore[attr-defined]


# The installed release: 0.23.0's files get every route below; 0.34.0's get the Scheduler's and the
# directly built KVCacheManager (install()), the other names staying vLLM's (run_suite.py lists which).
RELEASE = _version("vllm")
# 0.34.0's files whose vLLM names the routes below bind to kvspec's (the interface they call kept its 0.23
# shape, or kvspec's facade has 0.34's: the registry's role managers); the others keep vLLM's names.
ROUTED_034 = frozenset(
    {
        "tests/v1/core/test_kv_cache_metrics.py",
        "tests/v1/core/test_kv_sharing.py",
        "tests/v1/test_kv_cache_spec_registry.py",
        "tests/v1/core/test_single_type_kv_cache_manager.py",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py",
        "tests/v1/core/test_kv_cache_planning.py",
    }
)


def routes_names(test_file: str) -> bool:
    """Whether ``test_file``'s vLLM names are bound to kvspec's objects in this release."""
    return RELEASE == "0.23.0" or test_file in ROUTED_034


EXPECTED_DIFFERENCES, OUT_OF_SCOPE, KNOWN_GAPS = lists_for(RELEASE)

_vllm_names_on_kvspec_blocks()
_kvspec_managers_count_as_vllms()
vllm_kv_cache_manager.install()


# Functions a test file reaches through vLLM's module object (``kv_cache_utils.X``): bound on that module
# while each of the file's tests runs, restored after it.
_DURING_TESTS = {
    "tests/v1/core/test_kv_cache_utils.py": (
        "vllm.v1.core.kv_cache_utils",
        "vllm_planning",
        {
            "_project_kv_cache_groups_to_worker": "project_kv_cache_groups_to_worker",
            "unify_hybrid_kv_cache_specs": "unify_hybrid_kv_cache_specs",
        },
    ),
    # vLLM 0.34: the planning flow the file's helper (tests/v1/core/utils.get_kv_cache_configs) and tests
    # call through the module
    "tests/v1/core/test_kv_cache_planning.py": (
        "vllm.v1.core.kv_cache_planning",
        "vllm_planning_034",
        {
            "get_kv_cache_configs": "get_kv_cache_configs",
            "get_global_kv_cache_groups": "get_global_kv_cache_groups",
            "get_kv_cache_groups": "get_kv_cache_groups",
            "check_enough_kv_cache_memory": "check_enough_kv_cache_memory",
            "estimate_max_model_len": "estimate_max_model_len",
        },
    ),
}
_restore: list[tuple[object, str, object]] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    test_file = item.nodeid.split("::")[0]
    entry = _DURING_TESTS.get(test_file) if routes_names(test_file) else None
    if entry is None:
        return
    import importlib

    module = importlib.import_module(entry[0])
    facade = importlib.import_module(f"kvspec.integrations.{entry[1]}")
    for theirs, ours in entry[2].items():
        _restore.append((module, theirs, getattr(module, theirs)))
        setattr(module, theirs, getattr(facade, ours))


def pytest_runtest_teardown(item: pytest.Item) -> None:
    while _restore:
        owner, name, value = _restore.pop()
        setattr(owner, name, value)


def _module_routes() -> dict[str, dict[str, object]]:
    """Per test file: the names its module imported from vLLM, bound to kvspec's instead (after import,
    so vLLM's own modules and the other files keep vLLM's classes)."""
    from kvspec import managers
    from kvspec.blocks import hashing, pool
    from kvspec.contracts.release import VLLM_0_34
    from kvspec.integrations.vllm_managers import vllm_style

    pool_names = {
        "BlockPool": vllm_kv_cache_manager.VllmBlockPool,
        "BlockHashToBlockMap": pool.BlockHashToBlockMap,
        "KVCacheBlock": pool.KVCacheBlock,
        "make_block_hash_with_group_id": hashing.make_block_hash_with_group_id,
        "get_block_hash": hashing.get_block_hash,
        "get_group_id": hashing.get_group_id,
    }
    from kvspec.blocks import metrics as block_metrics
    from kvspec.integrations import vllm as vllm_integration
    from kvspec.integrations import vllm_planning, vllm_planning_034

    return {
        "tests/v1/core/test_kv_cache_utils.py": {
            "KVCacheBlock": pool.KVCacheBlock,
            "FreeKVCacheBlockQueue": pool.FreeKVCacheBlockQueue,
            **{
                name: getattr(vllm_planning, name)
                for name in (
                    "estimate_max_model_len",
                    "generate_scheduler_kv_cache_config",
                    "get_kv_cache_configs",
                    "get_max_concurrency_for_kv_cache_config",
                    "is_kv_cache_spec_uniform",
                )
            },
        },
        "tests/v1/core/test_kv_cache_metrics.py": {
            "BlockMetricsState": block_metrics.BlockMetricsState,
            "KVCacheMetricsCollector": block_metrics.KVCacheMetricsCollector,
            "KVCacheBlock": pool.KVCacheBlock,
        },
        "tests/v1/core/test_kv_sharing.py": {
            "add_kv_sharing_layers_to_kv_cache_groups": vllm_integration.add_kv_sharing_layers_to_kv_cache_groups,
        },
        "tests/v1/core/test_prefix_caching.py": pool_names,
        # vLLM 0.34's planning names the file imports (the rest go through the module: _DURING_TESTS)
        "tests/v1/core/test_kv_cache_planning.py": {
            name: getattr(vllm_planning_034, name)
            for name in (
                "check_enough_kv_cache_memory",
                "estimate_max_model_len",
                "get_kv_cache_groups",
                "is_kv_cache_spec_uniform",
            )
        },
        # vLLM 0.34's partial prompt-tail entries on kvspec's pool (BlockPool.cache_partial_block) and its
        # coarse hash view under 0.34's rule (a coarse block keyed by its last fine hash)
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py": {
            "BlockPool": vllm_kv_cache_manager.Vllm034BlockPool,
            "KVCacheBlock": pool.KVCacheBlock,
            "BlockHashListWithBlockSize": functools.partial(
                hashing.BlockHashListWithBlockSize, last_fine=VLLM_0_34.pool.coarse_hash_is_last_fine
            ),
        },
        "tests/v1/core/test_single_type_kv_cache_manager.py": {
            "BlockPool": vllm_kv_cache_manager.VllmBlockPool
            if RELEASE == "0.23.0"
            else vllm_kv_cache_manager.Vllm034BlockPool,
            "KVCacheBlock": pool.KVCacheBlock,
            "BlockHash": hashing.BlockHash,
            "make_block_hash_with_group_id": hashing.make_block_hash_with_group_id,
            **{
                name: vllm_style(getattr(managers, name), RELEASE)
                for name in (
                    "SlidingWindowManager",
                    "ChunkedLocalAttentionManager",
                    # 0.34.0's file also builds these
                    "FullAttentionManager",
                    "MambaManager",
                    "RSWAManager",
                    "CircularBufferManager",
                )
            },
        },
    }


_ROUTED_AT_IMPORT = {"tests/v1/test_kv_cache_spec_registry.py"}


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    """While a file of _ROUTED_AT_IMPORT is imported, vLLM's names it imports are kvspec's."""
    if (
        not isinstance(collector, pytest.Module)
        or not routes_names(collector.nodeid)
        or collector.nodeid not in _ROUTED_AT_IMPORT
    ):
        return (yield)
    import importlib

    import registry_shim  # type: ignore[import-not-found]

    saved: list[tuple[object, str, object]] = []
    for module_name, names in registry_shim.routes().items():
        module = importlib.import_module(module_name)
        for name, value in names.items():
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)
    try:
        return (yield)
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    routes = _module_routes()
    for item in items:
        module = getattr(item, "module", None)
        test_file = item.nodeid.split("::")[0]
        route = routes.get(test_file) if routes_names(test_file) else None
        if module is not None and route is not None:
            for name, value in route.items():
                setattr(module, name, value)
        name = item.nodeid.split("[")[0]
        reason, _ = _listed(EXPECTED_DIFFERENCES, item.nodeid, name)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"expected difference: {reason}"))
            continue
        reason, _ = _listed(OUT_OF_SCOPE, item.nodeid, name)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"out of scope: {reason}"))
            continue
        reason, exact = _listed(KNOWN_GAPS, item.nodeid, name)
        if reason is not None:
            # An entry naming the test is strict (the run fails the day it passes, so the list cannot go
            # stale); a pattern covering a feature's tests is not (some of them pass on kvspec already).
            item.add_marker(pytest.mark.xfail(reason=f"kvspec gap: {reason}", strict=exact))


def _listed(table: dict[str, str], nodeid: str, name: str) -> tuple[str | None, bool]:
    """(reason, whether the entry names this test) for a test in ``table``: by node id, by name without
    parameters, or by a key with ``*`` matching the node id (fnmatch)."""
    reason = table.get(nodeid) or table.get(name)
    if reason is not None:
        return reason, True
    for key, pattern_reason in table.items():
        if "*" in key and fnmatch.fnmatchcase(nodeid, key):
            return pattern_reason, False
    return None, True
