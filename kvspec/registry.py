"""``Registry[SpecT, MgrT]``: which manager runs each spec type, and which specs may share a group.

Lookups walk the spec's MRO and take the first registered class (an unregistered subclass inherits its
parent's manager, as in vLLM) unless the registry is strict. Results are cached per class; registering
or restoring clears the cache. Every mutation is validated first and applied under a lock, so a failed
registration leaves the registry exactly as it was.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, runtime_checkable

from kvspec._checking import check_api
from kvspec.errors import (
    CapabilityError,
    ConflictingRegistrationError,
    ManagerProtocolError,
    MissingManagerError,
    PluginError,
    SpecProtocolError,
    UniformBaseError,
    UnregisteredSpecError,
)
from kvspec.manager_api import KVCacheManager, MgrT
from kvspec.protocols import KVCacheSpec, SpecT, missing_members

KNOWN_DEVICES = frozenset({"cpu", "cuda", "npu", "xpu", "rocm", "tpu"})
KNOWN_STORAGE_LAYOUTS = frozenset({"paged_kv", "paged_latent", "state", "compressed", "custom"})
_IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
PLUGIN_GROUP = "kvspec.plugins"
PLUGINS_ENV = "KVSPEC_PLUGINS"


@dataclass(frozen=True, kw_only=True, slots=True)
class Capabilities:
    """What a registration promises: a stable identifier, how its pages are laid out, where it runs.

    ``identifier`` is dotted lower-case (``vendor.family``), stable across releases so configs and KV
    events can name it; ``storage_layout`` is one of KNOWN_STORAGE_LAYOUTS; ``devices`` a non-empty
    subset of KNOWN_DEVICES.
    """

    identifier: str
    storage_layout: str = "paged_kv"
    devices: frozenset[str] = frozenset({"cpu", "cuda", "npu"})

    def __post_init__(self) -> None:
        if not _IDENTIFIER.match(self.identifier):
            raise CapabilityError(
                f"Capabilities.identifier {self.identifier!r} must be dotted lower-case words "
                "like 'acme.paged_mla'."
            )
        if self.storage_layout not in KNOWN_STORAGE_LAYOUTS:
            raise CapabilityError(
                f"Capabilities.storage_layout {self.storage_layout!r} is not one of "
                f"{sorted(KNOWN_STORAGE_LAYOUTS)}."
            )
        devices = frozenset(self.devices)
        unknown = devices - KNOWN_DEVICES
        if not devices or unknown:
            raise CapabilityError(
                f"Capabilities.devices must be a non-empty subset of {sorted(KNOWN_DEVICES)}; "
                f"unknown: {sorted(unknown)}."
            )
        object.__setattr__(self, "devices", devices)


@dataclass(frozen=True, kw_only=True, slots=True)
class Registration(Generic[SpecT, MgrT]):
    """One registered spec class with its manager, its uniform-type base and its capabilities."""

    spec_cls: type[SpecT]
    manager_cls: type[MgrT]
    uniform_type_base_spec: type[SpecT]
    capabilities: Capabilities | None = None
    source: str = "user"

    def same_as(self, other: Registration[Any, Any]) -> bool:
        return (
            self.manager_cls is other.manager_cls
            and self.uniform_type_base_spec is other.uniform_type_base_spec
            and self.capabilities == other.capabilities
        )


@dataclass(frozen=True, slots=True)
class RegistrySnapshot(Generic[SpecT, MgrT]):
    """An immutable copy of a registry's entries, for :meth:`Registry.restore`."""

    entries: Mapping[type, Registration[SpecT, MgrT]] = field(default_factory=dict)
    strict: bool = False


class _ManagerCache(dict[type, Any]):
    """type -> manager class; a miss resolves through the owning lookup cache."""

    __slots__ = ("_owner",)

    def __init__(self, owner: _LookupCache[Any, Any]) -> None:
        super().__init__()
        self._owner = owner

    def __missing__(self, spec_cls: type) -> Any:
        entry = self._owner[spec_cls]
        manager = None if entry is None else entry.manager_cls
        self[spec_cls] = manager
        return manager


