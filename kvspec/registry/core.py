"""``Registry[SpecT, MgrT]``: which manager runs each spec type, and which specs may share a group.

Lookups walk the spec's MRO and take the first registered class (an unregistered subclass inherits its
parent's manager, as in vLLM) unless the registry is strict. Results are cached per class; registering
or restoring clears the cache. Every mutation is validated first and applied under a lock, so a failed
registration leaves the registry exactly as it was.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import typing_extensions
from beartype.door import is_bearable

from kvspec.contracts.checking import check_api, check_plugin_constructor
from kvspec.contracts.manager import KVCacheManager, MgrT
from kvspec.contracts.spec import KVCacheSpec, SpecT, missing_members
from kvspec.contracts.traits import traits_of
from kvspec.errors import (
    CapabilityError,
    ConflictingRegistrationError,
    KVSpecTypeError,
    RegistrationError,
    RegistryBoundError,
    UnregisteredSpecError,
)
from kvspec.registry.checks import check_manager_class, check_spec_class, check_uniform_base, require_class

KNOWN_DEVICES = frozenset({"cpu", "cuda", "npu", "xpu", "rocm", "tpu"})
KNOWN_STORAGE_LAYOUTS = frozenset({"paged_kv", "paged_latent", "state", "compressed", "custom"})
_IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")


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
    uniform_type_base_spec: type[KVCacheSpec]
    capabilities: Capabilities | None = None
    source: str = "user"
    #: Chooses the manager per spec *instance* (vLLM's platforms do: a compressed MLA spec runs another
    #: manager than an uncompressed one of the same class); None: ``manager_cls`` for every instance.
    manager_for: Callable[[Any], type[MgrT]] | None = None
    #: The classes ``manager_for`` returned that passed ``check_manager_class`` (a class passes for good or
    #: raises, so one check each suffices).
    _checked_variants: set[type] = field(default_factory=set, compare=False, repr=False)
    #: The manager bound of the typed registry that holds this registration (None: the protocol's).
    _manager_bound: RegistryBounds | None = field(default=None, compare=False, repr=False)

    def manager_for_spec(self, spec: KVCacheSpec) -> type[MgrT]:
        """The manager that runs ``spec``: ``manager_for(spec)`` when given (checked like ``manager_cls``
        on first use of each class it returns, and against the registry's manager bound), else
        ``manager_cls``."""
        if self.manager_for is None:
            return self.manager_cls
        chosen = self.manager_for(spec)
        if chosen is not self.manager_cls and chosen not in self._checked_variants:
            with _INTROSPECTION_LOCK:
                checked = check_manager_class(chosen, self.spec_cls)
                if self._manager_bound is not None:
                    self._manager_bound.check_manager(checked, self.spec_cls)
                self._checked_variants.add(checked)
        return chosen

    def same_as(self, other: Registration[Any, Any]) -> bool:
        return (
            self.manager_cls is other.manager_cls
            and self.manager_for is other.manager_for
            and self.uniform_type_base_spec is other.uniform_type_base_spec
            and self.capabilities == other.capabilities
        )


#: Held while a registration introspects classes (signatures, annotations) and generates the checked
#: constructor: CPython 3.11's compiler is not thread-safe there (concurrent registrations raised
#: "SystemError: AST constructor recursion depth mismatch"). Registration is rare; lookups never take it.
_INTROSPECTION_LOCK = threading.RLock()


@dataclass(frozen=True, slots=True)
class RegistrySnapshot(Generic[SpecT, MgrT]):
    """An immutable copy of a registry's entries, for :meth:`Registry.restore`."""

    entries: Mapping[type, Registration[SpecT, MgrT]] = field(default_factory=dict)
    strict: bool = False
    role_managers: Mapping[str, type[MgrT]] = field(default_factory=dict)


class _ManagerCache(dict[type, Any]):
    """type -> manager class; a miss resolves through the owning lookup cache."""

    __slots__ = ("_owner",)

    def __init__(self, owner: _LookupCache[Any, Any]) -> None:
        super().__init__()
        self._owner = owner

    def __missing__(self, spec_cls: type) -> Any:
        if issubclass(spec_cls, type):
            raise KVSpecTypeError(
                "get_manager_class() takes a spec instance, got a class; use registry.lookup(SpecClass) "
                "for a class."
            )
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


def _bound(hint: object) -> object | None:
    """The run-time form of a registry's type argument: None where it adds nothing to what registration
    checks anyway (kvspec's own protocols, ``Any``, a type variable of generic code)."""
    if hint is None or hint is Any or isinstance(hint, TypeVar) or hint in (KVCacheSpec, KVCacheManager):
        return None
    return hint


def _show_bound(hint: object) -> str:
    return hint.__qualname__ if isinstance(hint, type) else str(hint).replace("typing.", "")


@dataclass(frozen=True, slots=True)
class RegistryBounds:
    """The classes a typed registry admits, enforced at run time: every spec class it registers or looks up
    is a ``spec`` (subclass, or a member of a union), every manager class a ``manager``. None: no bound
    beyond the protocols, which registration checks member by member. A Protocol bound of a plugin's own is
    checked by member names; a class bound (or a union of classes) through beartype's ``is_bearable``."""

    spec: object = None
    manager: object = None
    name: str = "registry"

    @staticmethod
    def _admits(bound: object, cls: type) -> bool:
        if isinstance(bound, type) and typing_extensions.is_protocol(bound):
            return not missing_members(cls, bound)
        hint: Any = types.GenericAlias(type, (bound,))  # type[bound], built from a run-time value
        return is_bearable(cls, hint)

    def _typed(self) -> str:
        return f"Registry[{_show_bound(self.spec or KVCacheSpec)}, {_show_bound(self.manager or KVCacheManager)}]"

    def check_spec(self, spec_cls: type) -> None:
        """RegistryBoundError unless ``spec_cls`` is within the spec bound."""
        if self.spec is not None and not self._admits(self.spec, spec_cls):
            raise RegistryBoundError(
                f"Registry {self.name!r} is a {self._typed()}: spec class {_name(spec_cls)} is not a "
                f"subclass of {_show_bound(self.spec)}. Register it in a registry whose spec type admits it (the default "
                "registry takes any KVCacheSpec)."
            )

    def check_manager(self, manager_cls: type, spec_cls: type) -> None:
        """RegistryBoundError unless ``manager_cls`` is within the manager bound."""
        if self.manager is not None and not self._admits(self.manager, manager_cls):
            raise RegistryBoundError(
                f"Registry {self.name!r} is a {self._typed()}: manager class {_name(manager_cls)} (for "
                f"{spec_cls.__name__}) is not a subclass of {_show_bound(self.manager)}. Pass one, "
                "or register in a registry whose manager type admits it."
            )


class Registry(Generic[SpecT, MgrT]):
    """Maps spec classes to managers. Thread-safe; lookups are cached per class.

    ``strict=True``: a spec whose exact class is not registered is an error even when a parent is
    registered (a subclass that changes the page layout must not silently get its parent's manager).

    A typed registry enforces its type arguments at run time as its checkers do statically: created as
    ``Registry[AcmeSpec, AcmeManager](name=...)``, or as ``Registry(name=..., spec_bound=AcmeSpec,
    manager_bound=AcmeManager)`` (which checkers read as the same type), or from a subclass of
    ``Registry[AcmeSpec, AcmeManager]``, it refuses with a ``RegistryBoundError`` naming both classes a spec
    class outside ``AcmeSpec`` or a manager class outside ``AcmeManager``, when registering and when looking
    up (once per class: lookups are cached). A bare annotation (``typed: Registry[S, M] = Registry(...)``)
    is erased when the code runs, so only checkers see it. The default registry's bounds are the protocols.
    """

    def __init__(
        self,
        *,
        name: str = "registry",
        strict: bool = False,
        spec_bound: type[SpecT] | None = None,
        manager_bound: type[MgrT] | None = None,
    ) -> None:
        self.name = name
        self._strict = strict
        self._given_bounds: tuple[object, object] = (spec_bound, manager_bound)
        #: Resolved on first use: ``Registry[S, M](...)`` sets ``__orig_class__`` only after ``__init__``.
        self._bounds: RegistryBounds | None = None
        self._entries: dict[type, Registration[SpecT, MgrT]] = {}
        #: vLLM 0.34's group roles: a group whose ``KVCacheGroupSpec.role`` is registered here runs this
        #: manager, whatever its spec (a role's manager wins over the spec's).
        self._role_managers: dict[str, type[MgrT]] = {}
        #: Per thread, the undo journals of the isolated() blocks it is inside: (spec class, previous entry),
        #: or (role, previous role manager).
        self._journals: dict[int, list[list[tuple[type | str, Any]]]] = {}
        self._lookup_cache: _LookupCache[SpecT, MgrT] = _LookupCache(self)
        self._lock = threading.RLock()

    @property
    def bounds(self) -> RegistryBounds:
        """The spec and manager classes this registry admits at run time (see the class docstring)."""
        bounds = self._bounds
        if bounds is None:
            spec, manager = self._given_bounds
            args: tuple[object, ...] = ()
            origin = getattr(self, "__orig_class__", None)
            if origin is not None:
                args = typing_extensions.get_args(origin)
            else:
                for base in getattr(type(self), "__orig_bases__", ()):
                    if typing_extensions.get_origin(base) is Registry:
                        args = typing_extensions.get_args(base)
            if len(args) == 2:
                spec = args[0] if spec is None else spec
                manager = args[1] if manager is None else manager
            bounds = self._bounds = RegistryBounds(_bound(spec), _bound(manager), self.name)
        return bounds

    # -- mutation -----------------------------------------------------------------------------

    def register(
        self,
        spec_cls: type[SpecT],
        manager_cls: type[MgrT] | None,
        uniform_type_base_spec: type[KVCacheSpec] | None = None,
        *,
        capabilities: Capabilities | None = None,
        source: str = "user",
        manager_for: Callable[[SpecT], type[MgrT]] | None = None,
    ) -> None:
        """Register ``spec_cls`` to be run by ``manager_cls``.

        ``manager_for``: chooses the manager per spec instance (``manager_cls`` is still required: the
        class-level answer, for listings and vLLM's facade); each class it returns is checked like
        ``manager_cls`` when first chosen (``Registration.manager_for_spec``).

        ``uniform_type_base_spec``: the class whose layers may share a uniform-type group with this one
        (any spec class ``spec_cls`` derives from; default: ``spec_cls`` itself).
        Raises (and changes nothing): MissingManagerError, SpecProtocolError, SpecClassError,
        ManagerProtocolError, ManagerSignatureError, UniformBaseError, ConflictingRegistrationError,
        KVSpecTypeError. Registering the same triple again is a no-op.
        """
        with _INTROSPECTION_LOCK:
            entry = self._validate(spec_cls, manager_cls, uniform_type_base_spec, capabilities, source)
            if manager_for is not None:
                if not callable(manager_for):
                    raise KVSpecTypeError(
                        f"manager_for must be a callable spec -> manager class or None, got "
                        f"{type(manager_for).__name__}."
                    )
                entry = dataclasses.replace(entry, manager_for=manager_for)
        with self._lock:
            self._check_conflict(entry, self._entries)
            self._journal(spec_cls, self._entries.get(spec_cls))
            self._entries[spec_cls] = entry
            self._lookup_cache = _LookupCache(self)
        with _INTROSPECTION_LOCK:
            check_plugin_constructor(spec_cls)

    def _validate(
        self,
        spec_cls: object,
        manager_cls: object,
        base: object,
        capabilities: object,
        source: object,
    ) -> Registration[Any, Any]:
        """Every class-level check (kvspec.registry.checks), then this registry's bounds, in the order that
        names the first problem best (a spec passed as the manager is a ManagerProtocolError, not a bound)."""
        spec = require_class(spec_cls, "spec_cls")
        check_spec_class(spec)
        manager = check_manager_class(manager_cls, spec)
        bounds = self.bounds
        bounds.check_spec(spec)
        bounds.check_manager(manager, spec)
        base_cls = spec if base is None else require_class(base, "uniform_type_base_spec")
        check_uniform_base(spec, base_cls)
        if capabilities is not None and not isinstance(capabilities, Capabilities):
            raise KVSpecTypeError(
                f"capabilities must be a kvspec.Capabilities or None, got {type(capabilities).__name__}."
            )
        if not isinstance(source, str):
            raise KVSpecTypeError(f"source must be a str, got {type(source).__name__}.")
        return Registration(
            spec_cls=spec,
            manager_cls=manager,
            uniform_type_base_spec=base_cls,
            capabilities=capabilities,
            source=source,
            _manager_bound=bounds if bounds.manager is not None else None,
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

    def register_role_manager(self, role: str, manager_cls: type[MgrT]) -> None:
        """Run every KV cache group whose ``role`` is ``role`` with ``manager_cls`` (vLLM 0.34's
        ``register_role_manager``). The manager is checked like a spec's; registering another manager for a
        registered role raises ConflictingRegistrationError; the same one again is a no-op."""
        given: object = role
        if not isinstance(given, str) or not given:
            raise KVSpecTypeError(f"A group role is a non-empty str, got {role!r}.")
        with _INTROSPECTION_LOCK:
            checked: type[MgrT] = check_manager_class(manager_cls, KVCacheSpec)
            self.bounds.check_manager(checked, KVCacheSpec)
        with self._lock:
            old = self._role_managers.get(role)
            if old is not None and old is not checked:
                raise ConflictingRegistrationError(
                    f"Conflicting manager registration for group role {role!r}: already run by "
                    f"{old.__name__}; refused {checked.__name__}."
                )
            self._journal(role, old)
            self._role_managers[role] = checked

    def role_manager(self, role: str | None) -> type[MgrT] | None:
        """The manager registered for ``role`` (None: no role, or none registered)."""
        if role is None:
            return None
        with self._lock:
            return self._role_managers.get(role)

    def manager_for_group(self, spec: KVCacheSpec, role: str | None = None) -> type[MgrT]:
        """The manager that runs a group of ``spec`` with ``role``: the role's manager when one is
        registered, else the spec's (``manager_for`` per instance, else its class's). UnregisteredSpecError
        if neither applies."""
        by_role = self.role_manager(role)
        if by_role is not None:
            return by_role
        return self.require(spec).manager_for_spec(spec)

    def register_many(
        self, items: Sequence[tuple[type[SpecT], type[MgrT], type[KVCacheSpec] | None]]
    ) -> None:
        """Register several classes at once: all or none (each item is checked like ``register``)."""
        entries = []
        for item in items:
            triple: object = item
            if not isinstance(triple, tuple) or len(triple) != 3:
                raise KVSpecTypeError(
                    f"register_many takes (spec_cls, manager_cls, uniform_type_base_spec) triples, got {item!r}."
                )
            with _INTROSPECTION_LOCK:
                entries.append(self._validate(item[0], item[1], item[2], None, "user"))
        with self._lock:
            staged = dict(self._entries)
            for entry in entries:
                self._journal(entry.spec_cls, self._entries.get(entry.spec_cls))
            for entry in entries:
                self._check_conflict(entry, staged)
                staged[entry.spec_cls] = entry
            self._entries = staged
            self._lookup_cache = _LookupCache(self)
        for entry in entries:
            check_plugin_constructor(entry.spec_cls)

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
        if isinstance(spec_cls, type):
            self.bounds.check_spec(spec_cls)
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

    def get_manager_class(self, spec: KVCacheSpec, role: str | None = None) -> type[MgrT] | None:
        """The manager class for the spec *instance* (MRO lookup, cached; a registration's ``manager_for``
        decides per instance); a registered ``role``'s manager wins (vLLM 0.34). None if neither applies.

        Passing a class raises KVSpecTypeError (use ``lookup(cls)``): vLLM answers None, silently.
        """
        if role is not None:
            by_role = self.role_manager(role)
            if by_role is not None:
                return by_role
        manager: type[MgrT] | None = self._lookup_cache.managers[type(spec)]
        if manager is not None:
            entry = self._lookup_cache[type(spec)]
            if entry is not None and entry.manager_for is not None:
                return entry.manager_for_spec(spec)
        return manager

    def get_uniform_type_base_spec(self, spec: KVCacheSpec) -> type[KVCacheSpec] | None:
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
        # One lookup per spec class (a model has a handful over many layers); the layer-by-layer walk
        # that names the first unregistered layer runs only when some class is unknown.
        if all(self.lookup(cls) is not None for cls in {type(spec) for spec in layer_specs.values()}):
            return
        for layer_name, spec in layer_specs.items():
            self.require(spec, layer_name)

    def is_uniform_type(self, specs: Sequence[KVCacheSpec]) -> bool:
        """Whether ``specs`` can share one group as a uniform type (possibly with different page sizes).

        True when every spec has the same registered uniform base, the same block size, the same
        context-parallel sharding (``SpecTraits.context_parallel_sharded``: one block table cannot span a
        block of ``block_size`` tokens in some layers and ``block_size x DCP`` in others; vLLM 0.34), and
        the first spec's type-specific rule holds. Fixed on purpose: vLLM checks only that the others are
        instances of the *first* spec's base, which makes the answer depend on argument order.
        """
        if not specs:
            return True
        first_of_class = {type(spec): spec for spec in reversed(specs)}  # one lookup per class
        bases = {self.require(spec).uniform_type_base_spec for spec in first_of_class.values()}
        if len(bases) != 1:
            return False
        if len({spec.block_size for spec in specs}) != 1:
            return False
        if len({traits_of(spec).context_parallel_sharded for spec in specs}) > 1:
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
            return RegistrySnapshot(dict(self._entries), self._strict, dict(self._role_managers))

    def restore(self, snapshot: RegistrySnapshot[SpecT, MgrT]) -> None:
        """Replace every entry with the snapshot's; each entry is validated first (all or nothing)."""
        if not isinstance(snapshot, RegistrySnapshot):
            raise KVSpecTypeError(f"restore() takes a RegistrySnapshot, got {type(snapshot).__name__}.")
        for key, entry in snapshot.entries.items():
            checked: object = entry
            if not isinstance(checked, Registration) or entry.spec_cls is not key:
                raise RegistrationError(f"Snapshot entry for {key!r} is not a Registration of that class.")
            with _INTROSPECTION_LOCK:
                self._validate(
                    entry.spec_cls,
                    entry.manager_cls,
                    entry.uniform_type_base_spec,
                    entry.capabilities,
                    entry.source,
                )
        with self._lock:
            for key in set(self._entries) | set(snapshot.entries):
                if self._entries.get(key) is not snapshot.entries.get(key):
                    self._journal(key, self._entries.get(key))
            for role in set(self._role_managers) | set(snapshot.role_managers):
                if self._role_managers.get(role) is not snapshot.role_managers.get(role):
                    self._journal(role, self._role_managers.get(role))
            self._entries = dict(snapshot.entries)
            self._role_managers = dict(snapshot.role_managers)
            self._strict = snapshot.strict
            self._lookup_cache = _LookupCache(self)

    def _journal(self, spec_cls: type | str, previous: Any) -> None:
        """Record a change for the isolated() blocks the calling thread is inside (called under the lock)."""
        stack = self._journals.get(threading.get_ident())
        if stack:
            for journal in stack:
                journal.append((spec_cls, previous))

    @contextmanager
    def isolated(self, *, all_threads: bool = False) -> Iterator[Registry[SpecT, MgrT]]:
        """Undo the registrations this thread makes inside the ``with`` block (tests, trial plugins).

        Registrations other threads make meanwhile stay. ``all_threads=True`` restores the registry as it
        was on entry, whoever changed it (a test fixture that owns the whole process).
        """
        if all_threads:
            saved = self.snapshot()
            try:
                yield self
            finally:
                self.restore(saved)
            return
        tid = threading.get_ident()
        journal: list[tuple[type | str, Any]] = []
        with self._lock:
            self._journals.setdefault(tid, []).append(journal)
        try:
            yield self
        finally:
            with self._lock:
                stack = self._journals[tid]
                stack.remove(journal)
                if not stack:
                    del self._journals[tid]
                for key, previous in reversed(journal):
                    if isinstance(key, str):
                        _put_back(self._role_managers, key, previous)
                    else:
                        _put_back(self._entries, key, previous)
                # Outer blocks of this thread recorded the same changes with the same previous entries,
                # so undoing them again on their exit is consistent.
                self._lookup_cache = _LookupCache(self)

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


def _put_back(table: dict[Any, Any], key: object, previous: object) -> None:
    """Undo one journaled change: ``previous`` None means the key was absent."""
    if previous is None:
        table.pop(key, None)
    else:
        table[key] = previous


#: A registry of any parameterisation (``Registry`` is invariant in its type parameters, so APIs that only
#: look registrations up accept this rather than ``Registry[KVCacheSpec, KVCacheManager]``).
AnyRegistry = Registry[Any, Any]

#: The process-wide registry; kvspec.registry.builtins registers the built-in specs; plugins register into it.
default_registry: Registry[KVCacheSpec, KVCacheManager] = Registry(name="default")


def register_kv_cache_spec(
    manager_class: type[KVCacheManager] | None = None,
    *,
    uniform_type_base_spec: type[KVCacheSpec] | None = None,
    capabilities: Capabilities | None = None,
    registry: AnyRegistry | None = None,
) -> Callable[[type[SpecT]], type[SpecT]]:
    """Class decorator: register the decorated spec class (into the default registry unless given).

    Put it above ``@dataclass``. It returns the class itself, so mypy keeps its concrete type. Every
    check of :meth:`Registry.register` applies (a missing ``manager_class`` is a MissingManagerError).
    """
    target = default_registry if registry is None else registry

    def decorate(spec_cls: type[SpecT]) -> type[SpecT]:
        target.register(spec_cls, manager_class, uniform_type_base_spec, capabilities=capabilities)
        return spec_cls

    return decorate
