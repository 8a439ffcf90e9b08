"""The public API is declared once (kvspec._API); __all__ and the type checkers' imports follow it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import kvspec
import kvspec.errors

INIT = Path(kvspec.__file__)


def _type_checking_imports() -> dict[str, set[str]]:
    tree = ast.parse(INIT.read_text())
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module:
                    for alias in stmt.names:
                        # "X as X": an explicit re-export for type checkers.
                        assert alias.asname == alias.name, f"{alias.name} must be imported as itself"
                        out.setdefault(stmt.module, set()).add(alias.name)
    return out


def test_type_checking_imports_equal_the_declaration() -> None:
    declared = {module: set(names) for module, names in kvspec._API.items()}
    assert _type_checking_imports() == declared


def test_all_and_the_lazy_table_follow_the_declaration() -> None:
    names = [n for names in kvspec._API.values() for n in names]
    assert len(names) == len(set(names)), "a name is declared twice"
    assert kvspec.__all__ == sorted(names)
    assert kvspec._EXPORTS == {n: m for m, ns in kvspec._API.items() for n in ns}


def test_every_public_name_resolves_to_its_modules_object() -> None:
    import importlib

    for name, module in kvspec._EXPORTS.items():
        assert getattr(kvspec, name) is getattr(importlib.import_module(module), name), name


def test_only_the_base_exceptions_are_top_level() -> None:
    exceptions = {
        n
        for n in kvspec.__all__
        if isinstance(getattr(kvspec, n), type) and issubclass(getattr(kvspec, n), Exception)
    }
    assert exceptions == {
        "CapacityError",
        "InvariantError",
        "KVSpecError",
        "PlanningError",
        "PluginError",
        "RegistrationError",
        "SchedulingError",
        "SpecValidationError",
        "UnsupportedConfigurationError",
    }
    # Every exception kvspec defines lives in kvspec.errors and derives from KVSpecError.
    for value in vars(kvspec.errors).values():
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == "kvspec.errors":
            assert issubclass(value, kvspec.KVSpecError), value


def test_no_exception_class_is_defined_outside_errors() -> None:
    root = INIT.parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "errors.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                ast.unparse(b).endswith(("Error", "Exception")) for b in node.bases
            ):
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    assert found == []


def test_an_unknown_name_fails_for_users_and_type_checkers() -> None:
    code = "import kvspec\ntry:\n    kvspec.NoSuchName\nexcept AttributeError as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "module 'kvspec' has no attribute 'NoSuchName'"
    assert "__getattr__" not in {
        n.name for n in ast.parse(INIT.read_text()).body if isinstance(n, ast.FunctionDef)
    }, "a module-level __getattr__ visible to mypy would make every name Any"