class _LookupCache(dict[type, "Registration[SpecT, MgrT] | None"], Generic[SpecT, MgrT]):
    """Per-class lookup results. A hit is a plain dict hit; a miss walks the MRO once and stores it.

    The registry replaces the whole cache object when it changes, so readers never see a half-cleared one.
    """

    __slots__ = ("_registry", "managers")

    def __init__(self, registry: Registry[SpecT, MgrT]) -> None:
        super().__init__()
        self._registry = registry
        self.managers = _ManagerCache(self)

    def __missing__(self, spec_cls: type) -> Registration[SpecT, MgrT] | None:
        found = self._registry._resolve(spec_cls)
        self[spec_cls] = found
        return found


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class Registry(Generic[SpecT, MgrT]):
    """Maps spec classes to managers. Thread-safe; lookups are cached per class.

    ``strict=True``: a spec whose exact class is not registered is an error even when a parent is
    registered (a subclass that changes the page layout must not silently get its parent's manager).
    """

    def __init__(self, *, name: str = "registry", strict: bool = False) -> None:
        self.name = name
        self._strict = strict
        self._entries: dict[type, Registration[SpecT, MgrT]] = {}
        self._lookup_cache: _LookupCache[SpecT, MgrT] = _LookupCache(self)
        self._lock = threading.RLock()

    # -- mutation -----------------------------------------------------------------------------

    @check_api
    def register(
        self,
        spec_cls: type[SpecT],
        manager_cls: type[MgrT] | None,
        uniform_type_base_spec: type[SpecT] | None = None,
        *,
        capabilities: Capabilities | None = None,
        source: str = "user",
    ) -> None:
        """Register ``spec_cls`` to be run by ``manager_cls``.

        Raises (and changes nothing): MissingManagerError, SpecProtocolError, ManagerProtocolError,
        UniformBaseError, ConflictingRegistrationError. Registering the same triple again is a no-op.
        """
        entry = self._validate(spec_cls, manager_cls, uniform_type_base_spec, capabilities, source)
        with self._lock:
            self._check_conflict(entry, self._entries)
            self._entries[spec_cls] = entry
            self._lookup_cache = _LookupCache(self)

    def _validate(
        self,
        spec_cls: type[SpecT],
        manager_cls: type[MgrT] | None,
        base: type[SpecT] | None,
        capabilities: Capabilities | None,
        source: str,
    ) -> Registration[SpecT, MgrT]:
        if manager_cls is None:
            raise MissingManagerError(
                f"Registering {_name(spec_cls)}: manager_class is required; pass the KVCacheManager "
                "class that runs this spec type."
            )
        missing = missing_members(spec_cls, KVCacheSpec)
        if missing:
            raise SpecProtocolError(
                f"{_name(spec_cls)} is not a KVCacheSpec: missing {', '.join(sorted(missing))}."
            )
        missing = missing_members(manager_cls, KVCacheManager)
        if missing:
            raise ManagerProtocolError(
                f"{_name(manager_cls)} (manager for {spec_cls.__name__}) is not a KVCacheManager: "
                f"missing {', '.join(sorted(missing))}."
            )
        base = spec_cls if base is None else base
        if not issubclass(spec_cls, base):
            raise UniformBaseError(
                f"{_name(spec_cls)} must inherit from its declared uniform_type_base_spec {_name(base)}."
            )
        return Registration(
            spec_cls=spec_cls,
            manager_cls=manager_cls,
            uniform_type_base_spec=base,
            capabilities=capabilities,
            source=source,
        )

    @staticmethod
    def _check_conflict(
        entry: Registration[Any, Any], entries: Mapping[type, Registration[Any, Any]]
    ) -> None:
        old = entries.get(entry.spec_cls)
        if old is not None and not old.same_as(entry):
            raise ConflictingRegistrationError(
                f"Conflicting registration for KVCacheSpec {entry.spec_cls.__name__}: already run by "
                f"{old.manager_cls.__name__} with base {old.uniform_type_base_spec.__name__} "
                f"(from {old.source}); refused {entry.manager_cls.__name__} with base "
                f"{entry.uniform_type_base_spec.__name__}."
            )

    def register_many(self, items: Sequence[tuple[type[SpecT], type[MgrT], type[SpecT] | None]]) -> None:
        """Register several classes at once: all or none."""
        entries = [self._validate(s, m, b, None, "user") for s, m, b in items]
        with self._lock:
            staged = dict(self._entries)
            for entry in entries:
                self._check_conflict(entry, staged)
                staged[entry.spec_cls] = entry
            self._entries = staged
            self._lookup_cache = _LookupCache(self)

    # -- lookup -------------------------------------------------------------------------------

    @property
    def strict(self) -> bool:
        return self._strict

    def set_strict(self, strict: bool) -> None:
        with self._lock:
            self._strict = strict
            self._lookup_cache = _LookupCache(self)

    def lookup(self, spec_cls: type) -> Registration[SpecT, MgrT] | None:
        """The registration that applies to ``spec_cls`` (cached); None if its lineage is unknown."""
        return self._lookup_cache[spec_cls]

    @property
    def manager_classes(self) -> Mapping[type, type[MgrT] | None]:
        """Spec class -> manager class, resolved through the MRO on first use and then a plain dict hit.

        The hot-path form of :meth:`get_manager_class`: ``registry.manager_classes[type(spec)]``.
        """
        return self._lookup_cache.managers

    def _resolve(self, spec_cls: type) -> Registration[SpecT, MgrT] | None:
        with self._lock:
            found: Registration[SpecT, MgrT] | None = None
            for klass in spec_cls.__mro__:
                found = self._entries.get(klass)
                if found is not None:
                    break
            if found is not None and self._strict and found.spec_cls is not spec_cls:
                raise UnregisteredSpecError(
                    f"{_name(spec_cls)} is not registered, and strict registry {self.name!r} does not let "
                    f"it inherit {found.spec_cls.__name__}'s manager {found.manager_cls.__name__}. "
                    "Register it with register_kv_cache_spec(...)."
                )
            return found

    def get_manager_class(self, spec: object) -> type[MgrT] | None:
        manager: type[MgrT] | None = self._lookup_cache.managers[type(spec)]
        return manager

    def get_uniform_type_base_spec(self, spec: object) -> type[SpecT] | None:
        entry = self.lookup(type(spec))
        return None if entry is None else entry.uniform_type_base_spec

    def require(self, spec: object, layer_name: str | None = None) -> Registration[SpecT, MgrT]:
        """The registration for ``spec``; UnregisteredSpecError naming the layer if there is none."""
        entry = self.lookup(type(spec))
        if entry is None:
            where = f" for layer {layer_name}" if layer_name is not None else ""
            raise UnregisteredSpecError(
                f"Unsupported KV cache spec type{where}: {type(spec).__name__}. Please register it using "
                "@register_kv_cache_spec decorator."
            )
        return entry

    @check_api
    def check(self, layer_specs: Mapping[str, object]) -> None:
        """Every layer's spec has a registered manager (vLLM's check_kv_cache_spec_registry)."""
        for layer_name, spec in layer_specs.items():
            self.require(spec, layer_name)

    def is_uniform_type(self, specs: Sequence[KVCacheSpec]) -> bool:
        """Whether ``specs`` can share one group as a uniform type (possibly with different page sizes).

        True when every spec has the same registered uniform base, the same block size, and the first
        spec's type-specific rule holds. Fixed on purpose: vLLM checks only that the others are instances
        of the *first* spec's base, which makes the answer depend on argument order.
        """
        if not specs:
            return True
        bases = {self.require(spec).uniform_type_base_spec for spec in specs}
        if len(bases) != 1:
            return False
        if len({spec.block_size for spec in specs}) != 1:
            return False
        return specs[0].is_uniform_with_collection(specs)

    def registrations(self) -> list[Registration[SpecT, MgrT]]:
        """Every registration, sorted by spec class name (for listings such as ``kvspec inspect``)."""
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: _name(e.spec_cls))

    def __contains__(self, spec_cls: object) -> bool:
        return spec_cls in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot(self) -> RegistrySnapshot[SpecT, MgrT]:
        with self._lock:
            return RegistrySnapshot(dict(self._entries), self._strict)

    def restore(self, snapshot: RegistrySnapshot[SpecT, MgrT]) -> None:
        with self._lock:
            self._entries = dict(snapshot.entries)
            self._strict = snapshot.strict
            self._lookup_cache = _LookupCache(self)

    @contextmanager
    def isolated(self) -> Iterator[Registry[SpecT, MgrT]]:
        """Undo every registration made inside the ``with`` block (for tests and trial plugins)."""
        saved = self.snapshot()
        try:
            yield self
        finally:
            self.restore(saved)

    @contextmanager
    def transaction(self) -> Iterator[Registry[SpecT, MgrT]]:
        """All registrations inside the block take effect, or none (if it raises)."""
        with self._lock:
            saved = self.snapshot()
            try:
                yield self
            except BaseException:
                self.restore(saved)
                raise


