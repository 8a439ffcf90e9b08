"""Terminal output for the CLI: rich when it is installed (the ``cli`` extra), plain text otherwise.

``pip install kvspec`` without extras must still run every command; only the look changes.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence

_MARKUP = re.compile(r"\[/?(?:bold|red|green|yellow|dim)\]")


def has_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def styled() -> bool:
    """Rich output only to a terminal: piped or redirected output is plain text, never cut to a width."""
    return has_rich() and sys.stdout.isatty()


def shows_progress() -> bool:
    """A progress bar only where a person watches it (rich installed, stderr a terminal)."""
    return has_rich() and sys.stderr.isatty()


def format_value(value: object) -> str:
    """A report value as a person reads it: lists joined, floats without noise, no Python reprs."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, float):
        return (
            f"{value:,.4f}".rstrip("0").rstrip(".")
            if value != int(value) or abs(value) < 1
            else f"{value:,.1f}"
        )
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list | tuple):
        return ", ".join(format_value(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} {format_value(v)}" for k, v in value.items()) or "-"
    return str(value)


def print_report(report: dict[str, object], *, skip: Sequence[str] = ()) -> None:
    """``key value`` lines (keys with spaces for underscores), values by :func:`format_value`; ``notes``
    last, one line each."""
    for key, value in report.items():
        if key in skip or key == "notes":
            continue
        print(f"{key.replace('_', ' '):36s} {format_value(value)}")
    notes = report.get("notes")
    if isinstance(notes, list):
        for note in notes:
            print(f"note: {note}")


def plain(text: str) -> str:
    """``text`` without rich's markup tags."""
    return _MARKUP.sub("", text)


def print_line(text: str) -> None:
    """One line; ``[bold]``/``[red]`` markup is rendered by rich (to a terminal) or dropped."""
    if styled():
        from rich.console import Console

        Console(highlight=False).print(text)
    else:
        print(plain(text))


def print_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], *, left: Sequence[str] = ()
) -> None:
    """A table with a title; columns named in ``left`` are left-aligned, the rest right-aligned (rich to a
    terminal; plain, full-width text otherwise)."""
    if styled():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, title_justify="left")
        for col in columns:
            table.add_column(col, justify="left" if col in left else "right")
        for row in rows:
            table.add_row(*row)
        Console(highlight=False).print(table)
        return
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(w) if col in left else cell.rjust(w) for cell, w, col in zip(cells, widths, columns)
        )

    out = sys.stdout
    out.write(title + "\n" + fmt(columns) + "\n" + "  ".join("-" * w for w in widths) + "\n")
    for row in rows:
        out.write(fmt(row) + "\n")
