"""Verdicts: each file under each checker, judged against what is written down."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.typing.checkers.diagnostics import Diagnostic, relative_path
from tests.typing.checkers.markers import MYPY_LIKE, expectations
from tests.typing.checkers.pins import ROOT, TYPING
from tests.typing.checkers.runners import RUNNERS, Environment


@dataclass(frozen=True, kw_only=True, slots=True)
class FileVerdict:
    """One file under one checker: ``problems`` says what differs from what is written down (empty: as
    expected); ``caught`` / ``marked`` count the marked lines caught (a reject file), ``missed`` those a
    checker is documented not to express."""

    path: str
    problems: tuple[str, ...]
    caught: int = 0
    marked: int = 0
    missed: int = 0


def judge_accept(path: str, checker: str, diags: Sequence[Diagnostic]) -> FileVerdict:
    """An accept file (or an example) is clean: no error anywhere in it."""
    errors = [d for d in diags if d.severity == "error"]
    return FileVerdict(
        path=path, problems=tuple(f"{checker}: {path}:{d.line}: [{d.code}] {d.message}" for d in errors)
    )


def judge_reject(
    path: Path, checker: str, diags: Sequence[Diagnostic], shown: str | None = None
) -> FileVerdict:
    """A reject file: every marked line caught as written down (or silent where the checker is documented to
    miss it), and no error outside the marked statements. ``shown``: the name problems use (default: the
    path from the project root)."""
    rel = shown or relative_path(str(path))
    errors = [d for d in diags if d.severity == "error"]
    notes = [d for d in diags if d.severity == "note"]
    problems: list[str] = []
    caught = missed = 0
    marks = expectations(path)
    if not marks:
        problems.append(f"{rel} marks no expected error")
    for mark in marks:
        lo, hi = mark.span
        here = [d for d in errors if lo <= d.line <= hi]
        if checker in mark.missed:
            missed += 1
            if here:
                problems.append(
                    f"{checker}: {rel}:{mark.line}: documented as missed ({mark.missed[checker]}) but reported: "
                    f"{[f'[{d.code}] {d.message}' for d in here]}; update the marker"
                )
            continue
        codes, fragment = mark.wanted(checker)
        hit = any(d.code in codes and fragment in d.message for d in here)
        wants_note = checker in MYPY_LIKE and checker not in mark.codes and mark.note is not None
        said = [n.message for n in notes if lo <= n.line <= hi]
        if hit and (not wants_note or any(str(mark.note) in n for n in said)):
            caught += 1
        else:
            problems.append(
                f"{checker}: {rel}:{mark.line}: expected an error coded {sorted(codes)}"
                + (f" containing {fragment!r}" if fragment else "")
                + (f" with a note naming {mark.note!r}" if wants_note else "")
                + f", got {[f'{d.line}: [{d.code}] {d.message}' for d in here]}"
                + (f" and notes {said}" if wants_note else "")
            )
    spans = [m.span for m in marks]
    for d in errors:
        if not any(lo <= d.line <= hi for lo, hi in spans):
            problems.append(
                f"{checker}: {rel}:{d.line}: error outside the marked lines: [{d.code}] {d.message}"
            )
    return FileVerdict(path=rel, problems=tuple(problems), caught=caught, marked=len(marks), missed=missed)


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckerVerdict:
    """One checker over every file: its version and each file's verdict by kind."""

    checker: str
    version: str
    accept: tuple[FileVerdict, ...]
    reject: tuple[FileVerdict, ...]
    examples: tuple[FileVerdict, ...]
    elsewhere: tuple[str, ...]  # errors the checker reported in files it was not given (kvspec's own)

    @property
    def problems(self) -> list[str]:
        return [p for v in (*self.accept, *self.reject, *self.examples) for p in v.problems] + list(
            self.elsewhere
        )

    def row(self) -> str:
        def clean(verdicts: Sequence[FileVerdict]) -> str:
            return f"{sum(not v.problems for v in verdicts)}/{len(verdicts)}"

        marked = sum(v.marked - v.missed for v in self.reject)
        caught = sum(v.caught for v in self.reject)
        missed = sum(v.missed for v in self.reject)
        lines = f"{caught}/{marked}" + (f" (+{missed} documented: cannot express)" if missed else "")
        files = f"{sum(not v.problems for v in self.reject)}/{len(self.reject)}"
        verdict = "as written down" if not self.problems else f"**{len(self.problems)} difference(s)**"
        return (
            f"| {self.checker} {self.version} | {clean(self.accept)} | {lines} | {files} | {clean(self.examples)} "
            f"| {verdict} |"
        )


