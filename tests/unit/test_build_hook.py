"""setup.py's build hook: KVSPEC_COMPILE=1 gives the compiled build or an error saying why, never a quiet
pure-Python build (pip shows a build's output only with -v)."""

from __future__ import annotations

import runpy
import sys
import types
from pathlib import Path
from typing import Any

import pytest

SETUP = str(Path(__file__).resolve().parents[2] / "setup.py")


def _run_setup(monkeypatch: pytest.MonkeyPatch, compile_setting: str | None) -> list[Any]:
    """Run setup.py with setuptools.setup captured; the extensions it would build."""
    captured: list[Any] = []
    monkeypatch.setattr("setuptools.setup", lambda **kw: captured.extend(kw.get("ext_modules", [])))
    if compile_setting is None:
        monkeypatch.delenv("KVSPEC_COMPILE", raising=False)
    else:
        monkeypatch.setenv("KVSPEC_COMPILE", compile_setting)
    runpy.run_path(SETUP, run_name="setup")
    return captured


def test_without_kvspec_compile_the_build_is_pure(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run_setup(monkeypatch, None) == []
    assert _run_setup(monkeypatch, "0") == []


def test_compile_without_mypyc_is_an_error_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mypyc.build", None)  # import of it raises ImportError
    with pytest.raises(SystemExit) as err:
        _run_setup(monkeypatch, "1")
    message = str(err.value)
    assert message.startswith("kvspec: KVSPEC_COMPILE=1 needs mypyc")
    assert "pip install mypy" in message and "unset KVSPEC_COMPILE" in message


def test_compiled_extensions_are_not_optional(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A module that fails to compile fails the build (setuptools skips an optional extension silently)."""
    asked: list[list[str]] = []

    def mypycify(modules: list[str], opt_level: str) -> list[types.SimpleNamespace]:
        asked.append(modules)
        # setuptools' Extension as far as the hook touches it: a name, and optional False unless set.
        return [
            types.SimpleNamespace(name=name, optional=False)
            for name in ("kvspec__mypyc", "kvspec.blocks.pool")
        ]

    fake = types.ModuleType("mypyc.build")
    fake.__dict__["mypycify"] = mypycify
    monkeypatch.setitem(sys.modules, "mypyc.build", fake)
    extensions = _run_setup(monkeypatch, "1")
    assert [e.name for e in extensions] == ["kvspec__mypyc", "kvspec.blocks.pool"]
    assert not any(getattr(e, "optional", False) for e in extensions)
    from kvspec.build_info import COMPILED_MODULES

    assert asked == [list(COMPILED_MODULES)]
    assert f"compiling {len(COMPILED_MODULES)} modules with mypyc" in capsys.readouterr().err
