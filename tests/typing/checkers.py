"""Every type checker a plugin author runs, over everything a plugin author writes against kvspec.

``python -m tests.typing.checkers`` runs each checker over ``tests/typing`` (files that must be accepted,
and files whose marked lines must be rejected), ``examples/`` and README's plugin (which is
``tests/typing/accept_README_example.py``), and prints one row per checker: accept files clean, reject
lines caught, examples clean. It exits 1 when a checker's verdict differs from what is written down. The
pinned versions live in ``tests/typing/checkers.txt`` (the mypy floor is pyproject's); ``nox -s
typecheckers`` installs them and runs this.

How a reject line is marked (one trailing comment, fields separated by ``  # ``)::

    default_registry.register(NotASpec, Mgr)  # E: [arg-type] expected "type[KVCacheSpec]"  # N: page_size_bytes

- ``E: [code] fragment``: mypy (both versions) and zuban report an error with that code whose message
  contains the fragment; ``N: text`` a note containing the text (mypy names the missing protocol member
  there). Every other checker must report an error of the same kind (``EQUIVALENT_CODES``).
- ``<checker>: [code]``: that checker reports the mistake under another code than the table says.
- ``<checker>: missed: why``: that checker cannot express the mistake (the reason, and the run-time check
  that catches it instead, are written there); the line must then be silent under that checker, so that a
  checker release that starts catching it is noticed.

A marked line stands for the statement it is on: the whole header of a decorated ``class`` or ``def``
(decorators included), or the whole of a simple statement. Checkers disagree on which of those lines they
report a mistake (mypy names a class decorator's mistake on the ``class`` line, pyright on the decorator's).
Every error must fall in some marked statement: an error anywhere else fails the file.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TYPING = ROOT / "tests" / "typing"
PINS_FILE = TYPING / "checkers.txt"
CACHE = ROOT / ".typecheckers-cache"

#: The order of the table's rows.
CHECKER_NAMES = ("mypy-floor", "mypy", "pyright", "basedpyright", "pyrefly", "ty", "zuban")
#: The command each checker's package installs (mypy runs as ``python -m mypy``).
COMMANDS = {
    "pyright": "pyright",
    "basedpyright": "basedpyright",
    "pyrefly": "pyrefly",
    "ty": "ty",
    "zuban": "zuban",
}


def mypy_floor() -> str:
    """The lowest mypy the project declares (``mypy>=X`` in pyproject's dev extra), as ``X``."""
    import tomllib

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


# -- what a checker said -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Diagnostic:
    """One error (or note) a checker reported: ``line`` is 1-based; ``code`` is the checker's own rule name."""

    path: str
    line: int
    code: str
    message: str
    severity: str  # "error" | "note"


def _relative(path: str) -> str:
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
                    path=_relative(match["path"]),
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
            path=_relative(d["file"]),
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
            path=_relative(e["path"]),
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
                    path=_relative(match["path"]),
                    line=int(match["line"]),
                    code=match["code"],
                    message=match["message"],
                    severity="error" if match["severity"] == "error" else "note",
                )
            )
    return out


# -- running a checker ----------------------------------------------------------------------------------


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


def run_mypy(name: str, files: Sequence[str], env: Environment) -> list[Diagnostic]:
    """mypy with mypy.ini (strict). The latest shares mypy.ini's cache with ``nox -s mypy`` (warm after it);
    the floor keeps its own."""
    python = env.tools.get(name, sys.executable)
    cache = ROOT / ".mypy_cache" if name == "mypy" else env.cache_dir / name
    return parse_mypy(
        _run(
            [
                python,
                "-m",
                "mypy",
                "--config-file",
                "mypy.ini",
                "--python-executable",
                env.python,
                "--cache-dir",
                str(cache),
                "--no-pretty",
                "--show-error-codes",
                "--no-error-summary",
                *files,
            ]
        )
    )


