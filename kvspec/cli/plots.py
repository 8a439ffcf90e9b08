"""matplotlib for the commands' ``--plot``: loaded on demand (the extra ``kvspec[cli]``), figures saved once."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend; without matplotlib, say which extra to install (exit 2)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("kvspec: error: --plot needs matplotlib: pip install 'kvspec[cli]'", file=sys.stderr)
        raise SystemExit(2) from None
    return plt


def save_figure(fig: Any, path: str) -> None:
    """Write ``fig`` to ``path`` (PNG at 120 dpi, or the format the suffix names) and release it."""
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def write_plot(args: argparse.Namespace, draw: Callable[[str], None]) -> None:
    """A command's ``--plot``: ``draw`` to the path asked for, then say where (not when stdout is ``--json``)."""
    if args.plot:
        draw(args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")


__all__ = ["pyplot", "save_figure", "write_plot"]
