"""conftest for the stock run of vLLM's tests (copied next to them by run_suite.py): the marker and the CPU
platform; the kvspec run's conftest imports both from here."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cpu_test: vLLM's marker for tests that need no GPU")


def _cpu_platform() -> None:
    """vLLM's platform detection finds no device here (CUDA wheel, no GPU): run its CPU platform, as a
    vLLM CPU build would. Both runs (stock and kvspec) get the same platform."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()


_cpu_platform()
