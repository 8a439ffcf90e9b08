"""Spec traits: every behaviour the core needs from a spec, declared by the spec, never inferred from its class.

The planner, the coordinator, KV events and the device code ask a spec these questions through
:func:`traits_of`, and nothing else. A spec answers by defining ``kv_cache_traits(self) -> SpecTraits``
(per instance, so window sizes and page shapes can depend on its fields). A spec that defines nothing gets
``SpecTraits()``: the most conservative answers (hits searched per group, no admission cap, one raw byte
view of each page). Only ``kvspec/specs/`` may test for a built-in spec class; a plugin family that derives
from nothing built in gets every behaviour a built-in gets by declaring the same traits.

Two traits need the spec to build a new spec, so they come with an optional method each
(see :class:`SpecHooks`): ``to_full_attention`` (hybrid manager off) and ``with_page_size`` (own-group
layers such as hidden-state caches).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from kvspec.contracts.spec import KVCacheSpec, replace_fields
from kvspec.errors import SpecValidationError, TraitsError
from kvspec.intmath import cdiv


def is_count(value: object, minimum: int) -> bool:
    """An int (not a bool) >= minimum; takes ``object`` because plugins hand in anything at run time."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


@dataclass(frozen=True, kw_only=True, slots=True)
class PageView:
    """One typed tensor inside a block's page: ``shape`` elements of ``dtype`` at ``offset_bytes``.

    Invariant: ``offset_bytes + prod(shape) * dtype.itemsize`` is at most the page size.
    """

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset_bytes: int = 0

    def __post_init__(self) -> None:
        dtype: object = self.dtype
        if not isinstance(dtype, torch.dtype):
            raise SpecValidationError(f"PageView.dtype must be a torch.dtype, got {self.dtype!r}.")
        shape: object = self.shape
        if not isinstance(shape, tuple) or not shape or not all(is_count(n, 1) for n in shape):
            raise SpecValidationError(f"PageView.shape must be a tuple of positive ints, got {self.shape!r}.")
        if not is_count(self.offset_bytes, 0):
            raise SpecValidationError(
                f"PageView.offset_bytes must be an int >= 0, got {self.offset_bytes!r}."
            )

    @property
    def num_bytes(self) -> int:
        """Bytes this view covers in one page."""
        return math.prod(self.shape) * int(self.dtype.itemsize)


