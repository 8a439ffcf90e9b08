"""matplotlib for the commands' ``--plot``: loaded on demand (the extra ``kvspec[cli]``), figures saved once."""

from __future__ import annotations

import sys
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


__all__ = ["pyplot", "save_figure"]
