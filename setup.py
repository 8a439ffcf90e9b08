"""Build hook: ``KVSPEC_COMPILE=1`` compiles kvspec's hot modules with mypyc (the same typed sources);
without it the build is pure Python.

Compiled build from a checkout: ``KVSPEC_COMPILE=1 pip install --no-build-isolation .`` (mypy, which ships
mypyc, must be installed: ``pip install mypy``; kvspec's optional extras need not be). For development,
``KVSPEC_COMPILE=1 pip install --no-build-isolation -e .`` (the editable install then finds mypyc's runtime
module, which lands at the checkout root), or ``KVSPEC_COMPILE=1 python setup.py build_ext --inplace`` under
the compat editable install (``--config-settings editable_mode=compat``: the checkout root is on sys.path;
setuptools' default editable finder does not list a module built beside it). Delete the ``.so`` files to go
back to pure.
With ``KVSPEC_COMPILE=1`` the build is compiled or fails saying why (no mypyc, no C compiler, a module
mypyc refuses); it never falls back to pure Python without a word. ``kvspec inspect`` says which build runs.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

from setuptools import setup


def _ext_modules() -> list[Any]:
    if os.environ.get("KVSPEC_COMPILE", "").lower() not in ("1", "true", "yes"):
        return []
    # Asked for by name, the compiled build is compiled or an error: pip shows a build's output only with -v,
    # so a quiet fallback to pure Python would leave the user believing they run the compiled one.
    try:
        from mypyc.build import mypycify
    except ImportError:
        raise SystemExit(
            "kvspec: KVSPEC_COMPILE=1 needs mypyc, which ships with mypy: pip install mypy (and build with "
            "--no-build-isolation), or unset KVSPEC_COMPILE for the pure-Python build."
        ) from None
    here = os.path.dirname(os.path.abspath(__file__))
    modules = runpy.run_path(os.path.join(here, "kvspec", "build_info.py"))["COMPILED_MODULES"]
    print(f"kvspec: compiling {len(modules)} modules with mypyc (KVSPEC_COMPILE=1)", file=sys.stderr)
    # Not optional: a module that does not compile (no C compiler, a mypyc error) fails the build, naming it.
    return list(mypycify(list(modules), opt_level="3"))


setup(ext_modules=_ext_modules())
