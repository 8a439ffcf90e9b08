"""kvspec inside vLLM: spec conversion both ways and a registry facade with vLLM's names.

Importable without vLLM; the conversions *to* vLLM import it when called. Every decision stays
kvspec's: the facade only translates names and exception bases (vLLM asserts where kvspec raises
``RegistrationError``, and raises ``ValueError`` where kvspec raises ``UnregisteredSpecError``), and
a plugin spec's ``max_memory_usage_bytes(vllm_config)`` runs as it is (kvspec's ``SchedulerLimits`` carries
the parts of vLLM's config it reads: ``kvspec.contracts.vllm_config``). The scheduler-facing adapter is
``kvspec.integrations.vllm_kv_cache_manager``.

Not here: vLLM-style managers (subclasses of vLLM's own ``SingleTypeKVCacheManager``); a plugin's manager
is a kvspec manager (``kvspec.managers``), or none (it inherits its base spec's).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kvspec import specs as kvspec_specs
from kvspec.contracts.manager import KVCacheManager
from kvspec.contracts.spec import KVCacheSpec
from kvspec.errors import (
    RegistrationError,
    SpecConversionError,
    UnregisteredSpecError,
    VllmRegistrationError,
    VllmSpecLookupError,
)
from kvspec.registry.builtins import default_registry
from kvspec.registry.core import AnyRegistry, Registration
from kvspec.specs.dtypes import KVQuantMode
from kvspec.specs.uniform import UniformTypeKVCacheSpecs

VLLM_SPECS_MODULE = "vllm.v1.kv_cache_interface"
#: The built-in spec classes both libraries define (vLLM 0.23 or 0.34), by their shared name.
SPEC_CLASS_NAMES = (
    "FullAttentionSpec",
    "TQFullAttentionSpec",
    "MLAAttentionSpec",
    "HiddenStateCacheSpec",
    "SinkFullAttentionSpec",
    "SlidingWindowSpec",
    "SlidingWindowMLASpec",
    "ChunkedLocalAttentionSpec",
    "MambaSpec",
    "EncoderOnlyAttentionSpec",
    "CrossAttentionSpec",
    # vLLM 0.34's: converting one to an older vLLM is refused with the installed version named.
    "RSWASpec",
    "CircularBufferSpec",
)

_C = TypeVar("_C", bound=type)


# -- specs, both ways -------------------------------------------------------------------------------


def _vllm_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise SpecConversionError(
            f"Converting to vLLM's specs needs vLLM installed ({name} did not import: {exc})."
        ) from exc


def convert_value(name: str, value: Any, target_field: dataclasses.Field[Any], to_vllm: bool) -> Any:
    if name == "kv_quant_mode":
        if to_vllm:
            mode_cls = _vllm_module(VLLM_SPECS_MODULE).KVQuantMode
            return mode_cls(int(value))
        return KVQuantMode(int(value))
    if (
        name == "head_size_v"
        and not to_vllm
        and value == 0
        and not target_field.metadata.get("zero_means_no_value_head")
    ):
        return None  # vLLM 0.34's MLA says "no separate V head" with 0; kvspec's latent specs with None
    if name == "mamba_type":
        if to_vllm:
            backend = _vllm_module("vllm.v1.attention.backends.registry").MambaAttentionBackendEnum
            return backend[str(value).upper()]
        return value.name.lower() if isinstance(value, enum.Enum) else str(value)
    return value


def _convert(spec: Any, target_cls: type, to_vllm: bool) -> Any:
    """``spec``'s fields copied into ``target_cls``, then its page checked: both sides must size a block
    alike (vLLM 0.34 sizes pages from other fields than 0.23 and kvspec; see ``_to_vllm_034_fields``)."""
    if not dataclasses.is_dataclass(target_cls) or not dataclasses.is_dataclass(spec):
        raise SpecConversionError(f"{type(spec).__name__} is not a dataclass spec; it cannot be converted.")
    kwargs: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(target_cls) if f.init}
    for name, f in fields.items():
        if hasattr(spec, name):
            kwargs[name] = convert_value(name, getattr(spec, name), f, to_vllm)
    if not to_vllm and "shapes" in kwargs and "dtypes" in kwargs:
        kwargs["shapes"] = _vllm_state_shapes(kwargs["shapes"], kwargs["dtypes"])
    if to_vllm and "state_content_bytes" in fields:
        _to_vllm_034_fields(spec, fields, kwargs)
    tokens_per_state = getattr(spec, "tokens_per_state", None)
    if not to_vllm and "compress_ratio" in fields and isinstance(tokens_per_state, int):
        kwargs["compress_ratio"] = max(tokens_per_state, 1)
    converted = target_cls(**kwargs)
    if to_vllm and "state_content_bytes" in fields and "page_size_padded" in fields:
        ours, theirs = _page_bytes(spec), _page_bytes(converted)
        if (
            ours is not None
            and theirs is not None
            and ours > theirs
            and getattr(spec, "page_size_padded", 0) is None
        ):
            # Bytes vLLM 0.34 moved out of the spec (per-token-head scales into the attention backend,
            # fp8_ds_mla's layout into state_content_bytes): the block keeps kvspec's size as padding.
            kwargs["page_size_padded"] = ours
            converted = target_cls(**kwargs)
    if (
        not to_vllm
        and kwargs.get("cache_dtype_str") is not None
        and getattr(spec, "state_content_bytes", 0) is None
        and _page_bytes(converted) != _page_bytes(spec)
    ):
        # vLLM 0.34 sizes a packed page from state_content_bytes; cache_dtype_str alone (fp8_ds_mla without
        # it) labels the dtype and sizes nothing there, so it sizes nothing in kvspec's spec either.
        kwargs["cache_dtype_str"] = None
        converted = target_cls(**kwargs)
    if not to_vllm and "page_size_padded" in fields and kwargs.get("page_size_padded") is not None:
        unpadded = getattr(converted, "unpadded_page_size_bytes", None)
        if unpadded == kwargs["page_size_padded"]:  # a padding equal to the page is no padding
            kwargs["page_size_padded"] = None
            converted = target_cls(**kwargs)
    ours, theirs = _page_bytes(spec), _page_bytes(converted)
    if ours is not None and theirs is not None and ours != theirs:
        raise SpecConversionError(
            f"{type(spec).__name__} converts to a {theirs}-byte block but is a {ours}-byte block "
            f"({qualified_name(type(spec))}): a field that sizes the page has no counterpart on the other "
            "side; convert it with the plugin's own converter (spec_converter=)."
        )
    return converted


def _page_bytes(spec: Any) -> int | None:
    try:
        return int(spec.page_size_bytes)
    except Exception:  # a spec whose page depends on the engine (e.g. a Mamba spec without shapes)
        return None


def _to_vllm_034_fields(spec: Any, fields: dict[str, dataclasses.Field[Any]], kwargs: dict[str, Any]) -> None:
    """vLLM 0.34's names for what kvspec's fields say: a latent spec (vLLM's ``head_size_v`` defaults to
    0 there) has no separate V head, and a compression ratio is ``tokens_per_state``."""
    head_size_v = fields.get("head_size_v")
    if head_size_v is not None and head_size_v.default == 0:
        kwargs["head_size_v"] = 0
    ratio = getattr(spec, "compress_ratio", 1)
    if "tokens_per_state" in fields and isinstance(ratio, int) and ratio > 1:
        kwargs["tokens_per_state"] = ratio


def _vllm_state_shapes(shapes: Any, dtypes: Any) -> Any:
    """vLLM's MambaSpec reads its states as ``zip(shapes, dtypes)`` and checks neither: a state beyond the
    last dtype does not exist for vLLM, and a bare int n is the 1-d shape (n,)."""
    if not isinstance(shapes, tuple) or not isinstance(dtypes, tuple):
        return shapes
    return tuple((v,) if isinstance(v, int) else tuple(v) for v in shapes[: len(dtypes)])


#: A plugin's own conversion of a vLLM-side spec: kvspec's spec, or None when the spec is not one it knows.
SpecConverter = Callable[[Any], "KVCacheSpec | None"]

#: The class attribute by which a plugin's kvspec spec class names the vLLM-side class it mirrors
#: (``"package.module.ClassName"``); ``to_kvspec`` then copies the fields across, as for the built-ins.
VLLM_COUNTERPART_ATTRIBUTE = "vllm_counterpart"


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_vllm_side(cls: type) -> bool:
    """True when ``cls`` or one of its bases comes from vLLM's package: vLLM's own specs and a platform's
    specs written for vLLM (``vllm_ascend``'s subclass vLLM's ``MLAAttentionSpec``). A class built on
    kvspec's specs only is kvspec's, wherever its module lives."""
    return any(base.__module__.split(".")[0] == "vllm" for base in cls.__mro__)


def _registered_counterpart(cls: type, registry: AnyRegistry) -> type | None:
    name = qualified_name(cls)
    for registration in registry.registrations():
        # Declared on the class itself: a subclass of a mirroring class mirrors nothing by inheritance.
        if registration.spec_cls.__dict__.get(VLLM_COUNTERPART_ATTRIBUTE) == name:
            return registration.spec_cls
    return None


def _adopted_class(cls: type, registry: AnyRegistry) -> Any:
    """The kvspec class adopting ``cls``, or the platform class it derives from (``vllm_adoption``): the
    registration whose class declares ``vllm_class``, nearest in ``cls``'s MRO; None if none adopts it."""
    adopted = {
        getattr(r.spec_cls, "vllm_class", None): r.spec_cls
        for r in registry.registrations()
        if "vllm_class" in vars(r.spec_cls)
    }
    for klass in cls.__mro__:
        if klass in adopted:
            return adopted[klass]
    return None


