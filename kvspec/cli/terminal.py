"""Terminal output for the CLI: rich when it is installed (the ``cli`` extra), plain text otherwise.

``pip install kvspec`` without extras must still run every command; only the look changes.
"""

from __future__ import annotations

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


def plain(text: str) -> str:
    """``text`` without rich's markup tags."""
    return _MARKUP.sub("", text)


def print_line(text: str) -> None:
    """One line; ``[bold]``/``[red]`` markup is rendered by rich or dropped."""
    if has_rich():
        from rich.console import Console

        Console(highlight=False).print(text)
    else:
        print(plain(text))


def print_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], *, left: Sequence[str] = ()
) -> None:
    """A table with a title; columns named in ``left`` are left-aligned, the rest right-aligned."""
    if has_rich():
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
