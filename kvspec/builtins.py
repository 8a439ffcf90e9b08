"""``import kvspec.builtins`` registers the built-in specs into the default registry (kept for code that
imports submodules directly); the registrations live in :mod:`kvspec.registry.builtins`."""

from kvspec.registry.builtins import default_registry, register_builtins

__all__ = ["default_registry", "register_builtins"]