def to_kvspec(
    spec: Any, *, converter: SpecConverter | None = None, registry: AnyRegistry | None = None
) -> KVCacheSpec:
    """The kvspec spec for a vLLM-side ``spec`` (uniform groups too), found in this order:

    1. ``converter(spec)``, when given and it returns a spec (a plugin's own conversion);
    2. the object itself, held by the class that adopted its platform class from vLLM's registry
       (``kvspec.integrations.vllm_adoption``: its methods stay the platform's);
    3. the built-in spec of the same class name (vLLM's eleven classes), fields copied;
    4. the spec class registered in ``registry`` (the default registry when None) whose
       ``vllm_counterpart`` is ``spec``'s qualified class name, fields copied.

    A spec none of these knows raises ``SpecConversionError`` naming the ways to teach it.
    """
    if converter is not None:
        converted_by_plugin = converter(spec)
        if converted_by_plugin is not None:
            return converted_by_plugin
    cls = type(spec)
    name = cls.__name__
    adopted = _adopted_class(cls, default_registry if registry is None else registry)
    if adopted is not None:
        held: KVCacheSpec = adopted(spec)
        return held
    if name == "UniformTypeKVCacheSpecs":
        inner = {
            layer: to_kvspec(s, converter=converter, registry=registry)
            for layer, s in spec.kv_cache_specs.items()
        }
        return UniformTypeKVCacheSpecs(block_size=spec.block_size, kv_cache_specs=inner)
    if name in SPEC_CLASS_NAMES:
        converted: KVCacheSpec = _convert(spec, getattr(kvspec_specs, name), to_vllm=False)
        return converted
    target = _registered_counterpart(cls, default_registry if registry is None else registry)
    if target is not None:
        mirrored: KVCacheSpec = _convert(spec, target, to_vllm=False)
        return mirrored
    raise SpecConversionError(
        f"No kvspec counterpart for vLLM spec {name} ({qualified_name(cls)}): register it in vLLM's "
        "KVCacheSpecRegistry from the platform's register_custom_kv_cache_specs (kvspec adopts it), register a "
        f"kvspec spec class with {VLLM_COUNTERPART_ATTRIBUTE} = {qualified_name(cls)!r} (its fields are copied "
        "across), or pass the plugin's converter (spec_converter=) to the adapter."
    )