@dataclass(frozen=True, kw_only=True, slots=True)
class SpecTraits:
    """What the core needs to know about one spec. All fields have the conservative default.

    Hit search and allocation:
    - ``prefix_hits_left_closed``: a hit of n blocks implies every shorter prefix is a hit (full attention).
      The hybrid hit search then truncates this group's hit instead of searching it again.
    - ``hits_at_own_block_boundaries``: hits end only where this spec's own block ends (a state snapshot
      per block, like Mamba); when its block is not the smallest, hashes are taken at the scheduler block.
    - ``admission_lookback_tokens`` / ``admission_extra_blocks``: a request never holds more than
      ``cdiv(min(lookback + max_num_batched_tokens, max_model_len), block_size) + extra`` blocks at once
      (sliding window: lookback = window - 1, extra = 1; chunked local: lookback = chunk, extra = 0).
      None: no cap.
    - ``allocate_per_encoder_input``: blocks are sized by the request's encoder tokens (cross attention).
    - ``supports_prefix_caching`` / ``supports_eagle_with_prefix_caching``: refused settings (the whole
      model runs without prefix caching, or without EAGLE).
    - ``prefix_cacheable``: False for a group whose blocks are never cached nor hit (a ring buffer beside
      full attention, vLLM's ``prefix_cacheable=False``): the other groups cache and hit as usual, the hit
      search leaves this group out, and an admitted request gets fresh blocks for it.
    - ``sliding_window`` / ``attention_chunk_size``: the window (tokens) that window managers read.
      ``extra_retained_tokens``: tokens below the window a window manager keeps, unread (an engine with
      several speculative modules re-prefills them; vLLM 0.34): they are skipped, and freed, that much later.
    - ``context_parallel_sharded``: with decode context parallelism a block's tokens are sharded over the
      ranks, so one block spans ``block_size x DCP`` tokens (attention). False: every rank holds the whole
      block (a Mamba state, a draft model's replicated layers); under vLLM 0.34's rules such a group keeps
      its block size beside sharded groups (``ManagerRules.context_parallel_per_group``).
    - ``tokens_per_block``: the tokens one block holds when that is not ``block_size`` (a compressed block
      domain: ``block_size`` rows of ``compress_ratio`` tokens each). Allocation, caching, hashing and hit
      lengths then count in these logical tokens. None: ``block_size`` tokens per block.

    Planning:
    - ``full_attention_family``: set when this spec *is* full attention of a family ("kv", "latent").
    - ``hybrid_off_families``: with the hybrid manager off, this spec converts to full attention through
      ``to_full_attention(template)``, the template being the first layer of the first family listed here
      that the model has. Empty: not convertible.
    - ``own_group``: each layer gets a KV cache group of its own, resized by ``with_page_size(page)``.
    - ``page_paddable``: the page may be padded to a larger one (``page_size_padded``) when page sizes are
      unified and scaling the block size cannot reach the common page (vLLM 0.34 pads attention pages read
      through a strided view, and Mamba states, whose page does not grow with the block; planning under
      ``PlanningRules.pad_pages``). False: only block-size scaling (MLA's pages are indexed in whole token rows).
    - ``fixed_state_per_request``: a request holds a fixed handful of this spec's blocks whatever its length
      (a recurrent state, a ring). When pages of several sizes are packed side by side in one block
      (``pack_pages``), such layers split into as many groups as it takes to fit the block the other layers
      need, rather than widen it (a sliding window does so too when no repeating layer pattern fixes its
      split).

    Events and devices:
    - ``kind``: the KV event kind routers see (e.g. "full_attention", "acme_windowed"); None: the
      registration's capability identifier, else "unknown". ``event_sliding_window``: window in events.
      ``kind_merged``: ``kind`` stands for layers of different kinds that are all full attention (a
      uniform-type group of full, sink, MLA layers: vLLM 0.34 reports it as full attention, 0.23 as
      unknown; ``ReleaseProfile.event_traits``).
    - ``zero_new_blocks``: the manager reports freshly allocated block ids (``take_new_block_ids``) so the
      runner can zero them; ``needs_zeroed_buffers``: the tensors must start zeroed (state read first).
    - ``device_views``: how one page is viewed as typed tensors; empty: one raw uint8 view of the page.
      ``device_view_is_tuple``: a layer's cache is a tuple of views even when there is one.
    """

    prefix_hits_left_closed: bool = False
    hits_at_own_block_boundaries: bool = False
    admission_lookback_tokens: int | None = None
    admission_extra_blocks: int = 0
    allocate_per_encoder_input: bool = False
    supports_prefix_caching: bool = True
    prefix_cacheable: bool = True
    supports_eagle_with_prefix_caching: bool = True
    sliding_window: int | None = None
    extra_retained_tokens: int = 0
    attention_chunk_size: int | None = None
    context_parallel_sharded: bool = True
    tokens_per_block: int | None = None
    full_attention_family: str | None = None
    hybrid_off_families: tuple[str, ...] = ()
    own_group: bool = False
    page_paddable: bool = False
    fixed_state_per_request: bool = False
    kind: str | None = None
    event_sliding_window: int | None = None
    kind_merged: bool = False
    zero_new_blocks: bool = False
    needs_zeroed_buffers: bool = False
    device_views: tuple[PageView, ...] = ()
    device_view_is_tuple: bool = False

    def __post_init__(self) -> None:
        for name in (
            "kind_merged",
            "prefix_hits_left_closed",
            "hits_at_own_block_boundaries",
            "allocate_per_encoder_input",
            "supports_prefix_caching",
            "prefix_cacheable",
            "supports_eagle_with_prefix_caching",
            "context_parallel_sharded",
            "own_group",
            "page_paddable",
            "fixed_state_per_request",
            "zero_new_blocks",
            "needs_zeroed_buffers",
            "device_view_is_tuple",
        ):
            if not isinstance(getattr(self, name), bool):
                raise TraitsError(f"SpecTraits.{name} must be a bool, got {getattr(self, name)!r}.")
        for name in (
            "admission_lookback_tokens",
            "sliding_window",
            "attention_chunk_size",
            "event_sliding_window",
        ):
            value = getattr(self, name)
            if value is not None and not is_count(value, 0):
                raise TraitsError(f"SpecTraits.{name} must be None or an int >= 0, got {value!r}.")
        per_block = self.tokens_per_block
        if per_block is not None and not is_count(per_block, 1):
            raise TraitsError(f"SpecTraits.tokens_per_block must be None or an int >= 1, got {per_block!r}.")
        for name in ("admission_extra_blocks", "extra_retained_tokens"):
            count = getattr(self, name)
            if not is_count(count, 0):
                raise TraitsError(f"SpecTraits.{name} must be an int >= 0, got {count!r}.")
        kind: object = self.kind
        if kind is not None and (not isinstance(kind, str) or not kind):
            raise TraitsError(f"SpecTraits.kind must be a non-empty str or None, got {self.kind!r}.")
        families: object = self.hybrid_off_families
        if not isinstance(families, tuple) or not all(isinstance(f, str) for f in families):
            raise TraitsError(
                f"SpecTraits.hybrid_off_families must be a tuple of str, got {self.hybrid_off_families!r}."
            )
        views: object = self.device_views
        if not isinstance(views, tuple) or not all(isinstance(v, PageView) for v in views):
            raise TraitsError(
                f"SpecTraits.device_views must be a tuple of PageView, got {self.device_views!r}."
            )

    def block_tokens(self, block_size: int) -> int:
        """Tokens one block holds for a spec of ``block_size``: ``tokens_per_block`` when declared."""
        return block_size if self.tokens_per_block is None else self.tokens_per_block

    def admission_cap_blocks(
        self, block_size: int, max_num_batched_tokens: int, max_model_len: int
    ) -> int | None:
        """The most blocks one request holds at once (None: no cap). Units: tokens in, blocks out."""
        if self.admission_lookback_tokens is None:
            return None
        return admission_cap(
            lookback_tokens=self.admission_lookback_tokens,
            extra_blocks=self.admission_extra_blocks,
            block_size=block_size,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
        )