def run_zuban(name: str, files: Sequence[str], env: Environment) -> list[Diagnostic]:
    return parse_mypy(
        _run(
            [
                env.tool(name, "zuban"),
                "mypy",
                "--config-file",
                _mypy_config_without_exclude(env),
                "--python-executable",
                env.python,
                "--no-pretty",
                "--show-error-codes",
                "--no-error-summary",
                *files,
            ]
        )
    )


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
    return parse_pyrefly(
        _run(
            [
                env.tool(name, "pyrefly"),
                "check",
                "--python-interpreter-path",
                env.python,
                "--output-format",
                "json",
                "--summary",
                "none",
                "--progress-bar",
                "no",
                *files,
            ]
        )
    )


def run_ty(name: str, files: Sequence[str], env: Environment) -> list[Diagnostic]:
    return parse_ty(
        _run(
            [
                env.tool(name, "ty"),
                "check",
                "--python",
                env.python,
                "--output-format",
                "concise",
                "--no-progress",
                *files,
            ]
        )
    )


RUNNERS: dict[str, Callable[[str, Sequence[str], Environment], list[Diagnostic]]] = {
    "mypy-floor": run_mypy,
    "mypy": run_mypy,
    "pyright": run_pyright,
    "basedpyright": run_pyright,
    "pyrefly": run_pyrefly,
    "ty": run_ty,
    "zuban": run_zuban,
}


# -- what a file expects --------------------------------------------------------------------------------

#: The checkers whose codes are mypy's: a marker's ``[code]`` and fragment apply to them as written.
MYPY_LIKE = frozenset({"mypy-floor", "mypy", "zuban"})

_PYRIGHT_CODES: dict[str, frozenset[str]] = {
    "arg-type": frozenset({"reportArgumentType"}),
    "type-var": frozenset({"reportArgumentType"}),
    "return-value": frozenset({"reportReturnType"}),
    "override": frozenset({"reportIncompatibleMethodOverride", "reportIncompatibleVariableOverride"}),
    "misc": frozenset({"reportIncompatibleMethodOverride", "reportIncompatibleVariableOverride"}),
    "attr-defined": frozenset({"reportAttributeAccessIssue"}),
    "call-arg": frozenset({"reportCallIssue"}),
}

