"""conftest for the kvspec run of vLLM's tests (copied next to them by run_suite.py).

It routes vLLM's KV-cache manager to kvspec's adapter (``kvspec.integrations.vllm_kv_cache_manager``)
before the test modules import it, so every decision the tests check comes from kvspec. Tests listed in
``expected_differences.py`` (kvspec's documented fixes) and ``out_of_scope.py`` are skipped with their
reasons.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.environ["KVSPEC_SUITE_ROOT"], "tests", "vllm_suite"))

from expected_differences import EXPECTED_DIFFERENCES, OUT_OF_SCOPE  # type: ignore[import-not-found]

from kvspec.integrations import vllm_kv_cache_manager


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cpu_test: vLLM's marker for tests that need no GPU")


def _cpu_platform() -> None:
    """The same platform as the stock run (see stock_conftest.py)."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()


_cpu_platform()
vllm_kv_cache_manager.install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = item.nodeid.split("[")[0]
        reason = EXPECTED_DIFFERENCES.get(item.nodeid) or EXPECTED_DIFFERENCES.get(name)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"expected difference: {reason}"))
            continue
        reason = OUT_OF_SCOPE.get(item.nodeid) or OUT_OF_SCOPE.get(name)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"out of scope: {reason}"))
