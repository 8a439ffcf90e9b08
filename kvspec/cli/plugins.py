"""Installed plugins for the commands: ``plan``, ``simulate`` and ``inspect`` load every ``kvspec.plugins``
entry point before they touch the registry (``KVSPEC_PLUGINS=a,b`` loads only those; ``--no-plugins``
none), so a layout naming a plugin's spec works without naming the plugin again."""

from __future__ import annotations

import argparse


def add_plugin_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-plugins",
        action="store_true",
        help="do not load installed kvspec.plugins entry points (default: all, or those KVSPEC_PLUGINS names)",
    )


def load_installed_plugins(args: argparse.Namespace) -> list[str]:
    """The entry points loaded into the default registry (after the built-ins); none with --no-plugins.
    A plugin that fails to load is a PluginError naming it (the registry keeps none of its registrations)."""
    if getattr(args, "no_plugins", False):
        return []
    from kvspec.registry.builtins import default_registry
    from kvspec.registry.plugins import load_plugins

    return load_plugins(default_registry)
