"""Every type checker a plugin author runs, over everything a plugin author writes against kvspec.

``python -m tests.typing.checkers`` runs each checker over ``tests/typing`` (files that must be accepted,
and files whose marked lines must be rejected), ``examples/`` and README's plugin (which is
``tests/typing/accept_readme_example.py``), and prints one row per checker: accept files clean, reject
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

from tests.typing.checkers.diagnostics import Diagnostic, parse_mypy, parse_pyrefly, parse_pyright, parse_ty
from tests.typing.checkers.markers import (
    EQUIVALENT_CODES,
    MYPY_LIKE,
    Expectation,
    expectations,
    statement_spans,
)
from tests.typing.checkers.npu_stubs import check_npu_stubs, npu_stub_problems
from tests.typing.checkers.outside import INSTALL_FORMS, outside_project
from tests.typing.checkers.pins import CACHE, CHECKER_NAMES, ROOT, TYPING, install, mypy_floor, pins
from tests.typing.checkers.runners import RUNNERS, Environment
from tests.typing.checkers.verdicts import (
    CheckerVerdict,
    FileVerdict,
    check,
    judge_accept,
    judge_reject,
    mypy_ini_files,
    plugin_files,
)

__all__ = [
    "CACHE",
    "CHECKER_NAMES",
    "EQUIVALENT_CODES",
    "INSTALL_FORMS",
    "MYPY_LIKE",
    "ROOT",
    "RUNNERS",
    "TYPING",
    "CheckerVerdict",
    "Diagnostic",
    "Environment",
    "Expectation",
    "FileVerdict",
    "check",
    "check_npu_stubs",
    "expectations",
    "install",
    "judge_accept",
    "judge_reject",
    "mypy_floor",
    "mypy_ini_files",
    "npu_stub_problems",
    "outside_project",
    "parse_mypy",
    "parse_pyrefly",
    "parse_pyright",
    "parse_ty",
    "pins",
    "plugin_files",
    "statement_spans",
]
