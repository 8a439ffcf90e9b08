"""The multi-checker harness (tests/typing/checkers.py) judges what it is given: its markers, statement spans,
verdicts and output parsers, without running any checker; and the checker pins agree with pyproject."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.typing import checkers
from tests.typing.checkers import Diagnostic, expectations, judge_accept, judge_reject, statement_spans

REJECT = """\
from kvspec import FullAttentionManager, default_registry, register_kv_cache_spec


@register_kv_cache_spec(FullAttentionManager)
class NotASpec:  # E: [type-var] cannot be "NotASpec"  # pyrefly: missed: no class decorators
    block_size: int = 16


default_registry.register(  # E: [arg-type] expected "type[KVCacheSpec]"  # N: page_size_bytes  # ty: [other-code]
    NotASpec, FullAttentionManager
)
"""


@pytest.fixture
def reject_file(tmp_path: Path) -> Path:
    path = tmp_path / "reject_sample.py"
    path.write_text(REJECT)
    return path


def err(line: int, code: str, message: str = "", path: str = "x.py") -> Diagnostic:
    return Diagnostic(path=path, line=line, code=code, message=message, severity="error")


def test_markers_read_codes_notes_deviations_and_statement_spans(reject_file: Path) -> None:
    first, second = expectations(reject_file)
    assert (first.line, first.span, first.code, first.fragment) == (
        5,
        (4, 5),
        "type-var",
        'cannot be "NotASpec"',
    )
    assert first.missed == {"pyrefly": "no class decorators"} and first.codes == {}
    assert (second.line, second.span, second.code, second.note) == (9, (9, 11), "arg-type", "page_size_bytes")
    assert second.codes == {"ty": "other-code"}
    assert second.wanted("ty") == (frozenset({"other-code"}), "")
    assert second.wanted("mypy") == (frozenset({"arg-type"}), 'expected "type[KVCacheSpec]"')
    assert second.wanted("pyright") == (frozenset({"reportArgumentType"}), "")


def test_an_unknown_checker_or_expectation_in_a_marker_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "reject_bad.py"
    bad.write_text("x: int = 'a'  # E: [assignment] str  # pyrite: missed: typo\n")
    with pytest.raises(ValueError, match="pyrite"):
        expectations(bad)
    bad.write_text("x: int = 'a'  # E: [assignment] str  # ty: sometimes\n")
    with pytest.raises(ValueError, match="cannot read the 'ty' expectation"):
        expectations(bad)


def test_statement_spans_cover_decorators_and_multi_line_calls() -> None:
    spans = statement_spans(REJECT)
    assert (4, 5) in spans  # decorator through the class line
    assert (9, 11) in spans  # the whole call
    assert (6, 6) in spans  # the class body's field


def test_a_mistake_reported_anywhere_in_its_statement_is_caught(reject_file: Path) -> None:
    # mypy names the class line, pyright the decorator line: both are the marked statement.
    mypy = [
        err(5, "type-var", 'Value of type variable "SpecT" cannot be "NotASpec"'),
        err(9, "arg-type", 'incompatible type; expected "type[KVCacheSpec]"'),
        Diagnostic(path="x.py", line=10, code="", message='"page_size_bytes" is missing', severity="note"),
    ]
    verdict = judge_reject(reject_file, "mypy", mypy, shown="x.py")
    assert verdict.problems == () and (verdict.caught, verdict.marked, verdict.missed) == (2, 2, 0)
    pyright = [
        err(4, "reportArgumentType"),
        err(10, "reportArgumentType"),
        err(4, "reportUntypedClassDecorator"),
    ]
    assert judge_reject(reject_file, "pyright", pyright, shown="x.py").problems == ()


def test_a_wrong_code_a_missing_note_or_a_stray_error_is_a_difference(reject_file: Path) -> None:
    wrong_code = [err(5, "misc", 'cannot be "NotASpec"'), err(9, "arg-type", 'expected "type[KVCacheSpec]"')]
    problems = judge_reject(reject_file, "mypy", wrong_code, shown="x.py").problems
    assert len(problems) == 2  # the wrong code, and the arg-type line's missing note
    assert "x.py:5: expected an error coded ['type-var']" in problems[0]
    assert "with a note naming 'page_size_bytes'" in problems[1]
    stray = [err(4, "reportArgumentType"), err(9, "reportArgumentType"), err(6, "reportGeneralTypeIssues")]
    (problem,) = judge_reject(reject_file, "pyright", stray, shown="x.py").problems
    assert "x.py:6: error outside the marked lines" in problem
    silent = judge_reject(reject_file, "basedpyright", [err(9, "reportArgumentType")], shown="x.py")
    assert silent.caught == 1 and len(silent.problems) == 1


def test_a_documented_miss_must_stay_silent(reject_file: Path) -> None:
    missed = judge_reject(reject_file, "pyrefly", [err(9, "bad-argument-type")], shown="x.py")
    assert missed.problems == () and (missed.caught, missed.missed) == (1, 1)
    # A release that starts catching it is noticed, so that the doc's "cannot express" is kept true.
    both = [err(5, "bad-argument-type"), err(9, "bad-argument-type")]
    caught = judge_reject(reject_file, "pyrefly", both, shown="x.py")
    (problem,) = caught.problems
    assert "documented as missed (no class decorators) but reported" in problem


def test_the_deviation_code_replaces_the_table(reject_file: Path) -> None:
    assert (
        judge_reject(reject_file, "ty", [err(5, "invalid-argument-type"), err(9, "other-code")]).problems
        == ()
    )
    (problem,) = judge_reject(
        reject_file, "ty", [err(5, "invalid-argument-type"), err(9, "invalid-argument-type")]
    ).problems
    assert "['other-code']" in problem


def test_an_accept_file_is_clean_only_without_errors() -> None:
    assert judge_accept("a.py", "ty", []).problems == ()
    note = Diagnostic(path="a.py", line=1, code="", message="revealed", severity="note")
    assert judge_accept("a.py", "ty", [note]).problems == ()
    (problem,) = judge_accept("a.py", "ty", [err(3, "invalid-assignment", "no")]).problems
    assert problem == "ty: a.py:3: [invalid-assignment] no"


def test_parsers_read_each_checkers_output() -> None:
    mypy = checkers.parse_mypy(
        'tests/typing/x.py:4: error: Bad thing  [arg-type]\ntests/typing/x.py:4: note: "m" is missing\n'
        "Success: no issues found\n"
    )
    assert [(d.path, d.line, d.code, d.severity) for d in mypy] == [
        ("tests/typing/x.py", 4, "arg-type", "error"),
        ("tests/typing/x.py", 4, "", "note"),
    ]
    with pytest.raises(ValueError, match="unparsed"):
        checkers.parse_mypy("x.py: error: no line number\n")
    pyright = {
        "generalDiagnostics": [
            {
                "file": str(checkers.ROOT / "tests/typing/x.py"),
                "severity": "error",
                "message": "m",
                "range": {"start": {"line": 9, "character": 0}},
                "rule": "reportArgumentType",
            },
            {
                "file": "/elsewhere/y.py",
                "severity": "warning",
                "message": "w",
                "range": {"start": {"line": 0}},
            },
        ]
    }
    got = checkers.parse_pyright(json.dumps(pyright))
    assert [(d.path, d.line, d.code, d.severity) for d in got] == [
        ("tests/typing/x.py", 10, "reportArgumentType", "error"),
        ("/elsewhere/y.py", 1, "", "note"),
    ]
    pyrefly = {"errors": [{"path": "tests/typing/x.py", "line": 3, "name": "bad-return", "description": "d"}]}
    assert [(d.line, d.code) for d in checkers.parse_pyrefly(json.dumps(pyrefly))] == [(3, "bad-return")]
    ty = checkers.parse_ty("tests/typing/x.py:7:1: error[invalid-argument-type] Argument is wrong\nFound 1\n")
    assert [(d.path, d.line, d.code, d.message) for d in ty] == [
        ("tests/typing/x.py", 7, "invalid-argument-type", "Argument is wrong")
    ]


def test_every_checker_is_pinned_and_the_floor_is_pyprojects() -> None:
    pins = checkers.pins()
    assert set(pins) == {*checkers.CHECKER_NAMES, "torch-npu"}
    assert all(re.fullmatch(r"[a-z-]+(\[nodejs\])?==\d+\.\d+(\.\d+)?", p) for p in pins.values()), pins
    text = (checkers.ROOT / "pyproject.toml").read_text()
    assert f'"mypy>={checkers.mypy_floor()}"' in text
    assert pins["mypy-floor"] == f"mypy=={checkers.mypy_floor()}"


def test_every_reject_file_marks_what_it_rejects() -> None:
    for path in sorted((checkers.TYPING / "reject").glob("reject_*.py")):
        marks = expectations(path)
        assert marks, f"{path.name} marks nothing"
        for mark in marks:
            for checker in checkers.CHECKER_NAMES:
                codes, _ = mark.wanted(checker)
                assert codes or checker in mark.missed, (
                    f"{path.name}:{mark.line}: no {checker} code for {mark.code}"
                )


def test_the_npu_stubs_are_compared_with_torch_npus_own_signatures(tmp_path: Path) -> None:
    """A fake torch_npu package: the stubs agree with it as written, and a changed parameter is a difference."""
    npu = tmp_path / "torch_npu" / "npu"
    npu.mkdir(parents=True)
    (npu / "utils.py").write_text("def synchronize(device=None):\n    pass\n")
    (npu / "__init__.py").write_text(
        "from .utils import (synchronize, set_device)\n\ndef is_available():\n    return False\n"
    )
    assert checkers.npu_stub_problems(tmp_path) == []
    (npu / "utils.py").write_text("def synchronize(device):\n    pass\n")
    (problem,) = checkers.npu_stub_problems(tmp_path)
    assert "npu.synchronize[('device', True)] but torch_npu defines [('device', False)]" in problem
    (npu / "__init__.py").write_text("from .utils import synchronize\n")
    assert (
        checkers.npu_stub_problems(tmp_path)[0]
        == "stubs/torch_npu: torch_npu.npu has no function 'is_available'"
    )
