"""The ``kvspec`` command (``plan``, ``inspect``, ``simulate``); ``main`` is the console entry point.

Only light modules load before a command runs: ``kvspec --help`` imports no torch.
"""

from kvspec.cli.main import main

__all__ = ["main"]
