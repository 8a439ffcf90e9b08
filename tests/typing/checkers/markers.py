"""What a reject file expects: its markers (see ``tests.typing.checkers``), each with the statement it stands for."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from tests.typing.checkers.pins import CHECKER_NAMES

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
    "assignment": frozenset({"reportAssignmentType"}),
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
        "assignment": frozenset({"bad-assignment"}),
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
        "assignment": frozenset({"invalid-assignment"}),
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