#: A registry of any parameterisation (``Registry`` is invariant in its type parameters, so APIs that only
#: look registrations up accept this rather than ``Registry[KVCacheSpec, KVCacheManager]``).
AnyRegistry = Registry[Any, Any]

#: The process-wide registry; kvspec.builtins registers the built-in specs; plugins register into it.
default_registry: Registry[KVCacheSpec, KVCacheManager] = Registry(name="default")


@check_api
def register_kv_cache_spec(
    manager_class: type[KVCacheManager],
    *,
    uniform_type_base_spec: type[KVCacheSpec] | None = None,
    capabilities: Capabilities | None = None,
    registry: AnyRegistry | None = None,
) -> Callable[[type[SpecT]], type[SpecT]]:
    """Class decorator: register the decorated spec class (into the default registry unless given).

    Put it above ``@dataclass``. It returns the class itself, so mypy keeps its concrete type.
    """
    target = default_registry if registry is None else registry

    def decorate(spec_cls: type[SpecT]) -> type[SpecT]:
        target.register(spec_cls, manager_class, uniform_type_base_spec, capabilities=capabilities)
        return spec_cls

    return decorate


@runtime_checkable
class PlatformHook(Protocol):
    """A hardware platform's registration hook (vLLM's ``Platform.register_custom_kv_cache_specs``)."""

    def register_custom_kv_cache_specs(self, registry: AnyRegistry) -> None: ...


