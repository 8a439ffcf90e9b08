"""One registry form for kvspec's named extension points: model families, routers, offload tiers, eviction
policies (specs keep their typed ``Registry[S, M]``).

A :class:`NamedRegistry` maps a name (dotted lower-case words: ``"kv_cost"``, ``"acme.slo"``) to an
:class:`Entry`: the registered item (a factory or a family object), the options it declares
(:class:`Option`: name, type, default) and a one-line description. Every registry checks the same things
the same way, with the extension point's own error class:

- a name that is not dotted lower-case words, or one reserved, is refused;
- the item passes the extension point's own check (``check``: a router's factory builds a router on a small
  context, say), or is refused naming what is wrong;
- a name already taken is refused unless ``replace=True``;
- options given to an entry are validated in one place (:meth:`Entry.settings`): an unknown option and a
  value of the wrong type get the same message everywhere, naming the option, the entry and what it takes.

Nothing changes when a registration is refused. Registries are thread-safe; ``snapshot``/``restore`` let a
test put one back as it was. Built-ins register beside their code, one line each.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from kvspec.errors import KVSpecError, OptionValueError

T = TypeVar("T")
D = TypeVar("D")
OptionValue = int | float | str

_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
_KIND_WORDS: dict[type, str] = {int: "a whole number", float: "a number", str: "a string"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Option:
    """An option an entry declares: its ``name``, the ``kind`` of its value (``int``, ``float`` or ``str``),
    its ``default`` and, for a string, the ``choices`` it may take (empty: any)."""

    name: str
    kind: type[int] | type[float] | type[str]
    default: OptionValue
    description: str = ""
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        shown = f"{self.default:g}" if isinstance(self.default, float) else repr(self.default)
        return f"{self.name} (default {shown})"

    def coerce(self, value: object, owner: str, error: type[KVSpecError] = OptionValueError) -> OptionValue:
        """``value`` as this option's kind; ``error`` (an ``OptionValueError`` unless the extension point
        names its own) naming the option and ``owner`` when it is not one (a bool is never a number; a whole
        float is a whole number)."""
        ok: OptionValue | None = None
        if self.kind is str:
            ok = value if isinstance(value, str) else None
        elif isinstance(value, int | float) and not isinstance(value, bool):
            if self.kind is float:
                ok = float(value)
            elif float(value).is_integer():
                ok = int(value)
        if ok is None:
            raise error(f"{owner}: option {self.name!r} must be {_KIND_WORDS[self.kind]}, got {value!r}.")
        if self.choices and ok not in self.choices:
            raise error(
                f"{owner}: option {self.name!r} must be one of {', '.join(map(repr, self.choices))}, got {ok!r}."
            )
        return ok


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry(Generic[T]):
    """A registration: ``name``, the ``item`` registered, its declared ``options`` and a ``description``.
    ``what`` is the extension point in words ("Router"), for messages."""

    name: str
    item: T
    options: tuple[Option, ...] = ()
    description: str = ""
    what: str = "Entry"
    option_error: type[KVSpecError] = OptionValueError

    @property
    def option_names(self) -> frozenset[str]:
        return frozenset(o.name for o in self.options)

    def settings(self, given: Mapping[str, object]) -> dict[str, OptionValue]:
        """Every declared option's value (:func:`option_settings`)."""
        return option_settings(f"{self.what} {self.name!r}", self.options, given, self.option_error)


def option_settings(
    owner: str,
    options: Sequence[Option],
    given: Mapping[str, object],
    error: type[KVSpecError] = OptionValueError,
) -> dict[str, OptionValue]:
    """Every option in ``options`` with its value: ``given``'s, checked, else the default. An option
    ``owner`` does not declare, or a value of the wrong kind, is ``error`` naming it and what ``owner``
    takes: the one wording of every extension point."""
    names = {o.name for o in options}
    unknown = sorted(set(given) - names)
    if unknown:
        takes = ", ".join(o.describe() for o in options) or "none"
        raise error(f"{owner} takes no option {', '.join(map(repr, unknown))}; its options: {takes}.")
    return {o.name: o.coerce(given[o.name], owner, error) if o.name in given else o.default for o in options}


def declared_options(settings: type[Any]) -> tuple[Option, ...]:
    """The options a settings dataclass declares: one per field, its annotation (``int``, ``float`` or
    ``str``) the kind, its default the default. Every field needs a default."""
    if not dataclasses.is_dataclass(settings):
        raise TypeError(f"{settings!r} is not a dataclass of options")
    hints = typing.get_type_hints(settings)
    out = []
    for f in dataclasses.fields(settings):
        kind = hints[f.name]
        if kind not in (int, float, str) or f.default is dataclasses.MISSING:
            raise TypeError(
                f"option {f.name!r} of {settings.__name__} must be an int, float or str with a default"
            )
        out.append(Option(name=f.name, kind=kind, default=f.default))
    return tuple(out)


