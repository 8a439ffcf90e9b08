"""The house rules, checked on the source: behaviour comes from declared traits, and imports flow one way."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import kvspec
import kvspec.specs

ROOT = Path(kvspec.__file__).parent

#: Built-in spec classes (everything exported by kvspec.specs that is a class with a block_size).
BUILTIN_SPEC_NAMES = frozenset(
    name
    for name in dir(kvspec.specs)
    if isinstance(getattr(kvspec.specs, name), type)
    and hasattr(getattr(kvspec.specs, name), "page_size_bytes")
)
#: The group container may be tested for anywhere: it is not a layer type but a group of layers.
ALLOWED = frozenset({"UniformTypeKVCacheSpecs"})


def _class_names(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Tuple):
        return [n for elt in node.elts for n in _class_names(elt)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def type_tests_on_builtin_specs(source: str, filename: str) -> list[str]:
    """``isinstance(x, C)`` / ``issubclass(x, C)`` calls whose C is a built-in spec class."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
        ):
            for name in _class_names(node.args[1]):
                if name in BUILTIN_SPEC_NAMES and name not in ALLOWED:
                    found.append(f"{filename}:{node.lineno}: {node.func.id}(..., {name})")
    return found


def test_the_scan_knows_the_builtin_spec_classes() -> None:
    assert {"FullAttentionSpec", "SlidingWindowSpec", "MambaSpec", "CrossAttentionSpec", "AttentionSpec"} <= (
        BUILTIN_SPEC_NAMES
    )


def test_the_scan_finds_a_type_test() -> None:
    """The scan itself can fail: it flags each form the core used to write."""
    src = (
        "if isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)): pass\n"
        "ok = isinstance(spec, UniformTypeKVCacheSpecs)\n"
        "x = issubclass(cls, specs.MambaSpec)\n"
    )
    hits = type_tests_on_builtin_specs(src, "probe.py")
    assert len(hits) == 3
    assert (
        "SlidingWindowSpec" in hits[0] and "ChunkedLocalAttentionSpec" in hits[1] and "MambaSpec" in hits[2]
    )


def test_no_type_tests_on_builtin_specs_outside_specs() -> None:
    """Outside kvspec/specs/, behaviour a spec needs comes from its traits, never from its class."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "specs":
            continue
        found += type_tests_on_builtin_specs(path.read_text(), str(rel))
    assert found == []


def _imports_of(module: str) -> set[str]:
    """kvspec modules that ``module`` imports anywhere: at import time, inside functions (a deferred import
    only hides a cycle) and under TYPE_CHECKING (a cycle for readers and type checkers)."""
    path = Path(importlib.import_module(module).__file__ or "")
    if path.suffix != ".py":  # a mypyc-compiled module: its source lies beside the extension
        path = path.parent / (module.rsplit(".", 1)[-1] + ".py")
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvspec"):
            base = node.module
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                out.add(candidate if _is_module(candidate) else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("kvspec"))
    return out - {module}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _all_modules() -> list[str]:
    names = ["kvspec"]
    for info in pkgutil.walk_packages(kvspec.__path__, "kvspec."):
        names.append(info.name)
    return names


def find_import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_cycle_finder_finds_a_cycle() -> None:
    assert find_import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_import_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles_between_modules() -> None:
    """Package __init__ files re-export their children, so edges into a package's own children are the
    package's; a module -> module cycle (cli <-> engine.cli, hashing <-> request) fails here."""
    graph: dict[str, set[str]] = {}
    for name in _all_modules():
        if name.endswith("__main__"):
            continue
        deps = {d for d in _imports_of(name) if not name.startswith(d + ".")}
        # A package importing its own children is how it re-exports them, not a cycle.
        graph[name] = {d for d in deps if not d.startswith(name + ".")} if _is_package(name) else deps
    assert find_import_cycle(graph) is None


def _is_package(name: str) -> bool:
    return hasattr(importlib.import_module(name), "__path__")


def test_registry_core_and_managers_do_not_import_each_other() -> None:
    """Only the built-in registrations (kvspec.registry.builtins) join the two."""
    assert not any(d.startswith("kvspec.managers") for d in _imports_of("kvspec.registry.core"))
    for name in _all_modules():
        if name.startswith("kvspec.managers"):
            assert not any(d.startswith("kvspec.registry") for d in _imports_of(name)), name