@check_api
def apply_platform_hook(platform: PlatformHook, registry: AnyRegistry | None = None) -> None:
    """Let a platform register its specs, atomically: if the hook raises, none of its registrations stay.

    Call it once per process that builds managers or plans memory (engine core and workers alike): the
    registry is process-local. Hooks must be idempotent (identical re-registration is allowed).
    """
    target = default_registry if registry is None else registry
    try:
        with target.transaction():
            platform.register_custom_kv_cache_specs(target)
    except Exception as exc:
        raise PluginError(
            f"Platform hook {type(platform).__name__}.register_custom_kv_cache_specs failed: {exc}"
        ) from exc


def _allowed_plugins(allow: Sequence[str] | None) -> set[str] | None:
    if allow is not None:
        return set(allow)
    env = os.environ.get(PLUGINS_ENV)
    if env is None:
        return None
    return {name.strip() for name in env.split(",") if name.strip()}


@check_api
def load_plugins(
    registry: AnyRegistry | None = None,
    *,
    allow: Sequence[str] | None = None,
    group: str = PLUGIN_GROUP,
) -> list[str]:
    """Load plugins from the ``kvspec.plugins`` entry-point group; return the names loaded.

    Each entry point names a callable taking the registry. Which run: ``allow`` if given, else the
    comma-separated ``KVSPEC_PLUGINS`` variable if set (empty: none), else all. Each plugin registers
    atomically; a failing plugin raises PluginError and leaves no registration behind.
    """
    target = default_registry if registry is None else registry
    allowed = _allowed_plugins(allow)
    loaded: list[str] = []
    for ep in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
        if allowed is not None and ep.name not in allowed:
            continue
        try:
            hook = ep.load()
        except Exception as exc:
            raise PluginError(f"kvspec plugin {ep.name!r} ({ep.value}) failed to import: {exc}") from exc
        if not callable(hook):
            raise PluginError(
                f"kvspec plugin {ep.name!r} ({ep.value}) is not callable; it must be a function "
                "taking the registry."
            )
        try:
            with target.transaction():
                hook(target)
        except Exception as exc:
            raise PluginError(f"kvspec plugin {ep.name!r} failed to register: {exc}") from exc
        loaded.append(ep.name)
    return loaded
