"""Build hook: ``KVSPEC_COMPILE=1`` compiles kvspec's hot modules with mypyc (the same typed sources);
without it, or where mypyc or a C compiler is missing, the build is pure Python.

Compiled build from a checkout: ``KVSPEC_COMPILE=1 pip install --no-build-isolation .`` (mypy, which ships
mypyc, must be installed: ``pip install mypy``), or in place for development:
``KVSPEC_COMPILE=1 python setup.py build_ext --inplace`` (delete the ``.so`` files to go back to pure).
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
    try:
        from mypyc.build import mypycify
    except ImportError:
        print(
            "KVSPEC_COMPILE is set but mypyc (pip install mypy) is missing: building pure Python",
            file=sys.stderr,
        )
        return []
    here = os.path.dirname(os.path.abspath(__file__))
    modules = runpy.run_path(os.path.join(here, "kvspec", "build_info.py"))["COMPILED_MODULES"]
    extensions = mypycify(list(modules), opt_level="3")
    for extension in extensions:
        extension.optional = True  # no C compiler: setuptools skips it and the .py modules are used
    return extensions


setup(ext_modules=_ext_modules())