#: How each checker that is not mypy-like names the mistake mypy reports under a code: an error there must
#: carry one of these codes. (``misc`` is mypy's "Dataclass attribute may only be overridden by another
#: attribute", which the others report as the override it is.)
EQUIVALENT_CODES: dict[str, dict[str, frozenset[str]]] = {
    "pyright": _PYRIGHT_CODES,
    "basedpyright": _PYRIGHT_CODES,
    "pyrefly": {
        "arg-type": frozenset({"bad-argument-type"}),
        "type-var": frozenset({"bad-argument-type", "bad-specialization"}),
        "return-value": frozenset({"bad-return"}),
        "override": frozenset({"bad-override"}),
        "misc": frozenset({"bad-override"}),
        "attr-defined": frozenset({"missing-attribute"}),
        "call-arg": frozenset({"unexpected-keyword", "bad-argument-count"}),
    },
    "ty": {
        "arg-type": frozenset({"invalid-argument-type"}),
        "type-var": frozenset({"invalid-argument-type"}),
        "return-value": frozenset({"invalid-return-type", "invalid-explicit-return"}),
        "override": frozenset(
            {"invalid-method-override", "incompatible-method-override", "incompatible-property-override"}
        ),
        "misc": frozenset({"incompatible-property-override", "incompatible-method-override"}),
        "attr-defined": frozenset({"unresolved-attribute", "missing-attribute"}),
        "call-arg": frozenset({"unknown-argument", "too-many-positional-arguments"}),
    },
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Expectation:
    """One marked line: mypy's code and message fragment (and note), and each checker's deviation:
    ``codes`` another code for that checker, ``missed`` why that checker cannot express the mistake."""

    line: int
    span: tuple[int, int]
    code: str
    fragment: str
    note: str | None = None
    codes: dict[str, str] = field(default_factory=dict)
    missed: dict[str, str] = field(default_factory=dict)

    def wanted(self, checker: str) -> tuple[frozenset[str], str]:
        """The codes an error must carry for ``checker``, and the fragment its message must contain ('' for
        checkers that are not mypy-like: their wording is their own)."""
        if checker in self.codes:
            return frozenset({self.codes[checker]}), ""
        if checker in MYPY_LIKE:
            return frozenset({self.code}), self.fragment
        return EQUIVALENT_CODES[checker].get(self.code, frozenset()), ""


_MARKER = re.compile(r"#\s*E:\s*\[(?P<code>[a-z-]+)\]\s*(?P<rest>.*)$")
_FIELD = re.compile(r"\s+#\s+(?=[A-Za-z][A-Za-z-]*:)")


def statement_spans(source: str) -> list[tuple[int, int]]:
    """Every statement's span: a simple statement's first to last line; a ``def`` or ``class`` header from
    its first decorator to the line before its body."""
    spans: list[tuple[int, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            spans.append((first, max(node.lineno, node.body[0].lineno - 1)))
        elif isinstance(node, ast.stmt) and not hasattr(node, "body"):
            spans.append((node.lineno, node.end_lineno or node.lineno))
    return spans


def expectations(path: Path) -> list[Expectation]:
    """The marked lines of a reject file, each with the span of the statement it is on."""
    source = path.read_text()
    spans = statement_spans(source)
    out: list[Expectation] = []
    for lineno, text in enumerate(source.splitlines(), start=1):
        match = _MARKER.search(text)
        if match is None:
            continue
        fragment, *fields = _FIELD.split(match["rest"])
        note: str | None = None
        codes: dict[str, str] = {}
        missed: dict[str, str] = {}
        for item in fields:
            key, value = (s.strip() for s in item.split(":", 1))
            if key != "N" and key not in CHECKER_NAMES:
                raise ValueError(
                    f"{path.name}:{lineno}: {key!r} is not a checker ({', '.join(CHECKER_NAMES)})"
                )
            if key == "N":
                note = value
            elif value.startswith("missed:"):
                missed[key] = value.removeprefix("missed:").strip()
            elif re.fullmatch(r"\[[A-Za-z-]+\]", value):
                codes[key] = value[1:-1]
            else:
                raise ValueError(f"{path.name}:{lineno}: cannot read the {key!r} expectation {value!r}")
        containing = [s for s in spans if s[0] <= lineno <= s[1]]
        span = min(containing, key=lambda s: s[1] - s[0]) if containing else (lineno, lineno)
        out.append(
            Expectation(
                line=lineno,
                span=span,
                code=match["code"],
                fragment=fragment.strip(),
                note=note,
                codes=codes,
                missed=missed,
            )
        )
    return out


# -- verdicts -------------------------------------------------------------------------------------------


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
    rel = shown or _relative(str(path))
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
    import configparser

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


# -- stubs/ against the library it types -----------------------------------------------------------------


def _signatures(tree: ast.Module) -> dict[str, list[tuple[str, bool]]]:
    """Module-level functions: name -> [(parameter, has a default)]."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            defaults = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
            out[node.name] = [(a.arg, d) for a, d in zip(positional, defaults, strict=True)]
    return out


def npu_stub_problems(package_dir: Path) -> list[str]:
    """Each function stubs/torch_npu/npu types, compared with the one torch_npu defines (in
    ``torch_npu/npu/__init__.py`` or the module it imports it from): the same parameters, the same ones
    optional. ``package_dir`` holds the unpacked ``torch_npu`` package."""
    stubs = _signatures(ast.parse((ROOT / "stubs" / "torch_npu" / "npu" / "__init__.pyi").read_text()))
    init = package_dir / "torch_npu" / "npu" / "__init__.py"
    tree = ast.parse(init.read_text())
    real = _signatures(tree)
    for node in tree.body:  # `from .utils import synchronize, ...`
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            source = init.parent / f"{node.module.replace('.', '/')}.py"
            if source.exists():
                found = _signatures(ast.parse(source.read_text()))
                real.update({a.asname or a.name: found[a.name] for a in node.names if a.name in found})
    problems = []
    for name, params in stubs.items():
        if name not in real:
            problems.append(f"stubs/torch_npu: torch_npu.npu has no function {name!r}")
        elif real[name] != params:
            problems.append(f"stubs/torch_npu: npu.{name}{params} but torch_npu defines {real[name]}")
    return problems


def check_npu_stubs() -> list[str]:
    """Download the pinned torch_npu wheel (no dependencies; it is not installed) and compare the stubs."""
    import zipfile

    target = CACHE / "torch-npu"
    target.mkdir(parents=True, exist_ok=True)
    wheels = sorted(target.glob("torch_npu-*.whl"))
    if not wheels:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "-d",
                str(target),
                pins()["torch-npu"],
            ],
            check=True,
        )
        wheels = sorted(target.glob("torch_npu-*.whl"))
    unpacked = target / "src"
    with zipfile.ZipFile(wheels[-1]) as wheel:
        for name in wheel.namelist():
            if name.startswith("torch_npu/npu/") and name.endswith(".py"):
                wheel.extract(name, unpacked)
    return npu_stub_problems(unpacked)


# -- a plugin project outside the checkout --------------------------------------------------------------

#: How README tells a plugin author to install kvspec: as a package (pip builds a wheel), or editable in the
#: mode whose path a checker follows (setuptools' default editable mode is an import hook no checker sees).
INSTALL_FORMS: dict[str, tuple[str, ...]] = {
    "package": (str(ROOT),),
    "editable": ("-e", str(ROOT), "--config-settings", "editable_mode=compat"),
}
OUTSIDE_CHECKERS = ("mypy", "pyright")
#: The negative control: setuptools' default editable install (an import hook), which no checker follows,
#: must make the outside project fail (``--control``), or the check above proves nothing.
HOOK_FORM: tuple[str, ...] = ("-e", str(ROOT))


def _site_packages(python: str) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def outside_project(env: Environment, form: str, checkers: Sequence[str] = OUTSIDE_CHECKERS) -> list[str]:
    """A plugin project in a temporary folder outside the checkout, kvspec installed into its own virtualenv
    as README says (``form``: "package" or "editable"; its dependencies are taken from ``env.python``'s
    packages rather than downloaded again), then each checker run from that folder, strict: README's plugin
    must be clean and the audit's mistakes caught as marked, which proves the checker resolved kvspec (a
    kvspec it cannot see is ``Any``, and the mistakes pass). The problems found (empty: as expected)."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kvspec-plugin-") as tmp:
        project = Path(tmp) / "acme"
        (project / "acme").mkdir(parents=True)
        (project / "acme" / "__init__.py").write_text("")
        (project / "acme" / "plugin.py").write_text((TYPING / "accept_readme_example.py").read_text())
        mistakes = TYPING / "reject" / "reject_plugin_audit.py"
        (project / "acme" / "mistakes.py").write_text(mistakes.read_text())
        (project / "mypy.ini").write_text("[mypy]\nstrict = True\n")
        (project / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "strict"}) + "\n")
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        # torch and kvspec's other requirements come from the checked environment (no second download).
        Path(_site_packages(python), "kvspec_test_requirements.pth").write_text(
            _site_packages(env.python) + "\n"
        )
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                *(HOOK_FORM if form == "hook" else INSTALL_FORMS[form]),
            ],
            check=True,
            cwd=tmp,
            capture_output=True,
        )
        files = ["acme/plugin.py", "acme/mistakes.py"]
        for checker in checkers:
            if checker == "mypy":
                argv = [
                    env.tools.get("mypy", sys.executable),
                    "-m",
                    "mypy",
                    "--python-executable",
                    python,
                    "--cache-dir",
                    str(Path(tmp) / "mypy-cache"),
                    "--no-pretty",
                    "--show-error-codes",
                    "--no-error-summary",
                    *files,
                ]
                out = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=1800)
                diags = parse_mypy(out.stdout)
            elif checker == "pyright":
                argv = [env.tool("pyright", "pyright"), "--pythonpath", python, "--outputjson", *files]
                out = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=1800)
                diags = [replace(d, path=_inside(d.path, project)) for d in parse_pyright(out.stdout)]
            else:
                raise ValueError(f"the outside project is checked by {OUTSIDE_CHECKERS}, not {checker!r}")
            where = f"outside project, kvspec installed as a {form}"
            plugin = [d for d in diags if d.path == "acme/plugin.py"]
            problems += [f"{p} ({where})" for p in judge_accept("acme/plugin.py", checker, plugin).problems]
            caught = judge_reject(
                mistakes,
                checker,
                [d for d in diags if d.path == "acme/mistakes.py"],
                shown="acme/mistakes.py",
            )
            problems += [f"{p} ({where})" for p in caught.problems]
            problems += [
                f"{checker}: {d.path}:{d.line}: [{d.code}] {d.message} ({where})"
                for d in diags
                if d.severity == "error" and d.path not in files
            ]
    return problems


