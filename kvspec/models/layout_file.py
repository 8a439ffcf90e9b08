"""A kvspec layout file: a model's layers written as registered specs, with the plugins that define them.

``kvspec plan`` and ``kvspec simulate`` accept such a JSON file wherever they accept a config.json::

    {
      "kvspec_layout": 1,
      "name": "ring-window-demo",
      "plugins": ["plugin.py:register"],
      "max_model_len": 4096,
      "layers": [
        {"name": "layers.{i}", "count": 4, "spec": "acme.ring_window",
         "args": {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16", "window": 1024}}
      ]
    }

``plugins`` entries are ``module:function`` or ``file.py:function`` (a path relative to the layout file);
each function is called with the registry, atomically, before the layers are built. ``spec`` names a
registration by its capability identifier (``Capabilities.identifier``) or by the spec class's qualified
name. Arguments named ``dtype``/``dtypes``/``*_dtype`` are torch dtype names; lists become tuples.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from kvspec.contracts.spec import KVCacheSpec
from kvspec.errors import KVSpecError, ModelConfigError, PluginError
from kvspec.registry.builtins import default_registry
from kvspec.registry.core import AnyRegistry, Registration

LAYOUT_KEY = "kvspec_layout"
MAX_LAYERS = 100_000


def is_layout_file(cfg: Mapping[str, Any]) -> bool:
    return LAYOUT_KEY in cfg


def _load_callable(ref: str, base_dir: Path) -> Any:
    module_ref, sep, attr = ref.partition(":")
    if not sep or not module_ref or not attr:
        raise ModelConfigError(f"Layout plugin {ref!r} must be 'module:function' or 'file.py:function'.")
    try:
        if module_ref.endswith(".py"):
            path = (base_dir / module_ref).resolve()
            name = f"kvspec_layout_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
            module = sys.modules.get(name)
            if module is None:
                spec = importlib.util.spec_from_file_location(name, path)
                if spec is None or spec.loader is None:
                    raise ModelConfigError(f"Layout plugin file {path} cannot be imported.")
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
        else:
            module = importlib.import_module(module_ref)
    except KVSpecError:
        raise
    except SystemExit as exc:  # a command that ended "successfully" here would hide the plugin's failure
        raise PluginError(
            f"Layout plugin {ref!r} exited the process while importing ({exc.code!r}); "
            "a plugin must raise an exception, not exit."
        ) from None
    except Exception as exc:
        raise PluginError(f"Layout plugin {ref!r} failed to import ({type(exc).__name__}: {exc}).") from exc
    hook = getattr(module, attr, None)
    if not callable(hook):
        raise PluginError(f"Layout plugin {ref!r}: {attr!r} is not a function of {module_ref}.")
    return hook


def load_layout_plugins(cfg: Mapping[str, Any], base_dir: Path, registry: AnyRegistry) -> list[str]:
    """Run every plugin the layout names (each atomically); return their references."""
    refs = cfg.get("plugins", [])
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise ModelConfigError("Layout 'plugins' must be a list of 'module:function' strings.")
    for ref in refs:
        hook = _load_callable(ref, base_dir)
        try:
            with registry.transaction():
                hook(registry)
        except KVSpecError:
            raise
        except SystemExit as exc:
            raise PluginError(
                f"Layout plugin {ref!r} exited the process while registering ({exc.code!r}); a plugin must "
                "raise an exception, not exit."
            ) from None
        except Exception as exc:
            raise PluginError(
                f"Layout plugin {ref!r} failed to register ({type(exc).__name__}: {exc})."
            ) from exc
    return list(refs)


def _find_registration(name: str, registry: AnyRegistry) -> Registration[Any, Any]:
    for entry in registry.registrations():
        caps = entry.capabilities
        cls = entry.spec_cls
        if (caps is not None and caps.identifier == name) or name in (
            cls.__qualname__,
            f"{cls.__module__}.{cls.__qualname__}",
        ):
            return entry
    known = sorted(e.capabilities.identifier for e in registry.registrations() if e.capabilities is not None)
    raise ModelConfigError(
        f"Layout names spec {name!r}, which no registration has (known: {', '.join(known)}). Install the "
        "plugin that defines it (a 'kvspec.plugins' entry point loads by itself unless KVSPEC_PLUGINS leaves "
        "it out or --no-plugins is given), or name its register function in the layout's 'plugins'."
    )


def _convert(key: str, value: Any) -> Any:
    if key in ("dtype", "dtypes") or key.endswith("_dtype"):
        if isinstance(value, list):
            return tuple(_dtype(v, key) for v in value)
        return _dtype(value, key)
    if isinstance(value, list):
        return tuple(_convert("", v) for v in value)
    return value


def _dtype(value: object, key: str) -> torch.dtype:
    dtype = getattr(torch, value, None) if isinstance(value, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ModelConfigError(
            f"Layout argument {key}={value!r} is not a torch dtype name (e.g. 'bfloat16')."
        )
    return dtype


def layer_specs_from_layout(
    cfg: Mapping[str, Any], *, base_dir: Path, registry: AnyRegistry | None = None
) -> dict[str, KVCacheSpec]:
    """Load the layout's plugins, then build each layer's spec through its registration's class."""
    registry = default_registry if registry is None else registry
    load_layout_plugins(cfg, base_dir, registry)
    groups = cfg.get("layers")
    if not isinstance(groups, list) or not groups:
        raise ModelConfigError(
            "Layout 'layers' must be a non-empty list of {name, count, spec, args} objects."
        )
    out: dict[str, KVCacheSpec] = {}
    for i, group in enumerate(groups):
        if not isinstance(group, dict):
            raise ModelConfigError(f"Layout layers[{i}] must be an object, got {type(group).__name__}.")
        count = group.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= MAX_LAYERS:
            raise ModelConfigError(
                f"Layout layers[{i}].count must be an int in [1, {MAX_LAYERS}], got {count!r}."
            )
        pattern = group.get("name", "layers.{i}")
        args = group.get("args", {})
        if not isinstance(pattern, str) or not isinstance(args, dict):
            raise ModelConfigError(f"Layout layers[{i}] needs a string 'name' and an object 'args'.")
        entry = _find_registration(str(group.get("spec")), registry)
        kwargs = {k: _convert(k, v) for k, v in args.items()}
        try:
            spec = entry.spec_cls(**kwargs)
        except KVSpecError:
            raise
        except TypeError as exc:
            raise ModelConfigError(
                f"Layout layers[{i}]: {entry.spec_cls.__name__}({args}) failed: {exc}"
            ) from exc
        for j in range(count):
            name = pattern.replace("{i}", str(len(out) if "{i}" in pattern else j))
            if name in out:
                raise ModelConfigError(f"Layout names layer {name!r} twice; put '{{i}}' in the name pattern.")
            out[name] = spec
    if len(out) > MAX_LAYERS:
        raise ModelConfigError(f"Layout has {len(out)} layers; at most {MAX_LAYERS}.")
    return out
