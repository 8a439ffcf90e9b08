"""mypy accepts every plugin-author file in tests/typing/ and rejects each mistake in tests/typing/reject/.

One ``python -m mypy`` subprocess checks every file (mypy's cache makes it ~1 s warm, ~30 s cold).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TYPING = ROOT / "tests" / "typing"
MARKER = re.compile(r"#\s*E:\s*\[(?P<code>[a-z-]+)\]\s*(?P<fragment>.*?)\s*(?:#\s*N:\s*(?P<note>.*))?$")
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*)\s+\[(?P<code>[a-z-]+)\]$")
NOTE = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): note: (?P<message>.*)$")


def _expected(path: Path) -> dict[int, tuple[str, str, str | None]]:
    """line -> (error code, fragment of the error message, fragment of a note on that line or None)."""
    out: dict[int, tuple[str, str, str | None]] = {}
    for lineno, text in enumerate(path.read_text().splitlines(), start=1):
        match = MARKER.search(text)
        if match:
            note = match["note"].strip() if match["note"] else None
            out[lineno] = (match["code"], match["fragment"].strip(), note)
    return out


def _notes(stdout: str) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = {}
    for line in stdout.splitlines():
        match = NOTE.match(line)
        if match:
            out.setdefault((Path(match["path"]).name, int(match["line"])), []).append(
                match["message"].strip()
            )
    return out


@pytest.fixture(scope="module")
def mypy_errors() -> dict[str, list[tuple[int, str, str]]]:
    files = sorted(TYPING.glob("accept_*.py")) + sorted((TYPING / "reject").glob("reject_*.py"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "mypy.ini"),
            "--no-pretty",
            "--show-error-codes",
            "--no-error-summary",
            *[str(f.relative_to(ROOT)) for f in files],
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    errors: dict[str, list[tuple[int, str, str]]] = {f.name: [] for f in files}
    for line in proc.stdout.splitlines():
        match = ERROR.match(line)
        if match:
            errors.setdefault(Path(match["path"]).name, []).append(
                (int(match["line"]), match["code"], match["message"])
            )
        elif ": error:" in line:
            raise AssertionError(f"unparsed mypy error: {line}")
    assert proc.returncode in (0, 1), proc.stderr
    NOTES.clear()
    NOTES.update(_notes(proc.stdout))
    return errors


#: (file name, line) -> mypy's notes there, filled by the mypy_errors fixture.
NOTES: dict[tuple[str, int], list[str]] = {}


@pytest.mark.parametrize("name", sorted(p.name for p in TYPING.glob("accept_*.py")))
def test_accept_files_type_check(name: str, mypy_errors: dict[str, list[tuple[int, str, str]]]) -> None:
    assert mypy_errors[name] == []


@pytest.mark.parametrize("name", sorted(p.name for p in (TYPING / "reject").glob("reject_*.py")))
def test_reject_files_fail_where_marked(
    name: str, mypy_errors: dict[str, list[tuple[int, str, str]]]
) -> None:
    expected = _expected(TYPING / "reject" / name)
    assert expected, f"{name} marks no expected error"
    got = mypy_errors[name]
    for lineno, (code, fragment, note) in expected.items():
        here = [(c, m) for ln, c, m in got if ln == lineno]
        assert any(c == code and fragment in m for c, m in here), (
            f"{name}:{lineno}: expected [{code}] containing {fragment!r}, mypy said {here}"
        )
        if note is not None:
            notes = NOTES.get((name, lineno), [])
            assert any(note == n or n.endswith(f" {note}") or note in n for n in notes), (
                f"{name}:{lineno}: expected a note naming {note!r}, mypy's notes: {notes}"
            )
    unexpected = [e for e in got if e[0] not in expected]
    assert not unexpected, f"{name}: errors on unmarked lines: {unexpected}"


def test_every_protocol_member_has_a_reject_case() -> None:
    """Each KVCacheSpec and KVCacheManager member has a generated case whose mypy note names it; so
    deleting a member from a protocol makes that case pass mypy, and test_reject_files_fail_where_marked fail."""
    import typing_extensions

    from kvspec import KVCacheManager, KVCacheSpec

    for proto, file in (
        (KVCacheSpec, "reject_spec_members.py"),
        (KVCacheManager, "reject_manager_members.py"),
    ):
        marked = {n for _, _, n in _expected(TYPING / "reject" / file).values() if n}
        assert marked == set(typing_extensions.get_protocol_members(proto)) - {"__init__"}, file


def test_generated_reject_files_are_current() -> None:
    from tests.typing.generate_member_rejects import manager_file, spec_file

    assert (TYPING / "reject" / "reject_spec_members.py").read_text() == spec_file()
    assert (TYPING / "reject" / "reject_manager_members.py").read_text() == manager_file()
