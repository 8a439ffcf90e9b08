"""What specs and managers must provide, and the run-time limits they are sized against.

``KVCacheSpec`` and ``KVCacheManager`` are structural (``typing.Protocol``): a plugin's class satisfies them
by having the members, with no need to inherit from kvspec. mypy checks the full contract statically;
at run time the registry checks member *names* (``missing_members``) because Python cannot check
signatures or return types of a class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, cast, runtime_checkable

import typing_extensions
from typing_extensions import Self

from kvspec.contracts.vllm_config import (
    CacheConfigView,
    ModelConfigView,
    ParallelConfigView,
    SchedulerConfigView,
)
from kvspec.errors import KVSpecTypeError, SpecValidationError

MambaCacheMode = Literal["none", "align", "all"]
MAMBA_CACHE_MODES: tuple[MambaCacheMode, ...] = ("none", "align", "all")


def _require_int(name: str, value: object, minimum: int) -> None:
    """SchedulerLimits fields are ints (not bools, floats or strings) of at least ``minimum`` tokens."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise KVSpecTypeError(
            f"SchedulerLimits.{name} must be an int, got {type(value).__name__} {value!r}; "
            f"write e.g. {name}=8192."
        )
    if value < minimum:
        raise SpecValidationError(f"SchedulerLimits.{name} must be >= {minimum}, got {value!r}.")


@dataclass(frozen=True, kw_only=True, slots=True)
class SchedulerLimits:
    """Run-time limits that specs and managers are sized against (all counts in tokens).

    Invariants: every size is positive; ``max_num_batched_tokens`` defaults to ``max_model_len``.
    """

    max_model_len: int
    max_num_batched_tokens: int | None = None
    max_num_encoder_input_tokens: int = 0
    decode_context_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    mamba_cache_mode: MambaCacheMode = "none"

    def __post_init__(self) -> None:
        for name, minimum in (
            ("max_model_len", 1),
            ("decode_context_parallel_size", 1),
            ("prefill_context_parallel_size", 1),
            ("max_num_encoder_input_tokens", 0),
        ):
            _require_int(name, getattr(self, name), minimum)
        if self.max_num_batched_tokens is None:
            object.__setattr__(self, "max_num_batched_tokens", self.max_model_len)
        else:
            _require_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise SpecValidationError(
                f"SchedulerLimits.mamba_cache_mode must be one of {MAMBA_CACHE_MODES}, "
                f"got {self.mamba_cache_mode!r}."
            )

    @property
    def batched_tokens(self) -> int:
        """``max_num_batched_tokens`` with its default resolved (tokens)."""
        n = self.max_num_batched_tokens
        return self.max_model_len if n is None else n

    @property
    def context_parallel_size(self) -> int:
        """decode CP x prefill CP: how many ranks one request's KV is spread over."""
        return self.decode_context_parallel_size * self.prefill_context_parallel_size

    # vLLM's names for the same limits (kvspec.contracts.vllm_config.VllmConfig): a spec written against
    # vLLM's max_memory_usage_bytes(self, vllm_config) reads them unchanged.

    @property
    def model_config(self) -> ModelConfigView:
        return ModelConfigView(max_model_len=self.max_model_len)

    @property
    def scheduler_config(self) -> SchedulerConfigView:
        return SchedulerConfigView(
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.batched_tokens,
            max_num_encoder_input_tokens=self.max_num_encoder_input_tokens,
        )

    @property
    def parallel_config(self) -> ParallelConfigView:
        return ParallelConfigView(
            decode_context_parallel_size=self.decode_context_parallel_size,
            prefill_context_parallel_size=self.prefill_context_parallel_size,
        )

    @property
    def cache_config(self) -> CacheConfigView:
        return CacheConfigView(mamba_cache_mode=self.mamba_cache_mode)


@runtime_checkable
class KVCacheSpec(Protocol):
    """What one layer's KV cache looks like.

    Invariants a spec must keep: it is immutable and hashable (it is used as a dict key while grouping);
    ``page_size_bytes`` is the bytes of one block of ``block_size`` tokens for this layer;
    ``max_memory_usage_bytes`` is what one request of ``limits.max_model_len`` tokens needs at most.
    """

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        ...

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of this layer (including padding)."""
        ...

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        """The most bytes one request can hold in this layer under ``limits``."""
        ...

    def copy_with_new_block_size(self, block_size: int, /) -> Self:
        """The same spec with another block size (tokens)."""
        ...

    @classmethod
    def merge(cls, specs: list[Self], /) -> Self:
        """One spec that stands for every spec of a KV cache group; raises SpecMergeError if impossible."""
        ...

    def is_uniform_with_collection(self, specs: SpecCollection, /) -> bool:
        """The type-specific part of the uniformity rule (window, chunk, speculative blocks agree).

        ``specs`` is a sequence or vLLM's layer -> spec dict; both must give the same answer
        (``kvspec.as_spec_list`` turns either into a list)."""
        ...


@runtime_checkable
class _KVCacheSpecCallables(Protocol):
    """The method-only view of KVCacheSpec that runtime ``issubclass`` can check.

    CPython refuses ``issubclass`` on protocols with property members, so beartype is told to use this
    view for ``type[SpecT]``; the property members are checked by :func:`missing_members` instead.
    """

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int: ...

    def copy_with_new_block_size(self, block_size: int, /) -> Self: ...

    @classmethod
    def merge(cls, specs: list[Self], /) -> Self: ...

    def is_uniform_with_collection(self, specs: SpecCollection, /) -> bool: ...


#: What ``is_uniform_with_collection`` of the built-in specs accepts: a sequence, or vLLM's layer -> spec dict.
SpecCollection = Sequence[KVCacheSpec] | Mapping[str, KVCacheSpec]


def as_spec_list(specs: SpecCollection) -> list[KVCacheSpec]:
    """The specs of a sequence or of a layer-name -> spec mapping (vLLM passes a dict)."""
    if isinstance(specs, Mapping):
        return list(specs.values())
    return list(specs)


SpecT = TypeVar("SpecT", bound=KVCacheSpec)


def replace_fields(spec: KVCacheSpec, **changes: object) -> KVCacheSpec:
    """``dataclasses.replace`` for a spec typed by its protocol (the built-ins and the usual plugin spec are
    frozen dataclasses, which the protocol cannot say). TypeError when ``spec`` is not a dataclass instance,
    ValueError or TypeError when a change names no init field of it, as ``dataclasses.replace`` raises."""
    copy: KVCacheSpec = dataclasses.replace(cast(Any, spec), **changes)
    return copy


def missing_members(cls: type, proto: type) -> frozenset[str]:
    """Protocol members that ``cls`` neither defines nor annotates anywhere in its MRO."""
    declared: set[str] = set()
    for klass in cls.__mro__:
        declared.update(vars(klass))
        declared.update(getattr(klass, "__annotations__", {}))
    return frozenset(typing_extensions.get_protocol_members(proto) - declared - {"__init__"})