def admission_cap(
    *,
    lookback_tokens: int,
    extra_blocks: int,
    block_size: int,
    max_num_batched_tokens: int,
    max_model_len: int,
) -> int:
    """Blocks a request holds at most when it reads ``lookback_tokens`` back (tokens in, blocks out):
    ``cdiv(min(lookback + max_num_batched_tokens, max_model_len), block_size) + extra_blocks``."""
    tokens = min(lookback_tokens + max_num_batched_tokens, max_model_len)
    return cdiv(tokens, block_size) + extra_blocks


DEFAULT_TRAITS = SpecTraits()


@runtime_checkable
class SpecHooks(Protocol):
    """Optional members a spec may define (all three are looked up by name, none is required).

    - ``kv_cache_traits()``: this spec's :class:`SpecTraits`.
    - ``to_full_attention(template)``: the full-attention form of this layer when the hybrid manager is
      off; ``template`` is a full-attention layer of the model (see ``SpecTraits.hybrid_off_families``).
    - ``with_page_size(page_size_bytes)``: the same layer resized to exactly that page (``own_group``).
    """

    def kv_cache_traits(self) -> SpecTraits: ...


def cached_traits(spec: Any, declare: Callable[[], SpecTraits]) -> SpecTraits:
    """``declare()`` once per spec instance, kept in its ``_traits`` slot (specs are immutable, like the
    page size they cache the same way)."""
    cached: SpecTraits | None = getattr(spec, "_traits", None)  # unset in a subclass without slots
    if cached is not None:
        return cached
    traits = declare()
    object.__setattr__(spec, "_traits", traits)
    return traits


