"""Runtime type checking with beartype, switched by ``KVSPEC_TYPECHECK`` (off | api | full).

``check_api`` guards cold public boundaries (registry, planner, spec construction); it is on by default.
``check_hot`` guards per-step methods (allocate_slots, free, block-table rows); it is on only in ``full``
mode, which the test suite uses, so production pays nothing in the scheduler's hot path.
"""

from __future__ import annotations

import os
from typing import TypeVar

from beartype import BeartypeConf, BeartypeStrategy, FrozenDict, beartype

from kvspec.errors import KVSpecTypeError
from kvspec.protocols import KVCacheSpec, _KVCacheSpecCallables

MODE = os.environ.get("KVSPEC_TYPECHECK", "api").strip().lower() or "api"
if MODE not in ("off", "api", "full"):
    MODE = "api"

_ON = BeartypeConf(
    is_color=False,
    violation_type=KVSpecTypeError,
    hint_overrides=FrozenDict({KVCacheSpec: _KVCacheSpecCallables}),
)
_OFF = BeartypeConf(strategy=BeartypeStrategy.O0)

check_api = beartype(conf=_OFF if MODE == "off" else _ON)
check_hot = beartype(conf=_ON if MODE == "full" else _OFF)


_C = TypeVar("_C", bound=type)


def check_construction(cls: _C) -> _C:
    """Type-check a dataclass's constructor only.

    Spec properties (page sizes) run in planning loops, so unlike ``check_api`` on a class this leaves
    every other method unwrapped.
    """
    setattr(cls, "__init__", check_api(vars(cls)["__init__"]))  # noqa: B010 (mypy rejects the attribute form)
    return cls