TABLE_HEADER = (
    "| checker | accept files clean | reject lines caught | reject files as marked | examples clean | verdict |\n"
    "|---|---|---|---|---|---|"
)


def plugin_files() -> tuple[list[str], list[str], list[str]]:
    """What a plugin author writes: the accept files (README's plugin is one, and the vllm-ascend port in
    tests/fixtures is another), the reject files, examples/."""
    accept = sorted(str(p.relative_to(ROOT)) for p in TYPING.glob("accept_*.py"))
    accept += sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "fixtures" / "vllm_ascend_port").glob("*.py")
    )
    reject = sorted(str(p.relative_to(ROOT)) for p in (TYPING / "reject").glob("reject_*.py"))
    examples = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("**/*.py"))
    return accept, reject, examples


def version_of(checker: str, env: Environment) -> str:
    if checker in ("mypy", "mypy-floor"):
        argv = [env.tools.get(checker, sys.executable), "-m", "mypy", "--version"]
    else:
        argv = [env.tool(checker, "zuban" if checker == "zuban" else checker), "--version"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    found = re.search(r"\d+\.\d+(?:\.\d+)?", out)
    return found.group(0) if found else out.strip()


def mypy_ini_files() -> list[str]:
    """What ``mypy`` alone checks: mypy.ini's ``files`` (kvspec/, stubs/, tests/, benchmarks/, ...)."""

    config = configparser.ConfigParser()
    config.read(ROOT / "mypy.ini")
    return [f.strip() for f in config["mypy"]["files"].split(",") if f.strip()]


def check(checker: str, env: Environment) -> CheckerVerdict:
    """Run ``checker`` once over every plugin file and judge each. Both mypys also check everything mypy.ini
    names in the same run (kvspec/, tests/, benchmarks/, ...): the floor pyproject declares must be clean on
    the project itself, and an error anywhere there is a difference (``elsewhere``)."""
    accept, reject, examples = plugin_files()
    project = mypy_ini_files() if checker in ("mypy", "mypy-floor") else []
    plugin = [*accept, *reject, *examples]
    # A file under one of mypy.ini's folders is checked through it (naming it twice is an error), but for the
    # reject files, which mypy.ini excludes.
    inside = {f for f in plugin if any(f == d or f.startswith(d.rstrip("/") + "/") for d in project)}
    inside -= set(reject)
    diags = RUNNERS[checker](checker, [*project, *(f for f in plugin if f not in inside)], env)
    by_path: dict[str, list[Diagnostic]] = {}
    for d in diags:
        by_path.setdefault(d.path, []).append(d)
    given = {*accept, *reject, *examples}
    elsewhere = tuple(
        f"{checker}: {d.path}:{d.line}: [{d.code}] {d.message}"
        + ("" if project else " (a file the checker was not given)")
        for d in diags
        if d.path not in given and d.severity == "error"
    )
    return CheckerVerdict(
        checker=checker,
        version=version_of(checker, env),
        accept=tuple(judge_accept(p, checker, by_path.get(p, [])) for p in accept),
        reject=tuple(judge_reject(ROOT / p, checker, by_path.get(p, [])) for p in reject),
        examples=tuple(judge_accept(p, checker, by_path.get(p, [])) for p in examples),
        elsewhere=elsewhere,
    )
