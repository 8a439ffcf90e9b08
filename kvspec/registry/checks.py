"""Validation at the door: what registration checks about a spec class and a manager class.

Everything here runs once per registration (and per ``restore``), never per step. Each check names the
class, the member and what to do, with its own ``RegistrationError`` subclass, before anything changes:

- the spec class provides every ``KVCacheSpec`` member (the missing ones listed by name), its data
  members are properties or fields (not methods), its methods are methods (``merge`` a classmethod) that
  take the protocol's parameters, its optional trait hooks are methods, and it is frozen and hashable;
- the manager class provides every ``KVCacheManager`` member, each with the protocol's parameters (names,
  order, kinds, defaults) and compatible annotations, ``find_longest_cache_hit`` as a classmethod, and a
  constructor that takes one ``ManagerContext``;
- every capability the manager class declares (``manager_capabilities``) is a known one, and its hooks are
  there with that capability protocol's parameters (``kvspec.contracts.manager.MANAGER_CAPABILITIES``).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from kvspec.contracts.manager import MANAGER_CAPABILITIES, KVCacheManager, declared_capabilities
from kvspec.contracts.spec import KVCacheSpec, missing_members
from kvspec.errors import (
    KVSpecTypeError,
    ManagerProtocolError,
    ManagerSignatureError,
    MissingManagerError,
    SpecClassError,
    SpecProtocolError,
    UniformBaseError,
)

#: KVCacheSpec members that hold data (property or field), and the methods with their parameter names.
SPEC_DATA_MEMBERS = ("block_size", "page_size_bytes")
SPEC_METHODS: dict[str, tuple[str, ...]] = {
    "max_memory_usage_bytes": ("limits",),
    "copy_with_new_block_size": ("block_size",),
    "merge": ("specs",),
    "is_uniform_with_collection": ("specs",),
}
#: Optional spec hooks (kvspec.contracts.traits) and their parameter counts.
SPEC_OPTIONAL_METHODS: dict[str, int] = {"kv_cache_traits": 0, "to_full_attention": 1, "with_page_size": 1}
CLASSMETHODS_SPEC = frozenset({"merge"})
CLASSMETHODS_MANAGER = frozenset({"find_longest_cache_hit"})


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def require_class(value: object, role: str) -> type[Any]:
    if not isinstance(value, type):
        raise KVSpecTypeError(
            f"{role} must be a class, got {type(value).__name__} {value!r}; pass the class itself, not an instance."
        )
    return value


def check_spec_class(spec_cls: type) -> None:
    """Raise a RegistrationError subclass unless ``spec_cls`` can be registered as a KVCacheSpec."""
    name = qualified_name(spec_cls)
    missing = missing_members(spec_cls, KVCacheSpec)
    if missing:
        raise SpecProtocolError(
            f"{name} is not a KVCacheSpec: missing {', '.join(sorted(missing))}. "
            "Define them (see kvspec.KVCacheSpec), or derive from a built-in spec."
        )
    fields = {f.name for f in dataclasses.fields(spec_cls)} if dataclasses.is_dataclass(spec_cls) else set()
    for member in SPEC_DATA_MEMBERS:
        raw = inspect.getattr_static(spec_cls, member, None)
        if inspect.isfunction(raw) or isinstance(raw, (classmethod, staticmethod)):
            raise SpecClassError(
                f"{name}.{member} is a method; the KVCacheSpec protocol reads it as a value. Make it a "
                f"@property (or a dataclass field) returning int."
            )
    for member, params in SPEC_METHODS.items():
        raw = inspect.getattr_static(spec_cls, member, None)
        if isinstance(raw, property) or (
            raw is not None and not _is_callable_member(raw) and member not in fields
        ):
            raise SpecClassError(
                f"{name}.{member} must be a method taking ({', '.join(params)}), got {type(raw).__name__}."
            )
        if member in CLASSMETHODS_SPEC and not isinstance(raw, _CLASSMETHODS):
            raise SpecClassError(
                f"{name}.{member} must be a @classmethod (called as {spec_cls.__name__}.merge(specs))."
            )
        _check_arity(spec_cls, member, len(params), SpecClassError)
        if raw is not None and member not in fields:
            _check_annotations(spec_cls, member, f"{name}.{member}", KVCacheSpec, SpecClassError)
    for member in SPEC_DATA_MEMBERS:
        _check_data_member_type(spec_cls, member)
    for member, count in SPEC_OPTIONAL_METHODS.items():
        raw = inspect.getattr_static(spec_cls, member, None)
        if raw is None:
            continue
        if not _is_callable_member(raw):
            raise SpecClassError(
                f"{name}.{member} must be a method (kvspec.contracts.traits hook), got {type(raw).__name__}."
            )
        _check_arity(spec_cls, member, count, SpecClassError)
    if getattr(spec_cls, "__hash__", None) is None:
        raise SpecClassError(
            f"{name} is not hashable (specs are dict keys when layers are grouped). Use "
            "@dataclass(frozen=True, kw_only=True) or define __hash__."
        )
    if dataclasses.is_dataclass(spec_cls):
        dc_params: Any = getattr(spec_cls, "__dataclass_params__", None)
        if dc_params is not None and not dc_params.frozen:
            raise SpecClassError(
                f"{name} is a mutable dataclass; specs must be immutable values. Use @dataclass(frozen=True, ...)."
            )
    elif vars(object)["__setattr__"] is getattr(spec_cls, "__setattr__", None):
        raise SpecClassError(
            f"{name} is mutable: a spec must be an immutable value. Make it a frozen dataclass "
            "(@dataclass(frozen=True, kw_only=True))."
        )


def check_uniform_base(spec_cls: type, base: type) -> None:
    if not issubclass(spec_cls, base):
        raise UniformBaseError(
            f"{qualified_name(spec_cls)} must inherit from its declared uniform_type_base_spec "
            f"{qualified_name(base)}."
        )


def check_manager_class(manager_cls: object, spec_cls: type) -> type[Any]:
    """Raise a RegistrationError subclass unless ``manager_cls`` can run ``spec_cls``."""
    if manager_cls is None:
        raise MissingManagerError(
            f"Registering {qualified_name(spec_cls)}: manager_class is required; pass the KVCacheManager "
            "class that runs this spec type."
        )
    cls = require_class(manager_cls, f"manager_class for {spec_cls.__name__}")
    name = qualified_name(cls)
    missing = missing_members(cls, KVCacheManager)
    if missing:
        raise ManagerProtocolError(
            f"{name} (manager for {spec_cls.__name__}) is not a KVCacheManager: missing "
            f"{', '.join(sorted(missing))}. Subclass kvspec.SingleTypeKVCacheManager to inherit them."
        )
    for member in sorted(typing_members(KVCacheManager)):
        _check_manager_member(cls, member)
    check_capabilities(cls)
    return cls


def check_capabilities(cls: type) -> None:
    """ManagerProtocolError unless every capability ``cls`` declares is known and all its hooks are there;
    ManagerSignatureError when a hook's parameters are not the capability protocol's."""
    name = qualified_name(cls)
    declared = declared_capabilities(cls)
    unknown = sorted(declared - MANAGER_CAPABILITIES.keys())
    if unknown:
        raise ManagerProtocolError(
            f"{name} declares unknown capability(ies) {', '.join(unknown)} in manager_capabilities; the "
            f"capabilities are: {', '.join(sorted(MANAGER_CAPABILITIES))}."
        )
    for capability in sorted(declared):
        proto = MANAGER_CAPABILITIES[capability]
        missing = missing_members(cls, proto)
        if missing:
            raise ManagerProtocolError(
                f"{name} declares the {capability!r} capability but lacks {', '.join(sorted(missing))} "
                f"({proto.__name__}); implement it or drop {capability!r} from manager_capabilities."
            )
        for member in sorted(typing_members(proto) - {"__init__"}):
            if callable(inspect.getattr_static(proto, member, None)):  # a method, not a property or field
                _check_manager_member(cls, member, proto)


def typing_members(proto: type) -> frozenset[str]:
    import typing_extensions

    return frozenset(typing_extensions.get_protocol_members(proto)) | {"__init__"}


def _is_callable_member(raw: object) -> bool:
    return inspect.isfunction(raw) or isinstance(raw, (classmethod, staticmethod)) or callable(raw)


def _check_arity(cls: type, member: str, count: int, error: type[Exception]) -> None:
    """``member`` accepts exactly ``count`` positional arguments besides self/cls."""
    try:
        sig = inspect.signature(getattr(cls, member))
    except (TypeError, ValueError):
        return
    params = [p for p in _params(cls, member) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in params if p.default is p.empty]
    has_varargs = any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())
    if len(required) > count or (len(params) < count and not has_varargs):
        raise error(
            f"{qualified_name(cls)}.{member}{sig} must take {count} argument(s) besides self "
            f"({', '.join(SPEC_METHODS.get(member, ())) or 'see kvspec.contracts.traits'})."
        )


#: A classmethod as a Python class stores it, and as a mypyc-compiled class does.
_CLASSMETHODS: tuple[type, ...] = (classmethod, types.ClassMethodDescriptorType)


def _params(cls: type, member: str) -> list[inspect.Parameter]:
    """Parameters of ``cls.member`` as a caller sees them (without self; classmethods are bound)."""
    params = list(inspect.signature(getattr(cls, member)).parameters.values())
    if not isinstance(inspect.getattr_static(cls, member), (*_CLASSMETHODS, staticmethod)):
        params = params[1:]
    return params


def _check_manager_member(cls: type, member: str, proto: type = KVCacheManager) -> None:
    name = qualified_name(cls)
    raw = inspect.getattr_static(cls, member, None)
    if member in CLASSMETHODS_MANAGER and not isinstance(raw, _CLASSMETHODS):
        raise ManagerSignatureError(
            f"{name}.{member} must be a @classmethod (the coordinator calls it on the class, once for all "
            "groups that share a spec)."
        )
    if member != "__init__" and (isinstance(raw, property) or not _is_callable_member(raw)):
        raise ManagerSignatureError(f"{name}.{member} must be a method, got {type(raw).__name__}.")
    try:
        impl = inspect.signature(getattr(cls, member))
        impl_params = _params(cls, member)
    except (TypeError, ValueError):
        return
    expected = _params(proto, member)
    shown = f"{name}.{member}{impl}"
    want = f"({', '.join(p.name for p in expected)})"
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in impl_params):
        return  # *args/**kwargs forwarders accept whatever the protocol passes
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in impl_params if p.default is p.empty and p.kind in positional]
    if len(required) > len(expected):
        raise ManagerSignatureError(
            f"{shown} takes {len(required)} required parameter(s); the {proto.__name__} protocol passes "
            f"{len(expected)}: {member}{want}."
        )
    if len(impl_params) < len(expected):
        raise ManagerSignatureError(
            f"{shown} takes {len(impl_params)} parameter(s); the {proto.__name__} protocol passes "
            f"{len(expected)}: {member}{want}."
        )
    for i, (got, exp) in enumerate(zip(impl_params, expected)):
        # A positional-only protocol parameter's name is not part of the contract (vLLM names some of them
        # differently, and a port keeps vLLM's); the annotation check below still compares its type.
        if got.name != exp.name and exp.kind is not exp.POSITIONAL_ONLY:
            raise ManagerSignatureError(
                f"{shown}: parameter {i + 1} is {got.name!r}, the protocol's is {exp.name!r} "
                f"({member}{want}); the coordinator passes arguments by position, so a different order "
                "would silently mix them up."
            )
        if exp.default is not exp.empty and got.default is got.empty:
            raise ManagerSignatureError(
                f"{shown}: parameter {got.name!r} needs the default {exp.default!r} (the coordinator may omit it)."
            )
    for extra in impl_params[len(expected) :]:
        if extra.default is extra.empty:
            raise ManagerSignatureError(
                f"{shown}: extra parameter {extra.name!r} has no default; the protocol passes only {member}{want}."
            )
    _check_annotations(cls, member, shown, proto)


def _hints(fn: Callable[..., Any], owner: type) -> dict[str, Any] | None:
    import sys

    module = sys.modules.get(owner.__module__)
    try:
        return typing.get_type_hints(fn, globalns=vars(module) if module else None)
    except Exception:
        return None  # unresolvable annotations are not ours to judge


def _origin(hint: Any) -> type | None:
    """The class an annotation names (``list`` for ``list[int]``); None for what names no one class (``Any``,
    a union, a type variable), which is then not compared."""
    if hint is Any:  # a class since Python 3.11, but it stands for every class
        return None
    origin = typing.get_origin(hint) or hint
    if origin is typing.Union or origin is types.UnionType:
        return None
    return origin if isinstance(origin, type) else None


def _related(a: type, b: type) -> bool:
    if a is b:
        return True
    try:
        return issubclass(a, b) or issubclass(b, a)
    except TypeError:
        return True


def _check_data_member_type(spec_cls: type, member: str) -> None:
    """A spec's ``block_size`` / ``page_size_bytes`` declared (property return, or field annotation) as a
    class unrelated to the protocol's ``int``: the planner would compute with it."""
    raw = inspect.getattr_static(spec_cls, member, None)
    if isinstance(raw, property) and raw.fget is not None:
        hints = _hints(raw.fget, spec_cls)
        hint = None if hints is None else hints.get("return")
        what = "property returns"
    else:
        hint = _field_hint(spec_cls, member)
        what = "field is declared"
    got = _origin(hint) if hint is not None else None
    if got is not None and got is not type(None) and not _related(got, int):
        raise SpecClassError(
            f"{qualified_name(spec_cls)}.{member}: the {what} {_show(hint)}, the KVCacheSpec protocol's is int "
            f"({'tokens per block' if member == 'block_size' else 'bytes per block'}). Make it an int."
        )


