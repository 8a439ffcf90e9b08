"""Attention KV cache specs: full, TurboQuant, sink, sliding window, chunked local, encoder, cross.

All are frozen, keyword-only, slotted dataclasses (hashable values). Units: ``block_size`` in tokens,
``page_size_bytes`` in bytes per block of one layer, ``max_memory_usage_bytes`` in bytes per request.
Methods of slotted subclasses call their base explicitly (zero-argument ``super()`` breaks with slots on
CPython < 3.14).
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from typing_extensions import Self

from kvspec.contracts.checking import check_construction
from kvspec.contracts.spec import KVCacheSpec, SchedulerLimits, SpecCollection, as_spec_list
from kvspec.contracts.traits import PageView, SpecTraits, attention_page_views, cached_traits, is_count
from kvspec.errors import (
    SpecMergeError,
    SpecValidationError,
    UnsupportedConfigurationError,
    WindowSizeMismatchError,
)
from kvspec.intmath import cdiv
from kvspec.specs._validate import (
    require_dtype,
    require_non_negative,
    require_optional_positive,
    require_positive,
)
from kvspec.specs.dtypes import KVQuantMode, dtype_size, nvfp4_full

#: Fields that FullAttentionSpec.merge combines instead of requiring equality.
_WINDOW_FIELDS = frozenset({"sliding_window", "attention_chunk_size"})


def _kv_page_bytes(spec: "AttentionSpec") -> int:
    """K and V bytes of one block of ``spec``, without scales or padding (a function, not a ``super()``
    call: slotted dataclasses break zero-argument ``super``)."""
    d = dtype_size(spec.dtype)
    b, h = spec.block_size, spec.num_kv_heads
    if spec.kv_quant_mode.is_nvfp4:
        return b * h * (nvfp4_full(spec.head_size) + nvfp4_full(spec.value_head_size)) * d
    return b * h * (spec.head_size + spec.value_head_size) * d


def first_difference(a: object, b: object, skip: frozenset[str] = frozenset()) -> tuple[str, Any, Any] | None:
    """The first dataclass field (name, a's value, b's value) where ``a`` and ``b`` differ; for values that
    are not dataclasses, ``("value", a, b)`` unless they are equal."""
    if not dataclasses.is_dataclass(a):
        return None if a == b else ("value", a, b)
    for f in dataclasses.fields(a):
        if f.name in skip or not f.compare:
            continue
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if va != vb:
            return f.name, va, vb
    return None


def merge_equal_specs(cls: type, specs: Sequence[Any], skip: frozenset[str] = frozenset()) -> Any:
    """Check that ``specs`` are of one exact type, a ``cls``, and agree on every field outside ``skip``.

    The built-ins' ``merge`` takes ``list[Any]`` (see ``AttentionSpec.merge``), so this is where a list of
    another family's specs is refused."""
    if not specs:
        raise SpecMergeError(f"{cls.__name__}.merge() needs at least one spec, got none.")
    first = specs[0]
    if not isinstance(first, cls):
        raise SpecMergeError(
            f"{cls.__name__}.merge() got a {type(first).__name__}, which is not a {cls.__name__}; merge a "
            "group's specs with their own class's merge."
        )
    for spec in specs[1:]:
        if type(spec) is not type(first):
            raise SpecMergeError(
                f"Cannot merge {type(first).__name__} with {type(spec).__name__}: all layers in the "
                "same KV cache group must have the same spec type. Put them in separate groups "
                "(hybrid KV cache management) instead."
            )
        diff = first_difference(first, spec, skip)
        if diff is not None:
            name, va, vb = diff
            raise SpecMergeError(
                f"Cannot merge {type(first).__name__} specs: field {name!r} differs "
                f"({va!r} vs {vb!r}). All layers in the same KV cache group must be the same."
            )
    return first


def merge_window_sizes(spec_name: str, field: str, values: set[int | None]) -> int | None:
    """The one window (or chunk) size of a group: None if no layer has one."""
    real = {v for v in values if v is not None}
    if len(real) > 1:
        raise WindowSizeMismatchError(
            f"All attention layers in the same KV cache group must have the same {field}; "
            f"{spec_name} layers have {sorted(real)}."
        )
    return next(iter(real), None)


class _PagedSpec(Protocol):
    @property
    def unpadded_page_size_bytes(self) -> int: ...

    @property
    def page_size_padded(self) -> int | None: ...