def traits_of(spec: object) -> SpecTraits:
    """The traits ``spec`` declares (``SpecTraits()`` if it declares none). Raises TraitsError if the
    declaration is not a SpecTraits."""
    declare = getattr(spec, "kv_cache_traits", None)
    if declare is None:
        return DEFAULT_TRAITS
    try:
        traits = declare()
    except TraitsError:
        raise
    except Exception as exc:
        raise TraitsError(
            f"{type(spec).__name__}.kv_cache_traits() raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(traits, SpecTraits):
        raise TraitsError(
            f"{type(spec).__name__}.kv_cache_traits() must return a kvspec.SpecTraits, got {type(traits).__name__}."
        )
    return traits


def block_tokens_of(spec: KVCacheSpec) -> int:
    """Tokens one block of ``spec`` holds: its block size, or its declared ``tokens_per_block``."""
    return traits_of(spec).block_tokens(spec.block_size)


def full_attention_form(spec: KVCacheSpec, template: KVCacheSpec) -> KVCacheSpec:
    """``spec.to_full_attention(template)``, checked (hybrid manager off)."""
    convert = getattr(spec, "to_full_attention", None)
    if convert is None:
        raise TraitsError(
            f"{type(spec).__name__} declares hybrid_off_families but has no to_full_attention(template) method."
        )
    out: KVCacheSpec = convert(template)
    return out


def resized_to_page(spec: KVCacheSpec, page_size_bytes: int) -> KVCacheSpec:
    """``spec.with_page_size(page_size_bytes)``, checked (own-group layers)."""
    resize = getattr(spec, "with_page_size", None)
    if resize is None:
        raise TraitsError(f"{type(spec).__name__} declares own_group but has no with_page_size(page) method.")
    out: KVCacheSpec = resize(page_size_bytes)
    if out.page_size_bytes != page_size_bytes:
        raise TraitsError(
            f"{type(spec).__name__}.with_page_size({page_size_bytes}) gave a page of {out.page_size_bytes} bytes."
        )
    return out


def padded_to_page(spec: KVCacheSpec, page_size_bytes: int) -> KVCacheSpec:
    """``spec`` with its page padded to ``page_size_bytes`` (its ``page_size_padded`` field; a
    ``page_paddable`` spec), checked: the page must come out at exactly that size."""
    try:
        out: KVCacheSpec = replace_fields(spec, page_size_padded=page_size_bytes)
    except (TypeError, ValueError) as exc:
        raise TraitsError(
            f"{type(spec).__name__} declares page_paddable but cannot take page_size_padded={page_size_bytes}: {exc}"
        ) from exc
    if out.page_size_bytes != page_size_bytes:
        raise TraitsError(
            f"{type(spec).__name__} padded to {page_size_bytes} bytes gave a page of {out.page_size_bytes} bytes."
        )
    return out


def common_value(values: Sequence[Any]) -> Any:
    """The one value all ``values`` share, else None (used for uniform-type groups)."""
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def event_kind(traits: SpecTraits, registered_identifier: str | None) -> str:
    """The kind KV events report: the declared kind, else the registration's identifier, else "unknown"."""
    if traits.kind is not None:
        return traits.kind
    return registered_identifier if registered_identifier is not None else "unknown"


def attention_page_views(
    *, block_size: int, num_kv_heads: int, head_sizes: Sequence[int], dtype: torch.dtype, real_page_bytes: int
) -> tuple[PageView, ...]:
    """[token in block, kv head, sum(head_sizes)] of ``dtype`` if that covers the real page exactly, else
    one raw byte view of the real page (quantised layouts whose bytes are not one dtype)."""
    shape = (block_size, num_kv_heads, sum(head_sizes))
    if math.prod(shape) * dtype.itemsize == real_page_bytes:
        return (PageView(name="kv", dtype=dtype, shape=shape),)
    return (PageView(name="raw", dtype=torch.uint8, shape=(real_page_bytes,)),)
