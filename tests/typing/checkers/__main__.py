"""``python -m tests.typing.checkers``: the table of docs/PLUGINS.md section 9 (see the package docstring)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tests.typing.checkers.npu_stubs import check_npu_stubs
from tests.typing.checkers.outside import FORM_LABELS, INSTALL_FORMS, OUTSIDE_CHECKERS, outside_project
from tests.typing.checkers.pins import CHECKER_NAMES, install, pins
from tests.typing.checkers.runners import Environment
from tests.typing.checkers.verdicts import TABLE_HEADER, check


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
            print(f"| {FORM_LABELS[form]} | {' | '.join(cells)} |")
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
