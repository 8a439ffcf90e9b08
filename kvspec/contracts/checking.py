"""Runtime type checking with beartype, switched by ``KVSPEC_TYPECHECK`` (off | api | full).

``check_api`` guards cold public boundaries (registry, planner, spec construction); it is on by default.
``check_hot`` guards per-step methods (allocate_slots, free, block-table rows); it is on only in ``full``
mode, which the test suite uses, so production pays nothing in the scheduler's hot path.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from beartype import BeartypeConf, BeartypeStrategy, FrozenDict, beartype

from kvspec.contracts.spec import KVCacheSpec, _KVCacheSpecCallables
from kvspec.errors import KVSpecTypeError, UnsupportedConfigurationError

MODES = ("off", "api", "full")


def typecheck_mode(value: str | None) -> str:
    """The mode ``KVSPEC_TYPECHECK=value`` selects (unset or empty: "api"); anything else is an error."""
    mode = (value or "").strip().lower() or "api"
    if mode not in MODES:
        raise UnsupportedConfigurationError(
            f"KVSPEC_TYPECHECK={value!r} is not a mode; use one of {', '.join(MODES)} "
            "(off: no runtime checks, api: public boundaries, full: also per-step methods)."
        )
    return mode


MODE = typecheck_mode(os.environ.get("KVSPEC_TYPECHECK"))

_ON = BeartypeConf(
    is_color=False,
    violation_type=KVSpecTypeError,
    hint_overrides=FrozenDict({KVCacheSpec: _KVCacheSpecCallables}),
)
_OFF = BeartypeConf(strategy=BeartypeStrategy.O0)

_C = TypeVar("_C", bound=type)
_F = TypeVar("_F", bound=Callable[..., Any])

_API = beartype(conf=_OFF if MODE == "off" else _ON)
_HOT = beartype(conf=_ON if MODE == "full" else _OFF)


def check_api(func: _F) -> _F:
    """beartype at a cold public boundary (on unless ``KVSPEC_TYPECHECK=off``). A typed function rather than
    beartype's decorator object, so that every checker and mypy release keeps the decorated signature."""
    checked: _F = _API(func)
    return checked


def check_hot(func: _F) -> _F:
    """beartype on a per-step method (on only when ``KVSPEC_TYPECHECK=full``)."""
    checked: _F = _HOT(func)
    return checked


#: The attribute a checked door carries: the core function it opens onto.
CORE_ATTRIBUTE = "__kvspec_core__"


def check_door(core: Callable[..., Any]) -> Callable[[_F], _F]:
    """Decorate a checked public entry point (a door) over a core function with the same signature.

    The core may be compiled (mypyc), and beartype cannot wrap a compiled function, so the door is plain
    Python whose arguments ``check_api`` checks; it calls the core. The door carries the one docstring and
    names its core (``__kvspec_core__``) so that ``tests/unit/test_doors.py`` can hold the two
    signatures equal.
    """

    def decorate(door: _F) -> _F:
        checked = check_api(door)
        setattr(checked, CORE_ATTRIBUTE, core)
        return checked

    return decorate


def check_construction(cls: _C) -> _C:
    """Type-check a dataclass's constructor only.

    Spec properties (page sizes) run in planning loops, so unlike ``check_api`` on a class this leaves
    every other method unwrapped.
    """
    checked = check_api(vars(cls)["__init__"])
    checked.__kvspec_checked__ = True
    setattr(cls, "__init__", checked)  # noqa: B010 (mypy rejects the attribute form)
    return cls


def check_plugin_constructor(spec_cls: type) -> None:
    """Type-check a registered dataclass spec's constructor like the built-ins' (once per class).

    Only the class's own generated ``__init__`` is wrapped; a class without one inherits a checked one.
    """
    if MODE == "off" or not dataclasses.is_dataclass(spec_cls):
        return
    init = vars(spec_cls).get("__init__")
    if init is None or getattr(init, "__kvspec_checked__", False):
        return
    module = sys.modules.get(spec_cls.__module__)
    try:
        # beartype resolves string annotations at call time; one it cannot resolve (a name imported only
        # under TYPE_CHECKING) would fail every construction, so such a constructor is left unchecked.
        typing.get_type_hints(init, globalns=vars(module) if module else None)
        checked = check_api(init)
    except Exception:
        return
    checked.__kvspec_checked__ = True
    setattr(spec_cls, "__init__", checked)  # noqa: B010
