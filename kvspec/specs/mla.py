"""Multi-head latent attention (DeepSeek) specs: MLA, its hidden-state marker, and sliding-window MLA.

MLA stores one latent vector per token (no separate K and V, so no factor 2). ``fp8_ds_mla`` packs a
token into 656 bytes (584 for DeepSeek V4). ``compress_ratio`` > 1 stores ``block_size // compress_ratio``
tokens per block (DeepSeek V4). ``alignment`` pads the page up to a multiple of that many bytes.
"""

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from typing_extensions import Self

from kvspec.contracts.checking import check_construction
from kvspec.contracts.spec import KVCacheSpec, SpecCollection, as_spec_list
from kvspec.contracts.traits import PageView, SpecTraits, attention_page_views
from kvspec.errors import SpecValidationError
from kvspec.intmath import round_up
from kvspec.specs._validate import require_optional_positive, require_positive
from kvspec.specs.attention import AttentionSpec, FullAttentionSpec, SlidingWindowSpec
from kvspec.specs.dtypes import dtype_size


def _latent_views(spec: AttentionSpec) -> tuple[PageView, ...]:
    """[stored token in block, kv head, head_size]: one latent vector per token (no K/V split)."""
    return attention_page_views(
        block_size=spec.storage_block_size,
        num_kv_heads=spec.num_kv_heads,
        head_sizes=(spec.head_size,),
        dtype=spec.dtype,
        real_page_bytes=spec.real_page_size_bytes,
    )


FP8_DS_MLA = "fp8_ds_mla"
DEEPSEEK_V4 = "deepseek_v4"
#: Bytes per token of the fp8_ds_mla layout (DeepSeek V3 / V3.2) and of DeepSeek V4's.
FP8_DS_MLA_TOKEN_BYTES = 656
FP8_DS_MLA_V4_TOKEN_BYTES = 584


def _validate_mla_fields(spec: AttentionSpec, compress_ratio: int, alignment: int | None) -> None:
    require_positive(spec, "compress_ratio", compress_ratio)
    require_optional_positive(spec, "alignment", alignment)
    if spec.block_size % compress_ratio:
        raise SpecValidationError(
            f"{type(spec).__name__}.block_size={spec.block_size} must be a multiple of "
            f"compress_ratio={compress_ratio}."
        )


