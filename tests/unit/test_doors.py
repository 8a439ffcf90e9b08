"""Checked public doors over compiled cores: one signature (held equal here), one docstring, on the door."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvspec
import kvspec.coordinator
import kvspec.planning
from kvspec.contracts.checking import CORE_ATTRIBUTE

ROOT = Path(kvspec.__file__).parent


def _source_tree(module: str) -> ast.Module:
    """The module's source (a compiled module's .py lies beside its extension)."""
    path = ROOT.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return ast.parse(path.read_text())


def _function(module: str, qualname: str) -> ast.FunctionDef:
    scope: list[ast.stmt] = _source_tree(module).body
    *outer, name = qualname.split(".")
    for part in outer:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == part).body
    return next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)


def _signature(fn: ast.FunctionDef) -> str:
    """Parameter names, kinds, annotations and defaults, as source text."""
    args = fn.args
    parts = [
        f"pos:{a.arg}:{ast.unparse(a.annotation) if a.annotation else ''}"
        for a in args.posonlyargs + args.args
    ]
    parts += [f"default:{ast.unparse(d)}" for d in args.defaults]
    parts += [f"kw:{a.arg}:{ast.unparse(a.annotation) if a.annotation else ''}" for a in args.kwonlyargs]
    parts += [f"kwdefault:{ast.unparse(d) if d else '-'}" for d in args.kw_defaults]
    parts.append(f"returns:{ast.unparse(fn.returns) if fn.returns else ''}")
    return "; ".join(parts)


def _doors() -> Iterator[tuple[str, object]]:
    for module in (kvspec.planning, kvspec.coordinator):
        for name, value in vars(module).items():
            if callable(value) and hasattr(value, CORE_ATTRIBUTE):
                yield f"{module.__name__}.{name}", value
            for member_name, member in vars(value).items() if isinstance(value, type) else ():
                if callable(member) and hasattr(member, CORE_ATTRIBUTE):
                    yield f"{module.__name__}.{name}.{member_name}", member


DOORS = dict(_doors())


def test_every_public_entry_point_over_a_core_is_a_door() -> None:
    assert sorted(DOORS) == [
        "kvspec.planning.add_kv_sharing_layers",
        "kvspec.planning.auto_fit_max_model_len",
        "kvspec.planning.get_kv_cache_config",
        "kvspec.planning.get_kv_cache_config_from_groups",
        "kvspec.planning.get_kv_cache_configs",
        "kvspec.planning.get_kv_cache_groups",
    ]


def _locate(obj: object) -> tuple[str, str]:
    # A compiled class's __init__ is a slot wrapper: its module is its class's.
    module = getattr(obj, "__module__", None) or getattr(
        getattr(obj, "__objclass__", None), "__module__", None
    )
    qualname = getattr(obj, "__qualname__", None)
    assert isinstance(module, str) and isinstance(qualname, str), obj
    return module, qualname


@pytest.mark.parametrize("door_name", sorted(DOORS))
def test_a_door_has_its_cores_signature_and_the_only_docstring(door_name: str) -> None:
    door = DOORS[door_name]
    door_module, door_qualname = _locate(getattr(door, "__wrapped__", door))
    core_module, core_qualname = _locate(getattr(door, CORE_ATTRIBUTE))
    assert core_module.rsplit(".", 1)[-1] == "_core" and core_module.rsplit(".", 1)[0] == door_module
    door_def = _function(door_module, door_qualname)
    core_def = _function(core_module, core_qualname)
    assert _signature(door_def) == _signature(core_def)
    assert ast.get_docstring(door_def), f"{door_name} has no docstring"
    assert ast.get_docstring(core_def) is None, f"{core_module}.{core_qualname} repeats the door's docstring"


def test_the_signature_comparison_can_fail() -> None:
    one = ast.parse("def f(a: int, *, b: str = 'x') -> int: ...").body[0]
    other = ast.parse("def f(a: int, *, b: str = 'y') -> int: ...").body[0]
    renamed = ast.parse("def f(a: int, *, c: str = 'x') -> int: ...").body[0]
    assert isinstance(one, ast.FunctionDef) and isinstance(other, ast.FunctionDef)
    assert isinstance(renamed, ast.FunctionDef)
    assert _signature(one) != _signature(other) and _signature(one) != _signature(renamed)


def test_doors_check_their_arguments() -> None:
    from kvspec.errors import KVSpecTypeError

    with pytest.raises(KVSpecTypeError):
        kvspec.planning.get_kv_cache_groups({"layer": object()})  # type: ignore[dict-item]
