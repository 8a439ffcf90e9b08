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
MARKER = re.compile(r"#\s*E:\s*\[(?P<code>[a-z-]+)\]\s*(?P<fragment>.*)$")
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*)\s+\[(?P<code>[a-z-]+)\]$")


def _expected(path: Path) -> dict[int, tuple[str, str]]:
    out: dict[int, tuple[str, str]] = {}
    for lineno, text in enumerate(path.read_text().splitlines(), start=1):
        match = MARKER.search(text)
        if match:
            out[lineno] = (match["code"], match["fragment"].strip())
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
    return errors


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
    for lineno, (code, fragment) in expected.items():
        here = [(c, m) for ln, c, m in got if ln == lineno]
        assert any(c == code and fragment in m for c, m in here), (
            f"{name}:{lineno}: expected [{code}] containing {fragment!r}, mypy said {here}"
        )
    unexpected = [e for e in got if e[0] not in expected]
    assert not unexpected, f"{name}: errors on unmarked lines: {unexpected}"
