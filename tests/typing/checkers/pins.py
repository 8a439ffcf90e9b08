"""The checkers and their pinned versions (tests/typing/checkers.txt; the mypy floor is pyproject's), and
their installation, each in a virtualenv of its own."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[3]
TYPING = ROOT / "tests" / "typing"
PINS_FILE = TYPING / "checkers.txt"
CACHE = ROOT / ".typecheckers-cache"

#: The order of the table's rows.
CHECKER_NAMES = ("mypy-floor", "mypy", "pyright", "basedpyright", "pyrefly", "ty", "zuban")


def mypy_floor() -> str:
    """The lowest mypy the project declares (``mypy>=X`` in pyproject's dev extra), as ``X``."""
    dev: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "dev"
    ]
    floors = [r.split(">=", 1)[1].split(",")[0].strip() for r in dev if re.match(r"mypy\s*>=", r)]
    if len(floors) != 1:
        raise ValueError(f"pyproject's dev extra must declare one 'mypy>=X', found {floors}")
    return floors[0]


def pins() -> dict[str, str]:
    """checker -> pip requirement: tests/typing/checkers.txt, and the floor as ``mypy==X``."""
    out = {"mypy-floor": f"mypy=={mypy_floor()}"}
    for line in PINS_FILE.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, requirement = line.split(None, 1)
            out[name] = requirement.strip()
    missing = {*CHECKER_NAMES, "torch-npu"} - out.keys()
    if missing:
        raise ValueError(f"{PINS_FILE.name} pins no version of {sorted(missing)}")
    return out


def install(checkers: Iterable[str], root: Path = CACHE / "venvs") -> dict[str, str]:
    """Each checker in a virtualenv of its own under ``root`` (reused when it already holds the pinned
    requirement): checker -> that virtualenv's python. pip resolves from its own configuration."""
    out: dict[str, str] = {}
    wanted = pins()
    for name in checkers:
        venv = root / name
        python = venv / "bin" / "python"
        stamp = venv / "kvspec-pin.txt"
        if not (python.exists() and stamp.exists() and stamp.read_text() == wanted[name]):
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", wanted[name]],
                check=True,
            )
            stamp.write_text(wanted[name])
        out[name] = str(python)
    return out
