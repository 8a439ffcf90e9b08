"""stubs/torch_npu against the library it types: each stubbed call has torch_npu's own parameters."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.typing.checkers.pins import CACHE, ROOT, pins


def _signatures(tree: ast.Module) -> dict[str, list[tuple[str, bool]]]:
    """Module-level functions: name -> [(parameter, has a default)]."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            defaults = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
            out[node.name] = [(a.arg, d) for a, d in zip(positional, defaults, strict=True)]
    return out


def npu_stub_problems(package_dir: Path) -> list[str]:
    """Each function stubs/torch_npu/npu types, compared with the one torch_npu defines (in
    ``torch_npu/npu/__init__.py`` or the module it imports it from): the same parameters, the same ones
    optional. ``package_dir`` holds the unpacked ``torch_npu`` package."""
    stubs = _signatures(ast.parse((ROOT / "stubs" / "torch_npu" / "npu" / "__init__.pyi").read_text()))
    init = package_dir / "torch_npu" / "npu" / "__init__.py"
    tree = ast.parse(init.read_text())
    real = _signatures(tree)
    for node in tree.body:  # `from .utils import synchronize, ...`
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            source = init.parent / f"{node.module.replace('.', '/')}.py"
            if source.exists():
                found = _signatures(ast.parse(source.read_text()))
                real.update({a.asname or a.name: found[a.name] for a in node.names if a.name in found})
    problems = []
    for name, params in stubs.items():
        if name not in real:
            problems.append(f"stubs/torch_npu: torch_npu.npu has no function {name!r}")
        elif real[name] != params:
            problems.append(f"stubs/torch_npu: npu.{name}{params} but torch_npu defines {real[name]}")
    return problems


def check_npu_stubs() -> list[str]:
    """Download the pinned torch_npu wheel (no dependencies; it is not installed) and compare the stubs."""
    target = CACHE / "torch-npu"
    target.mkdir(parents=True, exist_ok=True)
    wheels = sorted(target.glob("torch_npu-*.whl"))
    if not wheels:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "-d",
                str(target),
                pins()["torch-npu"],
            ],
            check=True,
        )
        wheels = sorted(target.glob("torch_npu-*.whl"))
    unpacked = target / "src"
    with zipfile.ZipFile(wheels[-1]) as wheel:
        for name in wheel.namelist():
            if name.startswith("torch_npu/npu/") and name.endswith(".py"):
                wheel.extract(name, unpacked)
    return npu_stub_problems(unpacked)
