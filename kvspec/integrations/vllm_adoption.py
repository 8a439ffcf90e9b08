"""A platform's own registrations in vLLM's registry, run on kvspec unchanged (adoption).

A hardware platform (vllm-ascend is the real one) registers its spec classes and managers in vLLM's
``KVCacheSpecRegistry`` from ``Platform.register_custom_kv_cache_specs(vllm_config)``, in its own code, against
vLLM's API. When kvspec takes over vLLM's KV cache (the adapter, the ``vllm serve`` plugin), it adopts every
registration there that is not one of vLLM's own built-ins, so the platform needs no kvspec code:

- **The spec stays the platform's object.** kvspec holds it in an :class:`AdoptedSpec`, a kvspec spec whose
  ``KVCacheSpec`` members are the object's own (page size, memory bound, merge, uniformity: kvspec's protocols
  are structural). What kvspec's core reads beyond them, the traits, is declared by the adoption: those of
  the vLLM family the class derives from (an ``AscendMLAAttentionSpec`` hits, caches and is evented as MLA),
  taken from kvspec's spec of that family built with the object's fields. Its device views are the family's
  when the pages agree in size, else one raw view of the page.
- **A manager of vLLM's own** (``SlidingWindowManager``) is kvspec's manager of that name, as for the
  built-in specs. **A platform's own manager**, written against vLLM's manager base
  (``CompressAttentionManager(FullAttentionManager)``), runs as it is, with vLLM's base class of the installed
  release, vLLM's field names and signatures, over kvspec's block pool (vLLM's pool API on kvspec's pool, the
  same calls vLLM's managers make), behind an :class:`AdoptedManager` that speaks kvspec's manager protocol to
  the coordinator. Every block id, hit and eviction still comes from kvspec's pool and coordinator.
- **The uniform base** a registration names is a family of adopted specs of its own: classes registered with
  the same base share uniform-type groups, as in vLLM.

The platform's hook runs once, where vLLM runs it: kvspec asks vLLM's registry to finish its registration
(``_ensure_registered``, which registers vLLM's built-ins and then calls the platform's hook) and reads it.

What cannot be adopted is refused then, before anything is served, with one :class:`AdoptionError` line naming
the class, the member and what to do; nothing falls back silently:

- a manager whose own code reads a member of the block pool that kvspec's pool does not have (found in its
  source), or whose methods take a parameter kvspec's coordinator cannot supply;
- a spec class deriving from no vLLM spec family kvspec knows (its traits would be guesses), one whose members
  fail the registry's checks, or whose family cannot be built from its fields;
- a spec object of the engine's layout whose values fail kvspec's checks (``check_adopted_spec``: a page size
  or block size that is not a positive int, a memory bound that is not an int of at least one page).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import textwrap
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Final

from typing_extensions import Self

from kvspec import managers as kvspec_managers
from kvspec import specs as kvspec_specs
from kvspec.blocks.hashing import BlockHashListWithBlockSize
from kvspec.blocks.pool import BlockPool, KVCacheBlock
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import EXTERNAL_BLOCKS, PREFILL_END, HitQuery, HitResult, ManagerContext
from kvspec.contracts.spec import SchedulerLimits, SpecCollection, as_spec_list
from kvspec.contracts.traits import SpecTraits, traits_of
from kvspec.errors import AdoptionError, KVSpecError, RegistrationError, SpecMergeError
from kvspec.integrations.vllm import SPEC_CLASS_NAMES, convert_value, qualified_name
from kvspec.integrations.vllm_facades import _BlockPoolFacade
from kvspec.registry.core import AnyRegistry

__all__ = [
    "AdoptedManager",
    "AdoptedSpec",
    "Adoption",
    "adopt_vllm_registrations",
    "adopted_manager_class",
    "adopted_spec_class",
    "check_adopted_spec",
    "check_adopted_specs",
    "unwrap",
]

VLLM_REGISTRY_MODULE: Final = "vllm.v1.kv_cache_spec_registry"


def _is_vllm_own(cls: type) -> bool:
    """A class of vLLM's package itself (a built-in), not a platform's (whose classes may derive from one)."""
    return cls.__module__ == "vllm" or cls.__module__.startswith("vllm.")


def vllm_family(cls: type) -> type | None:
    """The nearest vLLM built-in spec class ``cls`` derives from whose family kvspec knows, or None."""
    for klass in cls.__mro__:
        if (
            _is_vllm_own(klass)
            and klass.__name__ in SPEC_CLASS_NAMES
            and hasattr(kvspec_specs, klass.__name__)
        ):
            return klass
    return None


# -- the spec ---------------------------------------------------------------------------------------------


def family_twin(vllm_spec: Any, family: str) -> Any:
    """kvspec's spec of ``family`` (a class name both libraries define) built from ``vllm_spec``'s fields."""
    cls = getattr(kvspec_specs, family)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {
        name: convert_value(name, getattr(vllm_spec, name), f, to_vllm=False)
        for name, f in fields.items()
        if hasattr(vllm_spec, name)
    }
    return cls(**kwargs)


def family_traits(vllm_spec: Any, family: str) -> SpecTraits:
    """The traits of ``vllm_spec``'s family: its kvspec twin's, with a raw device view where the pages differ."""
    try:
        twin = family_twin(vllm_spec, family)
    except (KVSpecError, TypeError, ValueError) as exc:
        raise AdoptionError(
            f"{qualified_name(type(vllm_spec))}: kvspec reads its behaviour from its vLLM family {family}, whose "
            f"kvspec spec cannot be built from its fields ({exc}); give the class a kvspec counterpart "
            "(vllm_counterpart) or a spec_converter."
        ) from exc
    traits = traits_of(twin)
    if twin.page_size_bytes != vllm_spec.page_size_bytes:
        traits = dataclasses.replace(traits, device_views=(), device_view_is_tuple=False)
    return traits


@dataclasses.dataclass(frozen=True, slots=True)
class AdoptedSpec:
    """A platform's vLLM-side spec object, run by kvspec: every ``KVCacheSpec`` member is the object's own
    (``vllm_spec``), the traits its vLLM family's (see the module). Equal when the objects are equal.

    Each adopted class gets a subclass of its own (:func:`adopted_spec_class`), whose ``vllm_class`` is the
    platform's class and ``family`` the name of the vLLM family it derives from."""

    vllm_spec: Any
    _traits: SpecTraits = dataclasses.field(init=False, compare=False, repr=False)

    vllm_class: ClassVar[type]
    family: ClassVar[str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_traits", family_traits(self.vllm_spec, type(self).family))

    @property
    def block_size(self) -> int:
        size: int = self.vllm_spec.block_size
        return size

    @property
    def page_size_bytes(self) -> int:
        page: int = self.vllm_spec.page_size_bytes
        return page

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        """The object's own bound, given kvspec's limits, which carry vLLM's config names it reads
        (``model_config.max_model_len``, ``parallel_config.decode_context_parallel_size``, ...)."""
        try:
            needed: int = self.vllm_spec.max_memory_usage_bytes(limits)
        except AttributeError as exc:
            raise AdoptionError(
                f"{qualified_name(type(self.vllm_spec))}.max_memory_usage_bytes reads a part of vLLM's config "
                f"kvspec's limits do not carry ({exc}); plan this model with vLLM's planner."
            ) from exc
        return needed

    def copy_with_new_block_size(self, block_size: int, /) -> Self:
        return type(self)(self.vllm_spec.copy_with_new_block_size(block_size))

    @classmethod
    def merge(cls, specs: list[Any], /) -> Self:
        """The platform class's own merge of the objects, adopted in turn (its assertions become
        ``SpecMergeError``)."""
        objects = [unwrap(s) for s in specs]
        try:
            merged = type(objects[0]).merge(objects)
        except AssertionError as exc:
            raise SpecMergeError(f"{qualified_name(type(objects[0]))}.merge refused: {exc}") from exc
        return cls(merged)

    def is_uniform_with_collection(self, specs: SpecCollection, /) -> bool:
        """The object's own rule, over the objects (vLLM's specs read a ``{layer: spec}`` dict)."""
        objects = {f"layer.{i}": unwrap(s) for i, s in enumerate(as_spec_list(specs))}
        return bool(self.vllm_spec.is_uniform_with_collection(objects))

    def kv_cache_traits(self) -> SpecTraits:
        return self._traits


def unwrap(spec: Any) -> Any:
    """The platform's object an adopted spec holds; any other spec as it is."""
    return spec.vllm_spec if isinstance(spec, AdoptedSpec) else spec


@functools.cache
def adopted_family(base: type) -> type[AdoptedSpec]:
    """The uniform-type family of every adopted class registered with ``base`` (one class per base)."""
    name = f"Adopted{base.__name__}Family"
    namespace = {"__module__": __name__, "__qualname__": name, "__slots__": ()}
    family: type[AdoptedSpec] = type(name, (AdoptedSpec,), namespace)
    return family


@functools.cache
def adopted_spec_class(vllm_class: type, base: type) -> type[AdoptedSpec]:
    """kvspec's class for the platform's ``vllm_class`` registered with uniform base ``base`` (one class per
    pair, so that adopting again registers the same class). AdoptionError when it derives from no vLLM family
    kvspec knows."""
    family = vllm_family(vllm_class)
    if family is None:
        raise AdoptionError(
            f"{qualified_name(vllm_class)} derives from no vLLM spec family kvspec knows "
            f"({', '.join(SPEC_CLASS_NAMES)}), so kvspec cannot tell how it hits, caches and is evented; give it "
            "a kvspec counterpart (a kvspec spec class with vllm_counterpart) or pass a spec_converter."
        )
    name = f"Adopted{vllm_class.__name__}"
    namespace = {
        "__module__": __name__,
        "__qualname__": name,
        "__slots__": (),
        "vllm_class": vllm_class,
        "family": family.__name__,
    }
    adopted: type[AdoptedSpec] = type(name, (adopted_family(base),), namespace)
    return adopted


def check_adopted_spec(spec: AdoptedSpec, limits: SchedulerLimits | None = None) -> None:
    """AdoptionError unless the object's values are what kvspec's core reads: a positive int block size and
    page size, and (given ``limits``) a memory bound that is an int of at least one page."""
    obj = spec.vllm_spec
    where = qualified_name(type(obj))
    for member in ("block_size", "page_size_bytes"):
        value = getattr(obj, member)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise AdoptionError(
                f"{where}.{member} is {value!r} ({type(value).__name__}); kvspec needs a positive int. Fix the "
                "spec class, or give it a kvspec counterpart."
            )
    if limits is not None:
        bound: object = spec.max_memory_usage_bytes(limits)
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < obj.page_size_bytes:
            raise AdoptionError(
                f"{where}.max_memory_usage_bytes gave {bound!r} for max_model_len={limits.max_model_len}; kvspec "
                f"needs an int of at least one page ({obj.page_size_bytes} bytes)."
            )


def check_adopted_specs(config: Any, limits: SchedulerLimits) -> None:
    """``check_adopted_spec`` on every adopted spec of a kvspec ``KVCacheConfig`` (a uniform group's too)."""
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        for inner in getattr(spec, "kv_cache_specs", {spec: spec}).values():
            if isinstance(inner, AdoptedSpec):
                check_adopted_spec(inner, limits)


# -- the manager ------------------------------------------------------------------------------------------

#: kvspec's manager protocol call -> the names vLLM's manager takes there, in vLLM's order (every release:
#: a method's parameters are matched by name against the installed class's own signature).
_KNOWN_ARGUMENTS: Final[dict[str, frozenset[str]]] = {
    "__init__": frozenset(
        {
            "kv_cache_spec",
            "block_pool",
            "enable_caching",
            "kv_cache_group_id",
            "scheduler_block_size",
            "dcp_world_size",
            "pcp_world_size",
            "max_admission_blocks_per_request",
            "needs_kv_cache_zeroing",
        }
    ),
    "get_num_blocks_to_allocate": frozenset(
        {
            "request_id",
            "num_tokens",
            "new_computed_blocks",
            "total_computed_tokens",
            "num_local_computed_tokens",
            "num_tokens_main_model",
            "apply_admission_cap",
            "prefill_end",
        }
    ),
    "allocate_new_computed_blocks": frozenset(
        {"request_id", "new_computed_blocks", "num_local_computed_tokens", "num_external_computed_tokens"}
    ),
    "add_local_computed_blocks": frozenset(
        {"request_id", "new_computed_blocks", "num_local_computed_tokens", "num_external_computed_tokens"}
    ),
    "allocate_external_computed_blocks": frozenset(
        {"request_id", "num_local_computed_tokens", "num_external_computed_tokens", "record_for_zeroing"}
    ),
    "allocate_new_blocks": frozenset({"request_id", "num_tokens", "num_tokens_main_model"}),
    "cache_blocks": frozenset({"request", "num_tokens", "retention_interval", "replay_boundaries"}),
    "free": frozenset({"request_id"}),
    "remove_skipped_blocks": frozenset(
        {"request_id", "total_computed_tokens", "processed_computed_tokens", "num_prompt_tokens"}
    ),
    "get_num_common_prefix_blocks": frozenset({"running_request_id"}),
    "find_longest_cache_hit": frozenset(
        {
            "block_hashes",
            "max_length",
            "kv_cache_group_ids",
            "block_pool",
            "kv_cache_spec",
            "drop_eagle_block",
            "use_eagle",
            "alignment_tokens",
            "dcp_world_size",
            "pcp_world_size",
        }
    ),
    "new_step_starts": frozenset(),
    "take_new_block_ids": frozenset(),
}


#: Methods a release's manager may lack: vLLM 0.32 and 0.34 dropped cascade attention's common-prefix count
#: and split ``allocate_new_computed_blocks`` into two halves, which 0.23 does not have.
_OPTIONAL_METHODS: Final = frozenset(
    {"get_num_common_prefix_blocks", "add_local_computed_blocks", "allocate_external_computed_blocks"}
)


def _parameters(cls: type, method: str) -> list[inspect.Parameter]:
    """The parameters ``cls.method`` takes besides self/cls; through ``**kwargs`` forwarders to the first
    class in the MRO that names them (a platform's ``__init__(self, kv_cache_spec, block_pool, **kwargs)``
    takes what vLLM's base takes)."""
    named: list[inspect.Parameter] = []
    for klass in cls.__mro__:
        fn = vars(klass).get(method)
        if fn is None:
            continue
        fn = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
        params = list(inspect.signature(fn).parameters.values())[1:]
        named += [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    unique: dict[str, inspect.Parameter] = {}
    for p in named:
        unique.setdefault(p.name, p)
    return list(unique.values())


def _pool_members_used(cls: type) -> dict[str, str]:
    """``block_pool`` members the platform's own classes in ``cls``'s MRO read: member -> the method reading it."""
    used: dict[str, str] = {}
    for klass in cls.__mro__:
        if _is_vllm_own(klass) or klass is object or klass.__module__ == "abc":
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, ast.Attribute):
                    continue
                owner = node.value
                if (isinstance(owner, ast.Attribute) and owner.attr == "block_pool") or (
                    isinstance(owner, ast.Name) and owner.id == "block_pool"
                ):
                    used.setdefault(node.attr, f"{klass.__name__}.{fn.name}")
    return used


def _kvspec_pool_members() -> frozenset[str]:
    probe = BlockPool(num_gpu_blocks=2)
    return frozenset(dir(probe)) | frozenset(dir(_BlockPoolFacade))


def check_adoptable_manager(cls: type) -> None:
    """AdoptionError unless kvspec can run the platform's manager ``cls`` as it is (see the module)."""
    where = qualified_name(cls)
    provided = _kvspec_pool_members()
    for member, method in sorted(_pool_members_used(cls).items()):
        if member not in provided:
            raise AdoptionError(
                f"{where}: {method} reads block_pool.{member}, which kvspec's block pool does not provide; keep "
                "the manager to vLLM's pool API (get_new_blocks, touch, free_blocks, cache_full_blocks, "
                "get_cached_block, null_block, ...) or run it on vLLM's own KV cache manager."
            )
    split = hasattr(cls, "add_local_computed_blocks") and hasattr(cls, "allocate_external_computed_blocks")
    for method, known in _KNOWN_ARGUMENTS.items():
        if method in _OPTIONAL_METHODS or (method == "allocate_new_computed_blocks" and split):
            if not hasattr(cls, method):
                continue  # a release without it (see AdoptedManager), or 0.32/0.34's two halves instead
        if not hasattr(cls, method):
            raise AdoptionError(
                f"{where} has no {method}, which kvspec's coordinator calls; derive it from one of vLLM's "
                "managers (SingleTypeKVCacheManager) of the installed release."
            )
        for p in _parameters(cls, method):
            if p.default is p.empty and p.name not in known:
                raise AdoptionError(
                    f"{where}.{method} needs {p.name!r}, which kvspec's coordinator does not pass; give it a "
                    "default, or register a kvspec manager instead."
                )


class AdoptedManager:
    """A platform's vLLM manager (``vllm_manager_cls``, as it is) behind kvspec's manager protocol.

    Built from a ``ManagerContext`` like every kvspec manager: it builds the platform's manager with vLLM's
    constructor (the platform's spec object, kvspec's pool behind vLLM's pool API, the context's settings)
    and forwards each of the coordinator's calls to the method of vLLM's name, by keyword, passing what that
    method of the installed release takes: 0.23's ``allocate_new_computed_blocks`` or 0.32/0.34's two halves
    (declared as the ``external_computed_blocks`` capability), 0.34's ``num_local_computed_tokens``,
    ``prefill_end`` and ``replay_boundaries``, a hit search that answers blocks or (blocks, tokens). Its state is
    the platform manager's own (``req_to_blocks``, ``num_cached_block``, ...). Sub-block hits (0.34's partial
    hash hits) are refused: a hit inside a block copies it on write, in calls no vLLM manager makes itself.
    """

    #: The platform's class (a vLLM manager: typed as vLLM's code is, by its own release).
    vllm_manager_cls: ClassVar[Any]
    manager_capabilities: ClassVar[tuple[str, ...]] = ()

    def __init__(self, context: ManagerContext) -> None:
        if context.partial_hash_hits:
            raise AdoptionError(
                f"{qualified_name(self.vllm_manager_cls)} cannot run with sub-block prefix hits (partial hash "
                "hits): kvspec would copy its blocks on write behind its back; turn them off, or register a "
                "kvspec manager for the spec."
            )
        self.context = context
        self.block_pool = _BlockPoolFacade(context.block_pool)
        zeroing = (
            context.traits.zero_new_blocks if context.zero_new_blocks is None else context.zero_new_blocks
        )
        given = {
            "kv_cache_spec": unwrap(context.kv_cache_spec),
            "block_pool": self.block_pool,
            "enable_caching": context.enable_caching,
            "kv_cache_group_id": context.kv_cache_group_id,
            "scheduler_block_size": context.scheduler_block_size,
            "dcp_world_size": context.dcp_world_size,
            "pcp_world_size": context.pcp_world_size,
            "max_admission_blocks_per_request": context.max_admission_blocks_per_request,
            "needs_kv_cache_zeroing": zeroing,
        }
        accepted = _accepted(self.vllm_manager_cls, "__init__")
        self.vllm_manager: Any = self.vllm_manager_cls(**{k: v for k, v in given.items() if k in accepted})
        # vLLM's coordinator sets this after building the manager (the EAGLE/MTP last-block drop).
        self.vllm_manager.use_eagle = context.use_eagle
        self._prefill_ends: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        """What vLLM's own code reads of a manager (its scheduler reads ``block_size``) is the platform
        manager's, under vLLM's names."""
        if name.startswith("__") or name in ("vllm_manager", "context"):
            raise AttributeError(name)
        return getattr(self.vllm_manager, name)

    def _call(self, method: str, **given: Any) -> Any:
        accepted = _accepted(self.vllm_manager_cls, method)
        return getattr(self.vllm_manager, method)(**{k: v for k, v in given.items() if k in accepted})

    @property
    def wants_prefill_end(self) -> bool:
        """Told where each request's prefill ends (``prefill_end`` capability) when the release's manager
        takes it (vLLM 0.32, 0.34)."""
        return "prefill_end" in _accepted(self.vllm_manager_cls, "get_num_blocks_to_allocate")

    def note_prefill_end(self, request_id: str, prefill_end: int) -> None:
        self._prefill_ends[request_id] = prefill_end

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        needed: int = self._call(
            "get_num_blocks_to_allocate",
            request_id=request_id,
            num_tokens=num_tokens,
            new_computed_blocks=new_computed_blocks,
            total_computed_tokens=total_computed_tokens,
            # Whole blocks: with sub-block hits refused, a local hit ends on this manager's block boundary.
            num_local_computed_tokens=len(new_computed_blocks) * self.vllm_manager.block_size,
            num_tokens_main_model=num_tokens_main_model,
            apply_admission_cap=apply_admission_cap,
            prefill_end=self._prefill_ends.get(request_id, 0),
        )
        return needed

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        if hasattr(self.vllm_manager, "allocate_new_computed_blocks"):
            self._call(
                "allocate_new_computed_blocks",
                request_id=request_id,
                new_computed_blocks=new_computed_blocks,
                num_local_computed_tokens=num_local_computed_tokens,
                num_external_computed_tokens=num_external_computed_tokens,
            )
            return
        self.add_local_computed_blocks(
            request_id, new_computed_blocks, num_local_computed_tokens, num_external_computed_tokens
        )
        self.allocate_external_computed_blocks(
            request_id, num_local_computed_tokens, num_external_computed_tokens
        )

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        self._call(
            "add_local_computed_blocks",
            request_id=request_id,
            new_computed_blocks=new_computed_blocks,
            num_local_computed_tokens=num_local_computed_tokens,
            num_external_computed_tokens=num_external_computed_tokens,
        )

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None:
        self._call(
            "allocate_external_computed_blocks",
            request_id=request_id,
            num_local_computed_tokens=num_local_computed_tokens,
            num_external_computed_tokens=num_external_computed_tokens,
            record_for_zeroing=record_for_zeroing,
        )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        new: list[KVCacheBlock] = self._call(
            "allocate_new_blocks",
            request_id=request_id,
            num_tokens=num_tokens,
            num_tokens_main_model=num_tokens_main_model,
        )
        return new

    def cache_blocks(self, request: RequestView, num_tokens: int) -> None:
        context = self.context
        self._call(
            "cache_blocks",
            # The platform's code reads vLLM's request: the one the view reads in place, when there is one.
            request=getattr(request, "vllm_request", request),
            num_tokens=num_tokens,
            retention_interval=context.prefix_cache_retention_interval,
            # As vLLM 0.34's coordinator computes them for every group.
            replay_boundaries=context.profile.replay_boundaries(
                request.num_prompt_tokens, context.scheduler_block_size, context.model_uses_eagle
            ),
        )

    def free(self, request_id: str) -> None:
        self._prefill_ends.pop(request_id, None)
        self._call("free", request_id=request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        self._prefill_ends.pop(request_id, None)
        manager = self.vllm_manager
        if hasattr(manager, "pop_blocks_for_free"):
            popped: list[KVCacheBlock] = manager.pop_blocks_for_free(request_id)
            return popped
        blocks = manager.req_to_blocks.pop(request_id, [])
        manager.num_cached_block.pop(request_id, None)
        return [b for b in blocks if not b.is_null]

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, /, num_prompt_tokens: int | None = None
    ) -> None:
        self._call(
            "remove_skipped_blocks",
            request_id=request_id,
            total_computed_tokens=total_computed_tokens,
            processed_computed_tokens=total_computed_tokens,
            num_prompt_tokens=num_prompt_tokens,
        )

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """The manager's own count; 0 where the release's manager has none (0.32 and 0.34 dropped cascade
        attention, and their engines never ask)."""
        if not hasattr(self.vllm_manager, "get_num_common_prefix_blocks"):
            return 0
        count: int = self._call("get_num_common_prefix_blocks", running_request_id=running_request_id)
        return count

    def get_blocks(self, request_id: str) -> Sequence[KVCacheBlock]:
        blocks: Sequence[KVCacheBlock] = self.vllm_manager.req_to_blocks.get(request_id, [])
        return blocks

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        """The platform's hit search: 0.23's answer is the block lists, 0.32/0.34's (block lists, tokens)."""
        accepted = _accepted(cls.vllm_manager_cls, "find_longest_cache_hit")
        hashes = query.block_hashes
        if query.block_pool.coarse_hash_is_last_fine and isinstance(hashes, BlockHashListWithBlockSize):
            # vLLM 0.32 and 0.34 hand a manager the pool's hash-block hashes; it views them at its own block.
            hashes = hashes.fine_hashes
        given = {
            "block_hashes": hashes,
            "max_length": query.max_length,
            "kv_cache_group_ids": list(query.kv_cache_group_ids),
            "block_pool": _BlockPoolFacade(query.block_pool),
            "kv_cache_spec": unwrap(query.kv_cache_spec),
            "drop_eagle_block": query.use_eagle,
            "use_eagle": query.use_eagle,
            "alignment_tokens": query.alignment_tokens,
            "dcp_world_size": query.dcp_world_size,
            "pcp_world_size": query.pcp_world_size,
        }
        hit = cls.vllm_manager_cls.find_longest_cache_hit(**{k: v for k, v in given.items() if k in accepted})
        if len(hit) == 2 and isinstance(hit[1], int) and isinstance(hit[0], tuple):
            blocks, tokens = hit
            return HitResult(tuple(list(b) for b in blocks), tokens)
        return HitResult(tuple(list(b) for b in hit))

    def new_step_starts(self) -> None:
        self.vllm_manager.new_step_starts()

    def iter_held_blocks(self) -> Iterator[KVCacheBlock]:
        for blocks in list(self.vllm_manager.req_to_blocks.values()):
            for block in blocks:
                if not block.is_null:
                    yield block

    def take_new_block_ids(self) -> list[int]:
        ids: list[int] = self.vllm_manager.take_new_block_ids()
        return ids


@functools.cache
def _accepted(cls: type, method: str) -> frozenset[str]:
    return frozenset(p.name for p in _parameters(cls, method))


@functools.cache
def adopted_manager_class(vllm_manager_cls: type) -> type:
    """kvspec's manager for a vLLM-side manager class: kvspec's own of the same name for one of vLLM's
    built-ins, else an :class:`AdoptedManager` running the platform's class (checked first: see
    :func:`check_adoptable_manager`)."""
    if _is_vllm_own(vllm_manager_cls):
        own = getattr(kvspec_managers, vllm_manager_cls.__name__, None)
        if own is None:
            raise AdoptionError(
                f"{qualified_name(vllm_manager_cls)} is a manager of vLLM's that kvspec does not reproduce; "
                "register one of kvspec's managers for the spec instead."
            )
        found: type = own
        return found
    check_adoptable_manager(vllm_manager_cls)
    name = f"Adopted{vllm_manager_cls.__name__}"
    capabilities = (
        [PREFILL_END] if "prefill_end" in _accepted(vllm_manager_cls, "get_num_blocks_to_allocate") else []
    )
    if hasattr(vllm_manager_cls, "add_local_computed_blocks"):
        capabilities.append(EXTERNAL_BLOCKS)  # 0.32/0.34: every group's hits attached before any allocates
    namespace = {
        "__module__": __name__,
        "__qualname__": name,
        "vllm_manager_cls": vllm_manager_cls,
        "manager_capabilities": tuple(capabilities),
    }
    return type(name, (AdoptedManager,), namespace)


# -- adopting vLLM's registry -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Adoption:
    """One registration adopted: the platform's classes and kvspec's."""

    vllm_spec_class: type
    vllm_manager_class: type
    vllm_uniform_base: type
    spec_class: type[AdoptedSpec]
    manager_class: type

    def describe(self) -> str:
        """One phrase for the adapter's start line: the platform's class, its family, what runs it."""
        runner = (
            f"{qualified_name(self.vllm_manager_class)} as it is"
            if issubclass(self.manager_class, AdoptedManager)
            else f"kvspec's {self.manager_class.__name__}"
        )
        return (
            f"{qualified_name(self.vllm_spec_class)} (vLLM family {self.spec_class.family}) run by {runner}"
        )


def vllm_registrations(vllm_config: Any = None) -> list[tuple[type, type, type]]:
    """(spec class, manager class, uniform base) of every registration in the installed vLLM's registry,
    after vLLM's own registration has run (its built-ins, then the platform's hook, once). Empty for a vLLM
    without the registry."""
    try:
        module = importlib.import_module(VLLM_REGISTRY_MODULE)
    except ImportError:
        return []
    module.KVCacheSpecRegistry._ensure_registered(vllm_config)
    table = module._REGISTRY_KVCACHESPEC_LIST
    return [(spec_cls, m.manager_class, m.uniform_type_base_spec) for spec_cls, m in table.items()]


def adopt_vllm_registrations(registry: AnyRegistry, *, vllm_config: Any = None) -> list[Adoption]:
    """Register in ``registry`` every platform registration of vLLM's registry (all or none); the list of
    what was adopted. AdoptionError, naming the class and the member, for one that cannot be."""
    adoptions: list[Adoption] = []
    for spec_cls, manager_cls, base in vllm_registrations(vllm_config):
        if _is_vllm_own(spec_cls) and _is_vllm_own(manager_cls):
            continue  # vLLM's own: kvspec's built-ins, converted by class name
        adoptions.append(
            Adoption(
                vllm_spec_class=spec_cls,
                vllm_manager_class=manager_cls,
                vllm_uniform_base=base,
                spec_class=adopted_spec_class(spec_cls, base),
                manager_class=adopted_manager_class(manager_cls),
            )
        )
    try:
        with registry.transaction():
            for adoption in adoptions:
                registry.register(
                    adoption.spec_class,
                    adoption.manager_class,
                    adopted_family(adoption.vllm_uniform_base),
                    source=f"adopted from vLLM's registry ({qualified_name(adoption.vllm_spec_class)})",
                )
    except RegistrationError as exc:
        if isinstance(exc, AdoptionError):
            raise
        raise AdoptionError(f"Adopting vLLM's registrations: {exc}") from exc
    return adoptions