def to_vllm(spec: KVCacheSpec) -> Any:
    """vLLM's spec of the same class name and fields as kvspec's ``spec`` (imports vLLM)."""
    module = _vllm_module(VLLM_SPECS_MODULE)
    name = type(spec).__name__
    if isinstance(spec, UniformTypeKVCacheSpecs):
        inner = {layer: to_vllm(s) for layer, s in spec.kv_cache_specs.items()}
        return module.UniformTypeKVCacheSpecs(block_size=spec.block_size, kv_cache_specs=inner)
    target = getattr(module, name, None) if name in SPEC_CLASS_NAMES else None
    if target is None:
        version = getattr(_vllm_module("vllm"), "__version__", "?")
        raise SpecConversionError(f"vLLM {version} defines no {name}; it cannot be converted.")
    return _convert(spec, target, to_vllm=True)


def as_kvspec(
    spec: Any, *, converter: SpecConverter | None = None, registry: AnyRegistry | None = None
) -> KVCacheSpec:
    """``spec`` converted (``to_kvspec``) when it is vLLM-side, as it is when it is kvspec's (or a kvspec
    plugin's). Decided by the class's bases, not isinstance (vLLM's spec classes satisfy kvspec's structural
    KVCacheSpec protocol) nor by the module's name alone (``vllm_ascend.*`` classes subclass vLLM's)."""
    if _is_vllm_side(type(spec)):
        return to_kvspec(spec, converter=converter, registry=registry)
    kept: KVCacheSpec = spec
    return kept