def read_options(
    settings: type[D], owner: str, given: Mapping[str, object], error: type[KVSpecError] = OptionValueError
) -> D:
    """``settings`` (a dataclass of options, :func:`declared_options`) built from ``given``: the values
    checked by :func:`option_settings`, the defaults for the rest."""
    return settings(**option_settings(owner, declared_options(settings), given, error))


class NamedRegistry(Generic[T]):
    """Names -> entries for one extension point (see the module docstring).

    ``what``: the extension point in words ("Router"); ``error``: the class a refused registration raises;
    ``unknown_error``: the class an unknown name raises; ``option_error``: the class a bad option raises
    (an ``OptionValueError`` subclass); ``check(name, item)``: the extension point's own
    check, returning the item (raise ``error`` to refuse); ``register_with``: the call a plugin registers
    more with, for the unknown-name message; ``example``: a name for the bad-name message; ``reserved``:
    names no registration may take, each with the reason."""

    def __init__(
        self,
        *,
        what: str,
        error: type[KVSpecError],
        unknown_error: type[KVSpecError],
        register_with: str,
        example: str,
        check: Callable[[str, T], T] | None = None,
        reserved: Mapping[str, str] | None = None,
        option_error: type[KVSpecError] = OptionValueError,
    ) -> None:
        self.what = what
        self._error = error
        self._unknown = unknown_error
        self._register_with = register_with
        self._example = example
        self._check = check
        self._reserved = dict(reserved or {})
        self._option_error = option_error
        self._lock = threading.Lock()
        self._entries: dict[str, Entry[T]] = {}

    def register(
        self,
        name: str,
        item: T,
        *,
        options: Iterable[Option] = (),
        description: str = "",
        replace: bool = False,
    ) -> Entry[T]:
        """Register ``item`` under ``name`` with its declared ``options``. A name already taken by another
        item is refused unless ``replace``; nothing changes when the registration is refused."""
        given: object = name
        if not isinstance(given, str) or not _NAME.match(given):
            raise self._error(
                f"{self.what} name {name!r} must be dotted lower-case words like {self._example!r} or "
                f"'acme.{self._example}'."
            )
        if name in self._reserved:
            raise self._error(f"{self.what} name {name!r} is reserved: {self._reserved[name]}")
        given_options: object = options
        declared = tuple(options)
        if isinstance(given_options, str) or not all(isinstance(o, Option) for o in declared):
            raise self._error(
                f"{self.what} {name!r}: options must be kvspec Option values (name, kind, default), "
                f"got {options!r}."
            )
        for option in declared:
            option.coerce(option.default, f"{self.what} {name!r}", self._error)  # a default of the wrong kind
        checked = self._check(name, item) if self._check is not None else item
        entry = Entry(
            name=name,
            item=checked,
            options=declared,
            description=description,
            what=self.what,
            option_error=self._option_error,
        )
        with self._lock:
            taken = self._entries.get(name)
            if taken is not None and not replace and taken.item != item:
                raise self._error(
                    f"{self.what} {name!r} is already registered; pass replace=True to replace it."
                )
            self._entries[name] = entry
        return entry

    def builtin(
        self, name: str, *, options: Iterable[Option] = (), description: str = ""
    ) -> Callable[[T], T]:
        """A decorator registering the decorated item under ``name`` (a built-in's one line)."""

        def register(item: T) -> T:
            self.register(name, item, options=options, description=description)
            return item

        return register

    def entry(self, name: str) -> Entry[T]:
        """The entry of ``name``; the extension point's unknown-name error listing the registered ones."""
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            raise self._unknown(
                f"Unknown {self.what.lower()} {name!r}; registered: {', '.join((*self._reserved, *self.names()))} (a plugin "
                f"registers more with {self._register_with})."
            )
        return entry

    def item(self, name: str) -> T:
        """What ``name`` registered (:meth:`entry`'s ``item``; the same unknown-name error)."""
        return self.entry(name).item

    def get(self, name: str) -> Entry[T] | None:
        with self._lock:
            return self._entries.get(name)

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        with self._lock:
            return tuple(sorted(self._entries))

    def entries(self) -> tuple[Entry[T], ...]:
        """The entries in registration order (built-ins first, in the order their modules register)."""
        with self._lock:
            return tuple(self._entries.values())

    def snapshot(self) -> Mapping[str, Entry[T]]:
        """The registrations now (read-only), for :meth:`restore` (tests)."""
        with self._lock:
            return MappingProxyType(dict(self._entries))

    def restore(self, saved: Mapping[str, Entry[T]]) -> None:
        """Put back the registrations a :meth:`snapshot` saw."""
        with self._lock:
            self._entries.clear()
            self._entries.update(saved)


__all__ = [
    "Entry",
    "NamedRegistry",
    "Option",
    "OptionValue",
    "OptionValueError",
    "declared_options",
    "option_settings",
    "read_options",
]