def _field_hint(cls: type, member: str) -> Any:
    """The annotation of field ``member`` in ``cls``'s MRO (resolved; None where it cannot be)."""
    import sys

    for klass in cls.__mro__:
        if member in vars(klass).get("__annotations__", {}):
            module = sys.modules.get(klass.__module__)
            try:
                return typing.get_type_hints(klass, globalns=vars(module) if module else None).get(member)
            except Exception:
                return None
    return None


def _check_annotations(
    cls: type,
    member: str,
    shown: str,
    proto: type = KVCacheManager,
    error: type[Exception] = ManagerSignatureError,
) -> None:
    """Annotations that name unrelated classes (``int`` where the protocol says ``str``, ``float`` where it
    returns ``int``): the coordinator or the planner would pass or receive the wrong thing."""
    impl_fn = getattr(cls, member)
    proto_fn = getattr(proto, member)
    got, want = _hints(impl_fn, cls), _hints(proto_fn, proto)
    if not got or not want:
        return
    # The protocol's name -> the implementation's name for the same argument: a positional-only protocol
    # parameter (whose name a port may change) is the parameter at its position, since the caller passes it
    # by position; any other, the parameter of its name.
    pairs = {"return": "return"}
    try:
        impl_params, proto_params = _params(cls, member), _params(proto, member)
    except (TypeError, ValueError):
        impl_params, proto_params = [], []
    for i, exp in enumerate(proto_params):
        if exp.kind is exp.POSITIONAL_ONLY:
            if i < len(impl_params) and impl_params[i].kind in (
                exp.POSITIONAL_ONLY,
                exp.POSITIONAL_OR_KEYWORD,
            ):
                pairs[exp.name] = impl_params[i].name
        else:
            pairs[exp.name] = exp.name
    for key, expected in want.items():
        mine = pairs.get(key)
        if mine is None or mine not in got:
            continue
        a, b = _origin(got[mine]), _origin(expected)
        if a is None or b is None or a is type(None) or b is type(None):
            continue
        if not _related(a, b):
            what = "returns" if key == "return" else f"takes {mine}:"
            raise error(
                f"{shown} {what} {_show(got[mine])}, the protocol's is {_show(expected)}. "
                f"Match kvspec.{proto.__name__}'s annotation."
            )


def _show(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
