from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvspec.fleet import registry


@pytest.fixture(autouse=True)
def _restore_routers() -> Iterator[None]:
    saved = registry.snapshot()
    yield
    registry.restore(saved)