#: Each layer (a folder, or a module at the package root) and the layers it may import, bottom-up.
#: docs/ARCHITECTURE.md shows the same table; a module may always import its own layer.
BASE = frozenset({"errors", "intmath", "named_registry"})
MAY_IMPORT: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "intmath": frozenset(),
    "named_registry": frozenset({"errors"}),
    "build_info": frozenset(),
    "presets": frozenset(),
    "blocks": BASE,
    "contracts": BASE | {"blocks"},
    "specs": BASE | {"contracts"},
    "managers": BASE | {"blocks", "contracts"},
    "eviction": BASE | {"blocks"},
    "registry": BASE | {"contracts", "specs", "managers"},
    "planning": BASE | {"contracts", "specs", "registry"},
    "coordinator": BASE | {"blocks", "contracts", "managers", "eviction", "registry", "planning"},
    "device": BASE | {"contracts", "specs", "planning"},
    "models": BASE | {"presets", "contracts", "specs", "registry"},
    "testing": BASE
    | {
        "blocks",
        "contracts",
        "specs",
        "managers",
        "eviction",
        "registry",
        "planning",
        "coordinator",
        "device",
    },
    "tiers": BASE,
    "engine": BASE
    | {"blocks", "contracts", "specs", "eviction", "planning", "coordinator", "device", "models", "tiers"},
    "integrations": BASE
    | {"blocks", "contracts", "specs", "managers", "eviction", "registry", "planning", "coordinator"},
    "fleet": BASE
    | {
        "blocks",
        "contracts",
        "specs",
        "eviction",
        "planning",
        "coordinator",
        "models",
        "engine",
        "tiers",
    },
    "cli": BASE
    | {
        "fleet",
        "blocks",
        "build_info",
        "presets",
        "contracts",
        "specs",
        "eviction",
        "registry",
        "planning",
        "coordinator",
        "device",
        "models",
        "engine",
        "tiers",
        "integrations",
    },
    "builtins": frozenset({"registry"}),
}
#: The package's own __init__ (the lazy public API) may name any layer but the commands.
TOP = "kvspec"


def layer_of(module: str) -> str:
    """``kvspec.coordinator._core`` -> "coordinator"; ``kvspec.errors`` -> "errors"; ``kvspec`` -> "kvspec"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else TOP


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that go to a layer the importing module's layer may not import."""
    found = []
    for module, deps in sorted(graph.items()):
        own = layer_of(module)
        allowed = set(MAY_IMPORT) - {"cli"} if own == TOP else MAY_IMPORT[own]
        for dep in sorted(deps):
            target = layer_of(dep)
            if target != own and target not in allowed:
                found.append(f"{module} -> {dep} ({own} may not import {target})")
    return found


def test_every_package_folder_and_root_module_has_a_layer() -> None:
    layers = {layer_of(m) for m in _all_modules()} - {TOP}
    assert layers == set(MAY_IMPORT), (
        f"unplaced: {layers - set(MAY_IMPORT)}, gone: {set(MAY_IMPORT) - layers}"
    )


def test_layers_import_only_the_layers_below_them() -> None:
    graph = {name: _imports_of(name) for name in _all_modules() if not name.endswith("__main__")}
    assert layering_violations(graph) == []


def test_layering_check_can_fail() -> None:
    """An import up the data flow (a manager reaching the coordinator, a spec reaching the pool) is flagged."""
    graph = {
        "kvspec.managers.full": {"kvspec.coordinator._core", "kvspec.blocks.pool"},
        "kvspec.specs.attention": {"kvspec.blocks.pool"},
        "kvspec.engine.engine": {"kvspec.integrations.vllm"},
    }
    assert layering_violations(graph) == [
        "kvspec.engine.engine -> kvspec.integrations.vllm (engine may not import integrations)",
        "kvspec.managers.full -> kvspec.coordinator._core (managers may not import coordinator)",
        "kvspec.specs.attention -> kvspec.blocks.pool (specs may not import blocks)",
    ]


def test_the_layer_table_has_no_cycle() -> None:
    graph = {layer: set(deps) for layer, deps in MAY_IMPORT.items()}
    assert find_import_cycle(graph) is None


def test_at_most_eight_modules_at_the_package_root() -> None:
    root_modules = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(root_modules) <= 8, root_modules


def test_compiled_cores_are_imported_only_by_their_own_folder() -> None:
    """A compiled core (``_core``) sits behind its folder's checked public module; nothing else imports
    it, so nobody reaches the unchecked entry points by mistake."""
    cores = [m for m in _all_modules() if m.rsplit(".", 1)[-1] == "_core"]
    assert cores == ["kvspec.coordinator._core", "kvspec.planning._core"]
    for name in _all_modules():
        for core in cores:
            folder = name if _is_package(name) else name.rsplit(".", 1)[0]
            if core in _imports_of(name):
                assert folder == core.rsplit(".", 1)[0], f"{name} imports {core}"


def test_tests_mirror_the_package_folders() -> None:
    """tests/unit/ has a folder for every package folder that holds modules."""
    tests = Path(__file__).resolve().parent
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    mirrored = {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders - mirrored == set()
