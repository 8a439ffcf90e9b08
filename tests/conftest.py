"""Test configuration: every kvspec boundary and hot-path method is type-checked by beartype."""

from __future__ import annotations

import os

os.environ.setdefault("KVSPEC_TYPECHECK", "full")

from collections.abc import Iterator

import pytest

from kvspec.registry.builtins import default_registry


@pytest.fixture(autouse=True)
def _restore_default_registry() -> Iterator[None]:
    """Registrations a test makes (from any thread) never leak into the next test."""
    with default_registry.isolated(all_threads=True):
        yield
