"""State-space (Mamba) layers: a fixed-size state per request instead of per-token KV."""

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from typing_extensions import Self

from kvspec.contracts.checking import check_construction
from kvspec.contracts.spec import (
    MAMBA_CACHE_MODES,
    MambaCacheMode,
    SchedulerLimits,
    SpecCollection,
    as_spec_list,
)
from kvspec.contracts.traits import PageView, SpecTraits, cached_traits, is_count
from kvspec.errors import SpecValidationError
from kvspec.intmath import cdiv, prod
from kvspec.specs._validate import require_dtype, require_optional_positive, require_positive
from kvspec.specs.attention import cached_page_size, merge_equal_specs
from kvspec.specs.dtypes import dtype_size


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class MambaSpec:
    """One Mamba layer's recurrent state: tensors of ``shapes`` with ``dtypes``, one set per block.

    A "block" holds one state snapshot. Memory per request depends on the scheduler's Mamba cache mode
    (read from ``SchedulerLimits``, as vLLM reads it from its config): "none" keeps 1 state, "align" 2,
    "all" one per ``block_size`` tokens; each mode adds ``num_speculative_blocks``.

    ``num_prefill_checkpoint_blocks`` / ``prefill_checkpoint_alignment`` (vLLM 0.34; Mamba2 and GDN layers
    declare 1 block): the backend exports, inside a prompt's final chunk, the state at the last boundary a
    later request can hit (the chunk need not end there), at a position ``prefill_checkpoint_alignment``
    tokens apart from the chunk start; "align" reserves that many more blocks per request for it.
    """

    block_size: int
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: MambaCacheMode = "none"
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None
    _page_size: int = field(default=0, init=False, repr=False, compare=False)
    _traits: SpecTraits | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require_positive(self, "block_size", self.block_size)
        if not self.shapes or len(self.shapes) != len(self.dtypes):
            raise SpecValidationError(
                f"MambaSpec needs one dtype per state shape; got {len(self.shapes)} shapes and "
                f"{len(self.dtypes)} dtypes."
            )
        shapes: tuple[object, ...] = self.shapes
        for shape in shapes:
            # Every element, not a sample (beartype checks one element of a container per call).
            if not isinstance(shape, tuple) or not shape or not all(is_count(n, 1) for n in shape):
                raise SpecValidationError(
                    f"MambaSpec.shapes must hold non-empty tuples of positive ints, got {shape!r}."
                )
        for dtype in self.dtypes:
            require_dtype(self, "dtypes", dtype)
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise SpecValidationError(
                f"MambaSpec.mamba_cache_mode must be one of {MAMBA_CACHE_MODES}, "
                f"got {self.mamba_cache_mode!r}."
            )
        if self.num_speculative_blocks < 0:
            raise SpecValidationError(
                f"MambaSpec.num_speculative_blocks must be >= 0, got {self.num_speculative_blocks!r}."
            )
        if not is_count(self.num_prefill_checkpoint_blocks, 0):
            raise SpecValidationError(
                "MambaSpec.num_prefill_checkpoint_blocks must be an int >= 0, got "
                f"{self.num_prefill_checkpoint_blocks!r}."
            )
        require_optional_positive(self, "prefill_checkpoint_alignment", self.prefill_checkpoint_alignment)
        require_optional_positive(self, "page_size_padded", self.page_size_padded)
        if self.page_size_padded is not None and self.page_size_padded < self.unpadded_page_size_bytes:
            raise SpecValidationError(
                f"MambaSpec.page_size_padded={self.page_size_padded} is smaller than the state it pads "
                f"({self.unpadded_page_size_bytes} bytes)."
            )

    @property
    def unpadded_page_size_bytes(self) -> int:
        return sum(prod(s) * dtype_size(d) for s, d in zip(self.shapes, self.dtypes, strict=True))

    @property
    def page_size_bytes(self) -> int:
        return cached_page_size(self)

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        if limits.mamba_cache_mode == "all":
            blocks = cdiv(limits.max_model_len, self.block_size)
        elif limits.mamba_cache_mode == "align":
            blocks = 2 + self.num_prefill_checkpoint_blocks
        else:
            blocks = 1
        return (blocks + self.num_speculative_blocks) * self.page_size_bytes

    def kv_cache_traits(self) -> SpecTraits:
        """The traits this spec declares (computed once; specs are immutable)."""
        return cached_traits(self, self._declare_traits)

    def _declare_traits(self) -> SpecTraits:
        """Hits at its own block boundaries only; state is read before it is written (zeroed buffers); every
        context-parallel rank holds the whole state (replicated); the page may be padded (it does not grow
        with the block); a request holds a fixed number of its blocks."""
        views: list[PageView] = []
        offset = 0
        for i, (shape, dtype) in enumerate(zip(self.shapes, self.dtypes, strict=True)):
            views.append(PageView(name=f"state{i}", dtype=dtype, shape=shape, offset_bytes=offset))
            offset += prod(shape) * dtype_size(dtype)
        return SpecTraits(
            hits_at_own_block_boundaries=True,
            context_parallel_sharded=False,
            kind="mamba",
            needs_zeroed_buffers=True,
            device_views=tuple(views),
            device_view_is_tuple=True,
            page_paddable=True,
            fixed_state_per_request=True,
        )

    def copy_with_new_block_size(self, block_size: int, /) -> Self:
        return dataclasses.replace(self, block_size=block_size)

    @classmethod
    def merge(cls, specs: list[Any], /) -> Self:
        merged: Self = merge_equal_specs(cls, specs)
        return merged

    def is_uniform_with_collection(self, specs: SpecCollection, /) -> bool:
        """Accepts a sequence or vLLM's layer -> spec dict (same answer)."""
        return all(
            isinstance(s, MambaSpec)
            and s.num_speculative_blocks == self.num_speculative_blocks
            and s.num_prefill_checkpoint_blocks == self.num_prefill_checkpoint_blocks
            and s.prefill_checkpoint_alignment == self.prefill_checkpoint_alignment
            for s in as_spec_list(specs)
        )