def _apply_alignment_padding(spec: AttentionSpec, alignment: int | None) -> None:
    """Pad the page to a multiple of ``alignment`` bytes (recomputed on every construction)."""
    if alignment is None:
        return
    real = spec.real_page_size_bytes
    padded = round_up(real, alignment)
    if padded != real:
        object.__setattr__(spec, "page_size_padded", padded)


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Full attention over a compressed latent KV (one vector of ``head_size`` per token and KV head)."""

    cache_dtype_str: str | None = None
    alignment: int | None = None
    compress_ratio: int = 1
    model_version: str | None = None

    is_mla: ClassVar[bool] = True
    _kind: ClassVar[str] = "mla_attention"
    _family: ClassVar[str] = "latent"

    def __post_init__(self) -> None:
        _validate_mla_fields(self, self.compress_ratio, self.alignment)
        FullAttentionSpec.__post_init__(self)
        _apply_alignment_padding(self, self.alignment)

    @property
    def storage_block_size(self) -> int:
        return self.block_size // self.compress_ratio

    @property
    def real_page_size_bytes(self) -> int:
        if self.cache_dtype_str == FP8_DS_MLA:
            if self.model_version == DEEPSEEK_V4:
                return self.storage_block_size * FP8_DS_MLA_V4_TOKEN_BYTES
            return self.block_size * FP8_DS_MLA_TOKEN_BYTES
        return self.storage_block_size * self.num_kv_heads * self.head_size * dtype_size(self.dtype)

    def page_views(self) -> tuple[PageView, ...]:
        return _latent_views(self)


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class HiddenStateCacheSpec(MLAAttentionSpec):
    """Marks layers that cache hidden states (speculative decoding); each becomes its own group."""

    _zero_new_blocks: ClassVar[bool] = False

    def _declare_traits(self) -> SpecTraits:
        return dataclasses.replace(MLAAttentionSpec._declare_traits(self), own_group=True)

    def with_page_size(self, page_size_bytes: int) -> Self:
        """As many tokens per block as fit ``page_size_bytes`` (at least 1), padded to exactly that page."""
        per_token = self.num_kv_heads * self.head_size * dtype_size(self.dtype)
        return dataclasses.replace(
            self, block_size=max(page_size_bytes // per_token, 1), page_size_padded=page_size_bytes
        )


@check_construction
@dataclass(frozen=True, kw_only=True, slots=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """Sliding-window attention over an MLA latent (DeepSeek V4's local layers).

    Fixed on purpose: vLLM 0.23 never runs SlidingWindowSpec's initialiser here, so ``head_size_v`` stays
    None; kvspec sets it to ``head_size`` like every other attention spec.

    ``bounded_replay`` (vLLM 0.34's prefix replay): the window is never cached; after a prefix hit the
    engine recomputes the last ``sliding_window`` tokens (``prefix_replay_tokens``) to rebuild it, so the
    group is left out of the hit search and an admitted request gets fresh blocks for it.
    """

    cache_dtype_str: str | None = None
    alignment: int | None = None
    compress_ratio: int = 1
    model_version: str | None = None
    bounded_replay: bool = False

    def __post_init__(self) -> None:
        _validate_mla_fields(self, self.compress_ratio, self.alignment)
        if self.model_version not in (None, DEEPSEEK_V4):
            raise SpecValidationError(
                f"SlidingWindowMLASpec.model_version must be None or {DEEPSEEK_V4!r}, "
                f"got {self.model_version!r}."
            )
        if not isinstance(self.bounded_replay, bool):
            raise SpecValidationError(
                f"SlidingWindowMLASpec.bounded_replay must be a bool, got {self.bounded_replay!r}."
            )
        SlidingWindowSpec.__post_init__(self)
        _apply_alignment_padding(self, self.alignment)

    @property
    def storage_block_size(self) -> int:
        return self.block_size // self.compress_ratio

    @property
    def real_page_size_bytes(self) -> int:
        if self.cache_dtype_str == FP8_DS_MLA and self.model_version == DEEPSEEK_V4:
            return self.storage_block_size * FP8_DS_MLA_V4_TOKEN_BYTES
        return self.storage_block_size * self.num_kv_heads * self.head_size * dtype_size(self.dtype)

    _hybrid_off_families: ClassVar[tuple[str, ...]] = ("latent", "kv")
    _kind: ClassVar[str] = "sliding_window_mla"

    @property
    def prefix_replay_tokens(self) -> int:
        """Tokens the engine recomputes after a prefix hit to rebuild the window (0: none)."""
        return self.sliding_window if self.bounded_replay else 0

    def _declare_traits(self) -> SpecTraits:
        traits = SlidingWindowSpec._declare_traits(self)
        return dataclasses.replace(traits, prefix_cacheable=False) if self.bounded_replay else traits

    def page_views(self) -> tuple[PageView, ...]:
        return _latent_views(self)

    def to_full_attention(self, template: KVCacheSpec) -> KVCacheSpec:
        """MLA full attention with the template layer's block size (drops the window and alignment)."""
        return MLAAttentionSpec(
            block_size=template.block_size,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            dtype=self.dtype,
            kv_quant_mode=self.kv_quant_mode,
            cache_dtype_str=self.cache_dtype_str,
            compress_ratio=self.compress_ratio,
            model_version=self.model_version,
        )

    def is_uniform_with_collection(self, specs: SpecCollection, /) -> bool:
        return all(
            isinstance(s, SlidingWindowMLASpec)
            and s.sliding_window == self.sliding_window
            and s.bounded_replay == self.bounded_replay
            for s in as_spec_list(specs)
        )
