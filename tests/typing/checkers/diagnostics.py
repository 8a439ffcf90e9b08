"""What a checker said: one ``Diagnostic`` per error or note, read from each checker's own output."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from tests.typing.checkers.pins import ROOT


@dataclass(frozen=True, kw_only=True, slots=True)
class Diagnostic:
    """One error (or note) a checker reported: ``line`` is 1-based; ``code`` is the checker's own rule name."""

    path: str
    line: int
    code: str
    message: str
    severity: str  # "error" | "note"


def relative_path(path: str) -> str:
    p = Path(path)
    try:
        return str((p if p.is_absolute() else ROOT / p).resolve().relative_to(ROOT))
    except ValueError:
        return path


_MYPY_LINE = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+)(?::\d+)?: (?P<severity>error|note): (?P<message>.*?)(?:\s+\[(?P<code>[a-z-]+)\])?$"
)


def parse_mypy(stdout: str) -> list[Diagnostic]:
    """mypy's (and zuban's) ``path:line: error: message  [code]`` lines; a note keeps its line's path."""
    out: list[Diagnostic] = []
    for line in stdout.splitlines():
        match = _MYPY_LINE.match(line)
        if match:
            out.append(
                Diagnostic(
                    path=relative_path(match["path"]),
                    line=int(match["line"]),
                    code=match["code"] or "",
                    message=match["message"],
                    severity=match["severity"],
                )
            )
        elif ": error:" in line:
            raise ValueError(f"unparsed mypy error line: {line}")
    return out


def parse_pyright(stdout: str) -> list[Diagnostic]:
    """pyright's and basedpyright's ``--outputjson`` (lines there are 0-based)."""
    report = json.loads(stdout)
    return [
        Diagnostic(
            path=relative_path(d["file"]),
            line=int(d["range"]["start"]["line"]) + 1,
            code=d.get("rule", ""),
            message=d["message"],
            severity="error" if d["severity"] == "error" else "note",
        )
        for d in report.get("generalDiagnostics", [])
    ]


def parse_pyrefly(stdout: str) -> list[Diagnostic]:
    """pyrefly's ``--output-format json``."""
    report = json.loads(stdout)
    return [
        Diagnostic(
            path=relative_path(e["path"]),
            line=int(e["line"]),
            code=e["name"],
            message=e["description"],
            severity="error" if e.get("severity", "error") == "error" else "note",
        )
        for e in report.get("errors", [])
    ]


_TY_LINE = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+):\d+: (?P<severity>error|warning)\[(?P<code>[a-z-]+)\] (?P<message>.*)$"
)


def parse_ty(stdout: str) -> list[Diagnostic]:
    """ty's ``--output-format concise`` lines."""
    out: list[Diagnostic] = []
    for line in stdout.splitlines():
        match = _TY_LINE.match(line)
        if match:
            out.append(
                Diagnostic(
                    path=relative_path(match["path"]),
                    line=int(match["line"]),
                    code=match["code"],
                    message=match["message"],
                    severity="error" if match["severity"] == "error" else "note",
                )
            )
    return out