def to_kvspec_layers(
    layer_specs: Mapping[str, Any],
    *,
    converter: SpecConverter | None = None,
    registry: AnyRegistry | None = None,
) -> dict[str, KVCacheSpec]:
    """A vLLM ``{layer: spec}`` dict as kvspec specs (``to_kvspec`` on each)."""
    return {
        layer: to_kvspec(spec, converter=converter, registry=registry) for layer, spec in layer_specs.items()
    }


# -- the registry facade ----------------------------------------------------------------------------


class KVCacheSpecRegistry:
    """vLLM 0.23's ``KVCacheSpecRegistry`` (PR #37505) over a kvspec ``Registry`` (the default one).

    Same names, signatures and exception bases; kvspec's checks and messages. ``use(registry)`` points
    the facade at another kvspec registry (tests, isolated engines).
    """

    _registry: AnyRegistry = default_registry

    @classmethod
    def use(cls, registry: AnyRegistry) -> None:
        cls._registry = registry

    @classmethod
    def register(
        cls,
        kvcache_spec_cls: type[Any],
        manager_class: type[Any] | None = None,
        uniform_type_base_spec: type[Any] | None = None,
    ) -> None:
        try:
            cls._registry.register(kvcache_spec_cls, manager_class, uniform_type_base_spec)
        except RegistrationError as exc:
            raise VllmRegistrationError(str(exc)) from exc

    @classmethod
    def register_role_manager(cls, role: str, manager_class: type[Any]) -> None:
        """vLLM 0.34's role managers: every group with ``role`` runs ``manager_class``."""
        try:
            cls._registry.register_role_manager(str(role), manager_class)
        except RegistrationError as exc:
            raise VllmRegistrationError(str(exc)) from exc

    @classmethod
    def get_manager_class(cls, spec: Any, role: str | None = None) -> type[KVCacheManager] | None:
        """The spec's manager; a registered ``role``'s manager wins (vLLM 0.34's two-argument form)."""
        manager: type[KVCacheManager] | None = cls._registry.get_manager_class(
            spec, None if role is None else str(role)
        )
        return manager

    @classmethod
    def get_uniform_type_base_spec(cls, spec: Any) -> type[KVCacheSpec] | None:
        return cls._registry.get_uniform_type_base_spec(spec)

    @classmethod
    def lookup(cls, spec_cls: type[Any]) -> Registration[Any, Any] | None:
        return cls._registry.lookup(spec_cls)

    @classmethod
    def check_kv_cache_spec_registry(cls, kv_cache_specs: Mapping[str, Any]) -> None:
        """vLLM's classmethod form of :func:`check_kv_cache_spec_registry`."""
        check_kv_cache_spec_registry(kv_cache_specs)

    @classmethod
    def is_uniform_type(cls, kv_cache_specs: Mapping[str, Any]) -> bool:
        """vLLM's ``UniformTypeKVCacheSpecs.is_uniform_type``: kvspec's symmetric rule; an unregistered
        spec is an AssertionError, as in vLLM."""
        try:
            return cls._registry.is_uniform_type(list(kv_cache_specs.values()))
        except UnregisteredSpecError as exc:
            raise VllmRegistrationError(str(exc)) from exc