def _inside(path: str, project: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(project.resolve()))
    except ValueError:
        return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--only", default=",".join(CHECKER_NAMES), help="comma-separated checkers to run")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter whose packages (torch, kvspec) are checked against",
    )
    parser.add_argument(
        "--install",
        action="store_true",
        help="install each checker, pinned, in a virtualenv of its own first",
    )
    parser.add_argument(
        "--tool", action="append", default=[], metavar="CHECKER=PYTHON", help="use CHECKER as installed there"
    )
    parser.add_argument(
        "--outside",
        default=",".join(INSTALL_FORMS),
        help="install forms for the plugin project outside the checkout ('' to skip): "
        + ", ".join(INSTALL_FORMS),
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="also install kvspec with the default (import-hook) editable mode and require mypy to fail there",
    )
    parser.add_argument(
        "--npu-stubs",
        action="store_true",
        help="compare stubs/torch_npu with the pinned torch_npu release's sources (downloads its wheel)",
    )
    args = parser.parse_args(argv)
    only = [name for name in args.only.split(",") if name]
    unknown = set(only) - set(CHECKER_NAMES)
    if unknown:
        parser.error(f"unknown checker(s) {sorted(unknown)}; the checkers are {', '.join(CHECKER_NAMES)}")
    forms = [f for f in args.outside.split(",") if f]
    outside_checkers = [c for c in OUTSIDE_CHECKERS if c in only]
    tools = dict(t.split("=", 1) for t in args.tool)
    if args.install:
        tools = {**install([c for c in only if c not in tools]), **tools}
    env = Environment(python=args.python, tools=tools)
    verdicts = [check(name, env) for name in only]
    print(TABLE_HEADER)
    for verdict in verdicts:
        print(verdict.row())
    problems = [p for v in verdicts for p in v.problems]
    if forms and outside_checkers:
        print(f"\n| plugin project outside the checkout | {' | '.join(outside_checkers)} |")
        print("|---|" + "---|" * len(outside_checkers))
        for form in forms:
            cells = []
            for checker in outside_checkers:
                found = outside_project(env, form, [checker])
                problems += found
                cells.append(
                    "plugin clean, mistakes caught as marked"
                    if not found
                    else f"**{len(found)} difference(s)**"
                )
            print(f"| kvspec installed as a {form} | {' | '.join(cells)} |")
    if args.control and "mypy" in only:
        blind = outside_project(env, "hook", ["mypy"])
        seen = any("import-not-found" in p for p in blind)
        print(
            "\nControl, kvspec installed editable with setuptools' default import hook: mypy "
            + (
                "cannot see kvspec, as expected"
                if seen
                else "**saw kvspec: the outside check proves nothing**"
            )
        )
        if not seen:
            problems.append("control: mypy resolved kvspec through an import-hook editable install")
    if args.npu_stubs:
        found = check_npu_stubs()
        problems += found
        print(
            f"\nstubs/torch_npu against {pins()['torch-npu']}'s sources: "
            + (
                "every stubbed call has torch_npu's parameters"
                if not found
                else f"**{len(found)} difference(s)**"
            )
        )
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
