"""The one registry form of the named extension points (kvspec.named_registry): names, per-point checks,
replace, snapshot and restore, and declared typed options checked in one place with one wording."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvspec.errors import KVSpecError, OptionValueError, RegistrationError
from kvspec.named_registry import NamedRegistry, Option, declared_options, option_settings, read_options


class _Refused(RegistrationError):
    pass


class _Unknown(KVSpecError, LookupError):
    pass


def _registry(check: bool = True) -> NamedRegistry[int]:
    def positive(name: str, item: int) -> int:
        if item <= 0:
            raise _Refused(f"Widget {name!r}: {item} is not positive")
        return item

    return NamedRegistry(
        what="Widget",
        error=_Refused,
        unknown_error=_Unknown,
        register_with="acme.register_widget",
        example="gear",
        check=positive if check else None,
        reserved={"none": "it means no widget."},
    )


def test_register_resolve_replace_snapshot_restore() -> None:
    widgets = _registry()
    widgets.register("gear", 3, options=(Option(name="teeth", kind=int, default=12),), description="a gear")
    widgets.register("acme.cog", 5)
    assert widgets.names() == ("acme.cog", "gear")
    assert [e.name for e in widgets.entries()] == ["gear", "acme.cog"]  # registration order
    assert widgets.entry("gear").item == 3 and widgets.entry("gear").description == "a gear"
    saved = widgets.snapshot()
    with pytest.raises(_Refused, match="'gear' is already registered; pass replace=True"):
        widgets.register("gear", 4)
    widgets.register("gear", 3)  # the same item again is no conflict
    widgets.register("gear", 4, replace=True)
    assert widgets.entry("gear").item == 4
    widgets.restore(saved)
    assert widgets.entry("gear").item == 3
    with pytest.raises(
        _Unknown, match=r"Unknown widget 'wheel'; registered: none, acme\.cog, gear \(a plugin"
    ):
        widgets.entry("wheel")
    assert widgets.get("wheel") is None


@pytest.mark.parametrize(
    ("name", "item", "options", "message"),
    [
        ("Gear", 1, (), "Widget name 'Gear' must be dotted lower-case words like 'gear' or 'acme.gear'"),
        ("acme..x", 1, (), "must be dotted lower-case words"),
        ("none", 1, (), "Widget name 'none' is reserved: it means no widget"),
        ("gear", -1, (), "Widget 'gear': -1 is not positive"),
        ("gear", 1, ("teeth",), "options must be kvspec Option values"),
        ("gear", 1, (Option(name="teeth", kind=int, default=1.5),), "option 'teeth' must be a whole number"),
    ],
)
def test_refused_registrations_change_nothing(
    name: str, item: int, options: tuple[object, ...], message: str
) -> None:
    widgets = _registry()
    widgets.register("acme.cog", 5)
    before = widgets.snapshot()
    with pytest.raises(_Refused, match=message):
        widgets.register(name, item, options=options)  # type: ignore[arg-type]
    assert widgets.snapshot() == before


def test_options_are_checked_in_one_place_with_one_wording() -> None:
    options = (
        Option(name="teeth", kind=int, default=12),
        Option(name="ratio", kind=float, default=0.5),
        Option(name="metal", kind=str, default="steel", choices=("steel", "brass")),
    )
    owner = "Widget 'gear'"
    assert option_settings(owner, options, {}) == {"teeth": 12, "ratio": 0.5, "metal": "steel"}
    # A whole float is a whole number (command lines parse numbers as floats); an int is a float.
    assert option_settings(owner, options, {"teeth": 8.0, "ratio": 1, "metal": "brass"}) == {
        "teeth": 8,
        "ratio": 1.0,
        "metal": "brass",
    }
    cases: list[tuple[dict[str, object], str]] = [
        (
            {"tooth": 3},
            r"Widget 'gear' takes no option 'tooth'; its options: teeth \(default 12\), ratio \(default 0\.5\)",
        ),
        ({"teeth": 8.5}, r"Widget 'gear': option 'teeth' must be a whole number, got 8\.5"),
        ({"teeth": True}, "option 'teeth' must be a whole number, got True"),
        ({"ratio": "x"}, "option 'ratio' must be a number, got 'x'"),
        ({"metal": 3}, "option 'metal' must be a string, got 3"),
        ({"metal": "gold"}, "option 'metal' must be one of 'steel', 'brass', got 'gold'"),
    ]
    for given, message in cases:
        with pytest.raises(OptionValueError, match=message):
            option_settings(owner, options, given)


@dataclass(frozen=True, kw_only=True, slots=True)
class _GearOptions:
    teeth: int = 12
    ratio: float = 0.5


@dataclass(frozen=True, kw_only=True, slots=True)
class _NoDefault:
    teeth: int


def test_options_declared_as_a_dataclass() -> None:
    assert [(o.name, o.kind, o.default) for o in declared_options(_GearOptions)] == [
        ("teeth", int, 12),
        ("ratio", float, 0.5),
    ]
    assert read_options(_GearOptions, "Widget 'gear'", {"teeth": 20.0}) == _GearOptions(teeth=20, ratio=0.5)
    with pytest.raises(TypeError, match="must be an int, float or str with a default"):
        declared_options(_NoDefault)
    with pytest.raises(TypeError, match="is not a dataclass of options"):
        declared_options(int)
