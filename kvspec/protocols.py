"""What specs and managers must provide, and the run-time limits they are sized against.

``KVCacheSpec`` and ``KVCacheManager`` are structural (``typing.Protocol``): a plugin's class satisfies them
by having the members, with no need to inherit from kvspec. mypy checks the full contract statically;
at run time the registry checks member *names* (``missing_members``) because Python cannot check
signatures or return types of a class.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, runtime_checkable

import typing_extensions
from typing_extensions import Self

from kvspec.errors import SpecValidationError
from kvspec.pool import BlockPool, KVCacheBlock
from kvspec.request import Request

MambaCacheMode = Literal["none", "align", "all"]
MAMBA_CACHE_MODES: tuple[MambaCacheMode, ...] = ("none", "align", "all")


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
        for name in (
            "max_model_len",
            "decode_context_parallel_size",
            "prefill_context_parallel_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise SpecValidationError(f"SchedulerLimits.{name} must be a positive int, got {value!r}.")
        if self.max_num_batched_tokens is None:
            object.__setattr__(self, "max_num_batched_tokens", self.max_model_len)
        elif self.max_num_batched_tokens <= 0:
            raise SpecValidationError(
                "SchedulerLimits.max_num_batched_tokens must be positive, "
                f"got {self.max_num_batched_tokens!r}."
            )
        if self.max_num_encoder_input_tokens < 0:
            raise SpecValidationError(
                "SchedulerLimits.max_num_encoder_input_tokens must be >= 0, "
                f"got {self.max_num_encoder_input_tokens!r}."
            )
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

    def max_memory_usage_bytes(self, limits: SchedulerLimits) -> int:
        """The most bytes one request can hold in this layer under ``limits``."""
        ...

    def copy_with_new_block_size(self, block_size: int) -> Self:
        """The same spec with another block size (tokens)."""
        ...

    @classmethod
    def merge(cls, specs: Sequence[Self]) -> Self:
        """One spec that stands for every spec of a KV cache group; raises SpecMergeError if impossible."""
        ...

    def is_uniform_with_collection(self, specs: Sequence[KVCacheSpec]) -> bool:
        """The type-specific part of the uniformity rule (window, chunk, speculative blocks agree)."""
        ...


@runtime_checkable
class _KVCacheSpecCallables(Protocol):
    """The method-only view of KVCacheSpec that runtime ``issubclass`` can check.

    CPython refuses ``issubclass`` on protocols with property members, so beartype is told to use this
    view for ``type[SpecT]``; the property members are checked by :func:`missing_members` instead.
    """

    def max_memory_usage_bytes(self, limits: SchedulerLimits) -> int: ...

    def copy_with_new_block_size(self, block_size: int) -> Self: ...

    @classmethod
    def merge(cls, specs: Sequence[Self]) -> Self: ...

    def is_uniform_with_collection(self, specs: Sequence[KVCacheSpec]) -> bool: ...


@runtime_checkable
class KVCacheManager(Protocol):
    """Runs one KV cache group of one spec type (vLLM's SingleTypeKVCacheManager).

    Invariants: every block id it hands out comes from the shared ``BlockPool``; a block is referenced
    once per request that holds it; ``free`` returns every block of a request to the pool.
    Units: ``num_tokens`` arguments are tokens, return values of ``get_num_*_blocks*`` are blocks.
    """

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        *,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        max_admission_blocks_per_request: int | None = None,
        use_eagle: bool = False,
    ) -> None: ...

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """Blocks that allocating up to ``num_tokens`` would take out of the free queue."""
        ...

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Attach prefix-cache hits (and blocks for externally computed tokens) to a new request."""
        ...

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        """Append fresh blocks so the request can hold ``num_tokens`` tokens; return the new ones."""
        ...

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Publish the request's full blocks up to ``num_tokens`` in the prefix cache."""
        ...

    def free(self, request_id: str) -> None:
        """Release every block of the request (tail blocks become the first to be evicted)."""
        ...

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Free blocks that attention will never read again (outside the window, finished chunks)."""
        ...

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens at the front of the request that this spec type never reads again."""
        ...

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """Leading blocks shared by every request that holds blocks (for cascade attention)."""
        ...

    def get_blocks(self, request_id: str) -> Sequence[KVCacheBlock]:
        """The request's blocks in order (null blocks stand for skipped positions)."""
        ...

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        use_eagle: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[KVCacheBlock], ...]:
        """The longest prefix hit, one block list per group id; skipped positions hold the null block."""
        ...

    def new_step_starts(self) -> None:
        """Called once at the start of every scheduler step."""
        ...

    def iter_held_blocks(self) -> Iterator[KVCacheBlock]:
        """Every non-null block this manager holds a reference on, once per reference."""
        ...

    def take_new_block_ids(self) -> list[int]:
        """Ids of blocks allocated since the last call (for zeroing); clears the list."""
        ...


SpecT = TypeVar("SpecT", bound=KVCacheSpec)
MgrT = TypeVar("MgrT", bound=KVCacheManager)


def missing_members(cls: type, proto: type) -> frozenset[str]:
    """Protocol members that ``cls`` neither defines nor annotates anywhere in its MRO."""
    declared: set[str] = set()
    for klass in cls.__mro__:
        declared.update(vars(klass))
        declared.update(getattr(klass, "__annotations__", {}))
    return frozenset(typing_extensions.get_protocol_members(proto) - declared - {"__init__"})
