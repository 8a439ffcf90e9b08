"""Sessions: ``nox`` runs tests, mypy and lint; ``nox -s tests -- -k registry`` passes pytest arguments."""

from __future__ import annotations

import nox

nox.needs_version = ">=2024.10.9"
nox.options.default_venv_backend = "venv"  # pip takes torch==2.13.0 from the local wheel; uv would not
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests", "mypy", "lint"]


def _install(session: nox.Session) -> None:
    if session.venv_backend == "none":  # `nox --no-venv`: the caller's environment is complete
        return
    session.install("-c", "constraints.txt", "torch==2.13.0")
    session.install("-c", "constraints.txt", "-e", ".[dev]")


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """pytest, with every kvspec boundary and hot-path method type-checked by beartype."""
    _install(session)
    session.run("pytest", *session.posargs, env={"KVSPEC_TYPECHECK": "full"})


@nox.session(python="3.11")
def mypy(session: nox.Session) -> None:
    """mypy --strict over kvspec/, stubs/, tests/ and benchmarks/ in one process (config in mypy.ini)."""
    _install(session)
    session.run("mypy", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check and format check (needs ruff alone, not the package or torch)."""
    if session.venv_backend != "none":
        session.install("ruff>=0.8")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def _install_vllm(session: nox.Session) -> None:
    """vllm==0.23.0 without its dependencies, the pure-Python ones its imports need, CPU torch, kvspec."""
    session.install("-c", "constraints.txt", "torch==2.13.0")
    session.install("--no-deps", "vllm==0.23.0")
    session.install("--no-deps", "-r", "benchmarks/vllm-requirements.txt")
    session.install("--no-deps", "-e", ".")
    session.install("mypy-extensions>=1.0")  # kvspec's one pure-Python dependency vLLM's set lacks


@nox.session(python="3.11", default=False)
def vllm(session: nox.Session) -> None:
    """kvspec against vLLM 0.23.0 itself: spec conversion and vLLM's real Scheduler on kvspec's adapter
    (tests/vllm), then vLLM's own KV-cache and scheduler tests from its sdist, on stock vLLM and on kvspec
    (tests/vllm_suite/run_suite.py; fails if a test passing on stock fails on kvspec unlisted)."""
    _install_vllm(session)
    session.install("beartype>=0.19", "pytest>=8", "hypothesis>=6.100")
    env = {"KVSPEC_TYPECHECK": "full", "VLLM_LOGGING_LEVEL": "ERROR"}
    session.run("pytest", "tests/vllm", *session.posargs, env=env)
    session.run("python", "tests/vllm_suite/run_suite.py", env=env)


@nox.session(python="3.11", default=False)
def bench(session: nox.Session) -> None:
    """kvspec against vllm==0.23.0 (installed with --no-deps next to CPU torch 2.13.0); not part of `nox`."""
    _install_vllm(session)
    session.install("beartype>=0.19")
    session.run("python", "-m", "benchmarks.vs_vllm", *session.posargs, env={"VLLM_LOGGING_LEVEL": "ERROR"})
