"""mypy accepts every plugin-author file in tests/typing/ and examples/, and rejects each mistake in
tests/typing/reject/ where it is marked, with the code, message and note written there.

One ``python -m mypy`` subprocess checks every file (tests/typing/checkers.py, which runs the other checkers
too in ``nox -s typecheckers``); mypy's cache makes it ~1 s warm, ~30 s cold. Also here: what keeps the
sources portable across checkers (no checker-specific ignores in kvspec/, stubs/ typing only what kvspec
calls).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from tests.typing import checkers
from tests.typing.checkers import CheckerVerdict, Environment, expectations

ROOT = Path(__file__).resolve().parents[2]
TYPING = ROOT / "tests" / "typing"


@pytest.fixture(scope="module")
def mypy_verdict() -> CheckerVerdict:
    return checkers.check("mypy", Environment(python=sys.executable))


def _verdict_of(verdict: CheckerVerdict, name: str) -> checkers.FileVerdict:
    (found,) = [v for v in (*verdict.accept, *verdict.reject, *verdict.examples) if Path(v.path).name == name]
    return found


@pytest.mark.parametrize("name", sorted(p.name for p in TYPING.glob("accept_*.py")))
def test_accept_files_type_check(name: str, mypy_verdict: CheckerVerdict) -> None:
    assert _verdict_of(mypy_verdict, name).problems == ()


@pytest.mark.parametrize("name", sorted(p.name for p in (TYPING / "reject").glob("reject_*.py")))
def test_reject_files_fail_where_marked(name: str, mypy_verdict: CheckerVerdict) -> None:
    verdict = _verdict_of(mypy_verdict, name)
    assert verdict.marked > 0, f"{name} marks no expected error"
    assert verdict.problems == ()
    assert verdict.caught == verdict.marked


def test_examples_and_kvspec_itself_type_check(mypy_verdict: CheckerVerdict) -> None:
    assert [p for v in mypy_verdict.examples for p in v.problems] == []
    assert mypy_verdict.elsewhere == ()


def test_every_protocol_member_has_a_reject_case() -> None:
    """Each KVCacheSpec and KVCacheManager member has a generated case whose mypy note names it; so
    deleting a member from a protocol makes that case pass mypy, and test_reject_files_fail_where_marked fail."""
    import typing_extensions

    from kvspec import KVCacheManager, KVCacheSpec

    for proto, file in (
        (KVCacheSpec, "reject_spec_members.py"),
        (KVCacheManager, "reject_manager_members.py"),
    ):
        marked = {m.note for m in expectations(TYPING / "reject" / file) if m.note}
        assert marked == set(typing_extensions.get_protocol_members(proto)) - {"__init__"}, file


def test_generated_reject_files_are_current() -> None:
    from tests.typing.generate_member_rejects import manager_file, spec_file

    assert (TYPING / "reject" / "reject_spec_members.py").read_text() == spec_file()
    assert (TYPING / "reject" / "reject_manager_members.py").read_text() == manager_file()


def test_kvspec_carries_no_checker_specific_ignore() -> None:
    """A ``# type: ignore[code]`` means something else to each checker and release (ty and basedpyright skip
    it, codes differ between mypy releases and zuban): kvspec's sources type-check without one, through
    casts, typed helpers and narrowing."""
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "kvspec").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"#\s*(type|pyright|pyrefly|ty):\s*ignore", line)
    ]
    assert found == []


def _torch_npu_calls() -> set[str]:
    """The ``torch_npu.X.Y`` attributes kvspec's sources use."""
    used: set[str] = set()
    for path in (ROOT / "kvspec").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                parts: list[str] = [node.attr]
                value: ast.expr = node.value
                while isinstance(value, ast.Attribute):
                    parts.append(value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id == "torch_npu" and len(parts) >= 2:
                    used.add(".".join(reversed(parts[:2])))
    return used


def _stub_names() -> set[str]:
    tree = ast.parse((ROOT / "stubs" / "torch_npu" / "npu" / "__init__.pyi").read_text())
    top = ast.parse((ROOT / "stubs" / "torch_npu" / "__init__.pyi").read_text())
    reexports = {a.asname or a.name for n in top.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert reexports == {"npu"}, "stubs/torch_npu/__init__.pyi types only the npu submodule kvspec calls"
    return {f"npu.{n.name}" for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_the_torch_npu_stubs_type_exactly_what_kvspec_calls() -> None:
    """stubs/torch_npu claims nothing beyond kvspec's own calls (a stub nobody calls is checked against
    nothing), and covers every one of them (the NPU backend imports torch_npu by a plain import statement,
    so each checker checks those calls against the stubs)."""
    calls = _torch_npu_calls()
    assert calls == {"npu.is_available", "npu.synchronize"}
    assert _stub_names() == calls
