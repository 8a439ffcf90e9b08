"""conftest for the stock run of vLLM's tests (copied next to them by run_suite.py): the marker and the CPU
platform; the kvspec run's conftest imports both from here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cpu_test: vLLM's marker for tests that need no GPU")
    config.addinivalue_line("markers", "skip_global_cleanup: vLLM's marker (its root conftest's cleanup)")


@pytest.fixture()
def caplog_vllm(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """vLLM's root-conftest fixture (its tests' root conftest is not unpacked): ``caplog`` seeing vLLM's
    records at INFO, vLLM's logger propagating to the root logger while the test runs."""
    import logging

    logger = logging.getLogger("vllm")
    saved = logger.propagate
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO):
            yield caplog
    finally:
        logger.propagate = saved


def _cpu_platform() -> None:
    """vLLM's platform detection finds no device here (CUDA wheel, no GPU): run its CPU platform, as a
    vLLM CPU build would. Both runs (stock and kvspec) get the same platform."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = _NoKernelCpuPlatform() if _needs_triton_check_lifted() else CpuPlatform()


def _needs_triton_check_lifted() -> bool:
    """vLLM 0.34's CPU platform refuses an x86 machine without triton-cpu (which only vLLM's CPU build
    brings) in every VllmConfig it checks; these tests run no kernel."""
    import vllm.triton_utils

    return hasattr(vllm.triton_utils, "HAS_TRITON") and not vllm.triton_utils.HAS_TRITON


def _make_no_kernel_platform() -> type:
    from vllm.platforms.cpu import CpuPlatform

    class NoKernelCpuPlatform(CpuPlatform):  # type: ignore[misc]
        """vLLM's CPU platform with its triton-cpu requirement lifted while a config is checked."""

        @classmethod
        def check_and_update_config(cls, vllm_config: object) -> None:
            import vllm.triton_utils

            saved = vllm.triton_utils.HAS_TRITON
            vllm.triton_utils.HAS_TRITON = True
            try:
                super().check_and_update_config(vllm_config)
            finally:
                vllm.triton_utils.HAS_TRITON = saved

    return NoKernelCpuPlatform


def _NoKernelCpuPlatform() -> object:
    return _make_no_kernel_platform()()


_cpu_platform()
