"""vllm-ascend 0.23.0's real KV-cache plugin, run on this CPU machine as its platform runs it.

- :func:`fetch_wheel` has pip download the wheel (``requirements-ascend.txt`` pins it by sha256, which pip
  checks against the file it receives and against the index's), into a cache that later runs reuse.
- :func:`load` puts on ``sys.path`` only the wheel's spec and manager modules and the few modules of the
  package they import (:data:`MODULES`), beside a stand-in ``torch_npu`` (an empty module: the spec module
  only reads the device type, from the package's ``_build_info``), and imports them. It then makes vLLM's
  current platform's ``register_custom_kv_cache_specs(vllm_config)`` do what vllm-ascend's ``NPUPlatform``
  does there (``vllm_ascend/platform.py``: import ``register_ascend_kv_cache_specs`` and call it), so vLLM
  runs the plugin's registration unchanged, once, when its registry first initialises.

Nothing here imports kvspec: the plugin meets kvspec only where a user switches kvspec on.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements-ascend.txt"

#: The wheel's files put on the path: the spec and manager modules, and what they import (checked by
#: :func:`load`: importing them loads no other module of the package).
MODULES = (
    "vllm_ascend/__init__.py",
    "vllm_ascend/_build_info.py",
    "vllm_ascend/ascend_config.py",
    "vllm_ascend/envs.py",
    "vllm_ascend/logger.py",
    "vllm_ascend/utils.py",
    "vllm_ascend/core/__init__.py",
    "vllm_ascend/core/kv_cache_interface.py",
    "vllm_ascend/core/single_type_kv_cache_manager.py",
)


def fetch_wheel(cache: Path) -> Path:
    """The wheel, downloaded once into ``cache`` by pip with the pinned hash (``--require-hashes``)."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob("vllm_ascend-0.23.0-*.whl"))
    if not found:
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                "--require-hashes", "--only-binary", ":all:", "-d", str(cache), "-r", str(REQUIREMENTS),
            ],
            check=True,
        )  # fmt: skip
        found = sorted(cache.glob("vllm_ascend-0.23.0-*.whl"))
    if len(found) != 1:
        raise RuntimeError(f"expected one vllm-ascend 0.23.0 wheel in {cache}, found {found}")
    return found[0]


def extract(wheel: Path, target: Path) -> Path:
    """The modules of :data:`MODULES` from ``wheel`` under ``target/pkg``, and a stand-in ``torch_npu`` under
    ``target/stand_in``; returns ``target``."""
    with zipfile.ZipFile(wheel) as archive:
        for name in MODULES:
            archive.extract(name, target / "pkg")
    stand_in = target / "stand_in" / "torch_npu"
    stand_in.mkdir(parents=True, exist_ok=True)
    (stand_in / "__init__.py").write_text(
        '"""A stand-in for Ascend\'s torch_npu on a machine without one: vllm-ascend\'s spec module imports it and '
        'reads nothing from it."""\n'
    )
    return target


def load(cache: Path) -> tuple[ModuleType, ModuleType]:
    """vllm-ascend's spec module and manager module, imported from the wheel (see the module docstring), with
    vLLM's current platform calling ``register_ascend_kv_cache_specs()`` from its registration hook."""
    root = extract(fetch_wheel(cache), cache / "extracted")
    for path in (root / "stand_in", root / "pkg"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    before = {m for m in sys.modules if m.startswith("vllm_ascend")}
    specs = importlib.import_module("vllm_ascend.core.kv_cache_interface")
    managers = importlib.import_module("vllm_ascend.core.single_type_kv_cache_manager")
    loaded = {m for m in sys.modules if m.startswith("vllm_ascend")} - before
    expected = {name.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for name in MODULES}
    if not loaded <= expected:
        raise RuntimeError(
            f"vllm-ascend's modules imported more than MODULES names: {sorted(loaded - expected)}"
        )
    hook_platform(specs.register_ascend_kv_cache_specs)
    return specs, managers


def hook_platform(register: Callable[[], None]) -> None:
    """vLLM's current platform calls ``register()`` from ``register_custom_kv_cache_specs(vllm_config)``, as
    vllm-ascend's NPUPlatform calls ``register_ascend_kv_cache_specs()`` there. vLLM runs the hook once, when
    its registry first initialises; where this process's registry already has (the hook ran before this one
    was set), ``register()`` is called now, as the hook would have."""
    from vllm.platforms import current_platform
    from vllm.v1 import kv_cache_spec_registry

    def register_custom_kv_cache_specs(cls: type, vllm_config: object) -> None:
        register()

    type(current_platform).register_custom_kv_cache_specs = classmethod(register_custom_kv_cache_specs)
    if kv_cache_spec_registry._REGISTRY_KVCACHESPEC_LIST:
        register()