def check_kv_cache_spec_registry(kv_cache_specs: Mapping[str, Any]) -> None:
    """vLLM's check: every layer's spec type is registered; ValueError (kvspec's message) otherwise."""
    try:
        KVCacheSpecRegistry._registry.check(dict(kv_cache_specs))
    except UnregisteredSpecError as exc:
        raise VllmSpecLookupError(str(exc)) from exc


def register_kv_cache_spec(
    manager_class: type[Any] | None = None, uniform_type_base_spec: type[Any] | None = None
) -> Callable[[_C], _C]:
    """vLLM's decorator form (positional ``manager_class`` allowed, as in vLLM)."""

    def decorate(spec_cls: _C) -> _C:
        KVCacheSpecRegistry.register(spec_cls, manager_class, uniform_type_base_spec)
        return spec_cls

    return decorate


def apply_vllm_platform_hook(platform: Any, vllm_config: Any = None) -> None:
    """Run a vLLM platform's ``register_custom_kv_cache_specs(vllm_config)`` against the facade, atomically
    (a hook that raises leaves none of its registrations)."""
    hook = getattr(platform, "register_custom_kv_cache_specs", None)
    if not callable(hook):
        raise VllmRegistrationError(
            f"{type(platform).__name__} has no register_custom_kv_cache_specs(vllm_config) method."
        )
    with KVCacheSpecRegistry._registry.transaction():
        hook(vllm_config)


def add_kv_sharing_layers_to_kv_cache_groups(
    shared_kv_cache_layers: Mapping[str, str],
    kv_cache_groups: list[Any],
    runner_only_attn_layers: set[str] | None = None,
) -> None:
    """vLLM's worker utility, decided by ``kvspec.planning.add_kv_sharing_layers``: each sharing layer joins
    its target's group. vLLM's form mutates: the groups' ``layer_names`` lists are extended in place, and
    sharing layers are added to ``runner_only_attn_layers`` when given."""
    from kvspec.planning import add_kv_sharing_layers
    from kvspec.planning.config import KVCacheGroupSpec

    if not shared_kv_cache_layers:
        return
    ours = tuple(
        KVCacheGroupSpec(layer_names=tuple(g.layer_names), kv_cache_spec=to_kvspec(g.kv_cache_spec))
        for g in kv_cache_groups
    )
    decided = add_kv_sharing_layers(ours, shared_kv_cache_layers)
    for group, result in zip(kv_cache_groups, decided, strict=True):
        group.layer_names[:] = list(result.layer_names)
    if runner_only_attn_layers is not None:
        runner_only_attn_layers.update(shared_kv_cache_layers)