def cached_page_size(spec: _PagedSpec) -> int:
    """A spec's page (bytes, padding included), computed once into its ``_page_size`` slot."""
    # A subclass declared without slots=True leaves the slot unset (dataclasses set init=False
    # defaults of a slotted base only in the base's __init__): unset reads as not computed yet.
    page: int = getattr(spec, "_page_size", 0)
    if not page:
        padded = spec.page_size_padded
        page = spec.unpadded_page_size_bytes if padded is None else padded
        object.__setattr__(spec, "_page_size", page)
    return page


def _default_value_head_size(spec: "FullAttentionSpec | SlidingWindowSpec") -> None:
    """``head_size_v`` defaults to ``head_size``; both must be positive."""
    require_positive(spec, "head_size", spec.head_size)
    if spec.head_size_v is None:
        object.__setattr__(spec, "head_size_v", spec.head_size)
    require_positive(spec, "head_size_v", spec.head_size_v)


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionSpec:
    """Common fields of attention specs; abstract (not registered, no memory bound of its own).

    Page layout: one K and one V vector of ``head_size`` elements per token and KV head; per-token-head
    quantisation adds two fp32 scales per token and head; ``page_size_padded`` (bytes) overrides the
    total and must not be smaller than it.

    ``dcp_sharded`` (vLLM 0.34's field): with decode context parallelism the layer's tokens are sharded
    over the ranks (a block spans ``block_size x DCP`` tokens); False for a layer every rank keeps whole,
    such as a draft model's (``SpecTraits.context_parallel_sharded``).
    """

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    kv_quant_mode: KVQuantMode = KVQuantMode.NONE
    page_size_padded: int | None = None
    dcp_sharded: bool = True
    #: page_size_bytes, computed on first use (specs are immutable); not part of equality or repr.
    _page_size: int = field(default=0, init=False, repr=False, compare=False)
    #: kv_cache_traits(), computed on first use like the page size.
    _traits: SpecTraits | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require_positive(self, "block_size", self.block_size)
        require_positive(self, "num_kv_heads", self.num_kv_heads)
        require_positive(self, "head_size", self.head_size)
        require_dtype(self, "dtype", self.dtype)
        if not isinstance(self.kv_quant_mode, KVQuantMode):
            raise SpecValidationError(
                f"{type(self).__name__}.kv_quant_mode must be a KVQuantMode, got {self.kv_quant_mode!r}."
            )
        require_optional_positive(self, "page_size_padded", self.page_size_padded)
        if self.page_size_padded is not None and self.page_size_padded < self.unpadded_page_size_bytes:
            raise SpecValidationError(
                f"{type(self).__name__}.page_size_padded={self.page_size_padded} is smaller than the "
                f"page it pads ({self.unpadded_page_size_bytes} bytes); use a value >= that or None."
            )
        if not isinstance(self.dcp_sharded, bool):
            raise SpecValidationError(
                f"{type(self).__name__}.dcp_sharded must be a bool, got {self.dcp_sharded!r}."
            )

    @property
    def storage_block_size(self) -> int:
        """Tokens stored per block in the tensor (differs from block_size only with compression)."""
        return self.block_size

    @property
    def value_head_size(self) -> int:
        """V's head size: ``head_size_v`` where a spec has one, else ``head_size``."""
        hsv: int | None = getattr(self, "head_size_v", None)
        return self.head_size if hsv is None else hsv

    @property
    def real_page_size_bytes(self) -> int:
        """K and V bytes of one block, without scales or padding."""
        return _kv_page_bytes(self)

    @property
    def unpadded_page_size_bytes(self) -> int:
        """Real page bytes plus fp32 per-token-head scales (one for K, one for V) if quantised so."""
        page = self.real_page_size_bytes
        if self.kv_quant_mode.is_per_token_head:
            page += 2 * self.block_size * self.num_kv_heads * 4
        return page

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of this layer, padding included."""
        return cached_page_size(self)

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        raise NotImplementedError(f"{type(self).__name__} has no memory bound of its own")

    def page_views(self) -> tuple[PageView, ...]:
        """[token in block, kv head, K (head_size) then V (value head size)] over the real page bytes."""
        return attention_page_views(
            block_size=self.block_size,
            num_kv_heads=self.num_kv_heads,
            head_sizes=(self.head_size, self.value_head_size),
            dtype=self.dtype,
            real_page_bytes=self.real_page_size_bytes,
        )

    def kv_cache_traits(self) -> SpecTraits:
        """The traits this spec declares (see kvspec.contracts.traits); subclasses override ``_declare_traits``."""
        return cached_traits(self, self._sharded_traits)

    def _sharded_traits(self) -> SpecTraits:
        traits = self._declare_traits()
        # A page read through a strided view can be padded; a latent (MLA) page is indexed in token rows.
        paddable = traits.full_attention_family != "latent"
        if self.dcp_sharded and traits.page_paddable == paddable:
            return traits
        return dataclasses.replace(
            traits,
            context_parallel_sharded=traits.context_parallel_sharded and self.dcp_sharded,
            page_paddable=paddable,
        )

    def _declare_traits(self) -> SpecTraits:
        return SpecTraits(device_views=self.page_views())

    def copy_with_new_block_size(self, block_size: int, /) -> Self:
        return dataclasses.replace(self, block_size=block_size)

    @classmethod
    def merge(cls, specs: list[Any], /) -> Self:
        """Specs that are all equal merge into the first one; anything else is a SpecMergeError.

        ``list[Any]``, not the protocol's ``list[Self]``: a subclass ported from vLLM overrides it with
        ``specs: list[Self]``, and ``list`` is invariant, so pyright would reject that override of a
        ``list[Self]`` parameter (soundly: through a base reference ``Self`` is the base). The protocol keeps
        ``list[Self]``, and ``merge_equal_specs`` refuses specs of another class at run time."""
        merged: Self = merge_equal_specs(cls, specs)
        return merged

    def is_uniform_with_collection(self, specs: SpecCollection, /) -> bool:
        """Accepts a sequence or vLLM's layer -> spec dict (same answer)."""
        return all(isinstance(s, type(self)) for s in as_spec_list(specs))


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class FullAttentionSpec(AttentionSpec):
    """Every token attends to every earlier token: one block per ``block_size`` tokens of the request.

    ``head_size_v`` defaults to ``head_size``. ``sliding_window`` / ``attention_chunk_size`` are set only
    when a windowed layer was converted to full attention (hybrid manager disabled); at most one is set.
    """

    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    #: MLA specs must be merged by MLAAttentionSpec.merge, never mixed with plain full attention.
    is_mla: ClassVar[bool] = False
    #: KV event kind and full-attention family of the class (traits).
    _kind: ClassVar[str] = "full_attention"
    _family: ClassVar[str] = "kv"
    #: vLLM reports new block ids (for zeroing) for exactly Full, TQFull and MLA specs.
    _zero_new_blocks: ClassVar[bool] = True

    def _declare_traits(self) -> SpecTraits:
        return SpecTraits(
            prefix_hits_left_closed=True,
            full_attention_family=self._family,
            kind=self._kind,
            zero_new_blocks=self._zero_new_blocks,
            device_views=self.page_views(),
        )

    def __post_init__(self) -> None:
        _default_value_head_size(self)
        require_optional_positive(self, "sliding_window", self.sliding_window)
        require_optional_positive(self, "attention_chunk_size", self.attention_chunk_size)
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            raise SpecValidationError(
                f"{type(self).__name__} sets both sliding_window={self.sliding_window} and "
                f"attention_chunk_size={self.attention_chunk_size}; a layer has at most one of them."
            )
        AttentionSpec.__post_init__(self)

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        """ceil(tokens / block_size) pages, tokens being max_model_len split over the CP ranks (a layer
        every rank keeps whole, ``dcp_sharded=False``, holds them all)."""
        tokens = limits.max_model_len
        cp = limits.context_parallel_size if self.dcp_sharded else 1
        if cp > 1:
            tokens = cdiv(tokens, cp)
        return cdiv(tokens, self.block_size) * self.page_size_bytes

    @classmethod
    def merge(cls, specs: list[Any], /) -> Self:
        """Merge one group's full-attention specs.

        Differences from vLLM 0.23, on purpose: the specs must be of one exact class (a TurboQuant or sink
        spec merged into a plain one would silently change its page size), and every field other than the
        window sizes must agree (vLLM does not compare ``head_size_v`` or the subclass fields).
        """
        first: Self = merge_equal_specs(cls, specs, skip=_WINDOW_FIELDS)
        if any(getattr(s, "is_mla", False) for s in specs) and not cls.is_mla:
            raise SpecMergeError(
                "MLAAttentionSpec must be merged by MLAAttentionSpec.merge, not with full attention."
            )
        name = type(first).__name__
        window = merge_window_sizes(name, "sliding_window", {s.sliding_window for s in specs})
        chunk = merge_window_sizes(name, "attention_chunk_size", {s.attention_chunk_size for s in specs})
        if window is not None and chunk is not None:
            raise SpecMergeError(
                f"{name} layers of one group mix sliding_window={window} and "
                f"attention_chunk_size={chunk}; a group can only have one of them."
            )
        return dataclasses.replace(first, sliding_window=window, attention_chunk_size=chunk)

    def is_uniform_with_collection(self, specs: SpecCollection, /) -> bool:
        """Accepts a sequence or vLLM's layer -> spec dict (same answer)."""
        return all(isinstance(s, FullAttentionSpec) for s in as_spec_list(specs))


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class TQFullAttentionSpec(FullAttentionSpec):
    """TurboQuant full attention: each token-head slot is ``tq_slot_size`` bytes for K and V together."""

    tq_slot_size: int = 0

    def __post_init__(self) -> None:
        if self.tq_slot_size < 0:
            raise SpecValidationError(
                f"TQFullAttentionSpec.tq_slot_size must be >= 0, got {self.tq_slot_size!r}."
            )
        FullAttentionSpec.__post_init__(self)

    @property
    def real_page_size_bytes(self) -> int:
        if self.tq_slot_size > 0:
            return self.block_size * self.num_kv_heads * self.tq_slot_size
        return _kv_page_bytes(self)


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class SinkFullAttentionSpec(FullAttentionSpec):
    """Full attention whose first ``sink_len`` tokens (attention sinks) live in reserved blocks."""

    sink_len: int | None = None

    _kind: ClassVar[str] = "sink_full_attention"
    _zero_new_blocks: ClassVar[bool] = False

    def __post_init__(self) -> None:
        require_optional_positive(self, "sink_len", self.sink_len)
        FullAttentionSpec.__post_init__(self)


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class RSWASpec(FullAttentionSpec):
    """vLLM 0.34's reference sliding window (R-SWA): the prompt stays visible, and of the generated tokens
    only the last ``rswa_window`` (tokens) are kept; the blocks in between are freed during decode. Grouped,
    sized and searched for hits as full attention (no admission cap)."""

    rswa_window: int

    def __post_init__(self) -> None:
        require_positive(self, "rswa_window", self.rswa_window)
        FullAttentionSpec.__post_init__(self)


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class SlidingWindowSpec(AttentionSpec):
    """Each token attends to the last ``sliding_window`` tokens (itself included).

    ``extra_retained_tokens`` (tokens, vLLM 0.34): that many tokens below the window are kept, though not
    read, because an engine with several speculative modules re-prefills the last ones (vLLM's planner sets
    it to ``num_prefill_lookahead_tokens - 1``); blocks are freed that much later and a request may hold
    that much more."""

    sliding_window: int
    head_size_v: int | None = None
    extra_retained_tokens: int = 0

    def __post_init__(self) -> None:
        _default_value_head_size(self)
        require_positive(self, "sliding_window", self.sliding_window)
        require_non_negative(self, "extra_retained_tokens", self.extra_retained_tokens)
        AttentionSpec.__post_init__(self)

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        """Blocks one request can hold at once: the window plus one step's tokens, +1 because the
        window may start in the middle of a block (the traits' admission cap, declared once)."""
        return _admission_cap(self, max_num_batched_tokens, max_model_len)

    #: Families whose full-attention layer a hybrid-off conversion follows (traits).
    _hybrid_off_families: ClassVar[tuple[str, ...]] = ("kv",)
    _kind: ClassVar[str] = "sliding_window"

    def _declare_traits(self) -> SpecTraits:
        return SpecTraits(
            admission_lookback_tokens=self.sliding_window - 1 + self.extra_retained_tokens,
            admission_extra_blocks=1,
            sliding_window=self.sliding_window,
            extra_retained_tokens=self.extra_retained_tokens,
            event_sliding_window=self.sliding_window,
            hybrid_off_families=self._hybrid_off_families,
            kind=self._kind,
            device_views=self.page_views(),
        )

    def to_full_attention(self, template: KVCacheSpec) -> KVCacheSpec:
        """Full attention that remembers the window (memory is then sized for full attention)."""
        return FullAttentionSpec(
            block_size=self.block_size,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            head_size_v=self.head_size_v,
            dtype=self.dtype,
            kv_quant_mode=self.kv_quant_mode,
            sliding_window=self.sliding_window,
            page_size_padded=self.page_size_padded,
        )

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        if limits.decode_context_parallel_size != 1:
            raise UnsupportedConfigurationError(
                f"{type(self).__name__} does not support decode context parallelism "
                f"(decode_context_parallel_size={limits.decode_context_parallel_size}); use 1."
            )
        blocks = self.max_admission_blocks_per_request(limits.batched_tokens, limits.max_model_len)
        return blocks * self.page_size_bytes

    def is_uniform_with_collection(self, specs: SpecCollection, /) -> bool:
        """Accepts a sequence or vLLM's layer -> spec dict (same answer)."""
        return all(
            isinstance(s, SlidingWindowSpec) and s.sliding_window == self.sliding_window
            for s in as_spec_list(specs)
        )


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Tokens attend only within their chunk of ``attention_chunk_size`` tokens (Llama 4 local layers)."""

    attention_chunk_size: int

    def __post_init__(self) -> None:
        require_positive(self, "attention_chunk_size", self.attention_chunk_size)
        AttentionSpec.__post_init__(self)

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        """Blocks one request can hold at once: one chunk plus one step's tokens (the traits' admission
        cap, declared once)."""
        return _admission_cap(self, max_num_batched_tokens, max_model_len)

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        blocks = self.max_admission_blocks_per_request(limits.batched_tokens, limits.max_model_len)
        return blocks * self.page_size_bytes

    def _declare_traits(self) -> SpecTraits:
        return SpecTraits(
            admission_lookback_tokens=self.attention_chunk_size,
            attention_chunk_size=self.attention_chunk_size,
            hybrid_off_families=("kv",),
            kind="chunked_local_attention",
            device_views=self.page_views(),
        )

    def to_full_attention(self, template: KVCacheSpec) -> KVCacheSpec:
        """Full attention that remembers the chunk size (keeps its kv_quant_mode, unlike vLLM 0.23)."""
        return FullAttentionSpec(
            block_size=self.block_size,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            dtype=self.dtype,
            kv_quant_mode=self.kv_quant_mode,
            attention_chunk_size=self.attention_chunk_size,
            page_size_padded=self.page_size_padded,
        )

    def is_uniform_with_collection(self, specs: SpecCollection, /) -> bool:
        """Accepts a sequence or vLLM's layer -> spec dict (same answer)."""
        return all(
            isinstance(s, ChunkedLocalAttentionSpec) and s.attention_chunk_size == self.attention_chunk_size
            for s in as_spec_list(specs)
        )


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class EncoderOnlyAttentionSpec(AttentionSpec):
    """Encoder self-attention: computed in one pass, never cached by the scheduler (0 bytes)."""

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        return 0

    def _declare_traits(self) -> SpecTraits:
        return SpecTraits(kind="encoder_only_attention", device_views=self.page_views())


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class CrossAttentionSpec(AttentionSpec):
    """Decoder cross-attention over encoder outputs: sized by the encoder's input tokens."""

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        return cdiv(limits.max_num_encoder_input_tokens, self.block_size) * self.page_size_bytes

    def _declare_traits(self) -> SpecTraits:
        return SpecTraits(
            allocate_per_encoder_input=True,
            supports_prefix_caching=False,
            kind="cross_attention",
            device_views=self.page_views(),
        )


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class CircularBufferSpec(AttentionSpec):
    """vLLM 0.34's ring: one block per request, for its whole life, holding the keys of the token group
    still being compressed (``block_size`` is the ring capacity). Never prefix-cached nor hit; the other
    groups of the model cache and hit as usual.

    ``head_size_v``: None stores a V vector of ``head_size`` beside each K; 0 stores keys only (DeepSeek V4's
    compressor state, vLLM's ``head_size_v=0``)."""

    head_size_v: int | None = field(default=None, metadata={"zero_means_no_value_head": True})

    def __post_init__(self) -> None:
        value: object = self.head_size_v
        if value is not None and not is_count(value, 0):
            raise SpecValidationError(
                f"CircularBufferSpec.head_size_v must be None or an int >= 0, got {self.head_size_v!r}."
            )
        AttentionSpec.__post_init__(self)

    def max_memory_usage_bytes(self, limits: SchedulerLimits, /) -> int:
        return self.page_size_bytes  # one block per request, whatever its length

    def _declare_traits(self) -> SpecTraits:
        return SpecTraits(
            prefix_cacheable=False,
            fixed_state_per_request=True,
            kind="circular_buffer",
            device_views=self.page_views(),
        )


def _admission_cap(spec: AttentionSpec, max_num_batched_tokens: int, max_model_len: int) -> int:
    cap = spec.kv_cache_traits().admission_cap_blocks(spec.block_size, max_num_batched_tokens, max_model_len)
    if cap is None:  # pragma: no cover - both callers declare an admission lookback
        raise SpecValidationError(f"{type(spec).__name__} declares no admission cap.")
    return cap
