"""Running a checker over files, in the settings `nox -s typecheckers` uses for each."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.typing.checkers.diagnostics import Diagnostic, parse_mypy, parse_pyrefly, parse_pyright, parse_ty
from tests.typing.checkers.pins import CACHE, ROOT


@dataclass(frozen=True, kw_only=True, slots=True)
class Environment:
    """Where the checkers run: ``python`` is the interpreter whose packages (torch, kvspec) they resolve;
    ``tools`` maps a checker's name to the interpreter that has it installed (its ``bin/`` holds the command)."""

    python: str
    tools: dict[str, str] = field(default_factory=dict)
    cache_dir: Path = CACHE

    def tool(self, name: str, command: str) -> str:
        python = self.tools.get(name, sys.executable)
        found = Path(python).parent / command
        if found.exists():
            return str(found)
        on_path = shutil.which(command)
        if on_path is None:
            raise FileNotFoundError(
                f"{name}: no {command!r} beside {python} or on PATH; nox -s typecheckers installs it"
            )
        return on_path


def _run(argv: Sequence[str], *, ok: Iterable[int] = (0, 1)) -> str:
    proc = subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode not in set(ok):
        raise RuntimeError(
            f"{' '.join(argv[:3])} ... exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc.stdout


def _mypy_config_without_exclude(env: Environment) -> str:
    """mypy.ini less its ``exclude``: zuban applies it even to files named on the command line."""
    text = (ROOT / "mypy.ini").read_text()
    kept = [line for line in text.splitlines() if not line.startswith("exclude")]
    env.cache_dir.mkdir(parents=True, exist_ok=True)
    path = env.cache_dir / "zuban-mypy.ini"
    path.write_text("\n".join(kept) + "\n")
    return str(path)


#: mypy's and zuban's output as ``parse_mypy`` reads it: one line a diagnostic, with its code.
MYPY_OUTPUT = ("--no-pretty", "--show-error-codes", "--no-error-summary")


def run_mypy(name: str, files: Sequence[str], env: Environment) -> list[Diagnostic]:
    """mypy with mypy.ini (strict). The latest shares mypy.ini's cache with ``nox -s mypy`` (warm after it);
    the floor keeps its own."""
    cache = ROOT / ".mypy_cache" if name == "mypy" else env.cache_dir / name
    command = [env.tools.get(name, sys.executable), "-m", "mypy", "--config-file", "mypy.ini"]
    options = ["--python-executable", env.python, "--cache-dir", str(cache), *MYPY_OUTPUT]
    return parse_mypy(_run([*command, *options, *files]))


def run_zuban(name: str, files: Sequence[str], env: Environment) -> list[Diagnostic]:
    command = [env.tool(name, "zuban"), "mypy", "--config-file", _mypy_config_without_exclude(env)]
    return parse_mypy(_run([*command, "--python-executable", env.python, *MYPY_OUTPUT, *files]))


def _basedpyright_config(env: Environment) -> str:
    """basedpyright in its default ("recommended") mode with stubs/ on its stub path: pyproject's
    [tool.pyright] is pyright's strict mode, and basedpyright refuses a second section beside it. A module
    typed by stubs/ alone (torch_npu: no Ascend runtime here) is a warning, as in pyright, not an error."""
    env.cache_dir.mkdir(parents=True, exist_ok=True)
    path = env.cache_dir / "basedpyright.json"
    settings = {
        "typeCheckingMode": "recommended",
        "pythonVersion": "3.11",
        "stubPath": str(ROOT / "stubs"),
        "extraPaths": [str(ROOT)],
        "reportMissingModuleSource": "warning",
    }
    path.write_text(json.dumps(settings, indent=2) + "\n")
    return str(path)


def run_pyright(name: str, files: Sequence[str], env: Environment) -> list[Diagnostic]:
    config = ["-p", _basedpyright_config(env)] if name == "basedpyright" else []
    return parse_pyright(
        _run([env.tool(name, name), *config, "--pythonpath", env.python, "--outputjson", *files])
    )


def run_pyrefly(name: str, files: Sequence[str], env: Environment) -> list[Diagnostic]:
    command = [env.tool(name, "pyrefly"), "check", "--python-interpreter-path", env.python]
    options = ["--output-format", "json", "--summary", "none", "--progress-bar", "no"]
    return parse_pyrefly(_run([*command, *options, *files]))


def run_ty(name: str, files: Sequence[str], env: Environment) -> list[Diagnostic]:
    command = [env.tool(name, "ty"), "check", "--python", env.python]
    return parse_ty(_run([*command, "--output-format", "concise", "--no-progress", *files]))


RUNNERS: dict[str, Callable[[str, Sequence[str], Environment], list[Diagnostic]]] = {
    "mypy-floor": run_mypy,
    "mypy": run_mypy,
    "pyright": run_pyright,
    "basedpyright": run_pyright,
    "pyrefly": run_pyrefly,
    "ty": run_ty,
    "zuban": run_zuban,
}
