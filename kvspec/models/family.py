"""A model family: an object that carries its rules, and the one registry of families.

A family knows the ``model_type`` values it covers, the config keys it reads, which cache each layer holds
(:meth:`ModelFamily.layer_caches`), how big its attention is (:meth:`ModelFamily.attention_dims`), its state
layers' shapes through the shared calculators of :mod:`kvspec.models.state_shapes`
(:meth:`ModelFamily.state_layout`, as vLLM's model classes call ``MambaStateShapeCalculator``) and its
Hugging Face class's defaults. Nothing outside a family tests which family it is.

Adding a family is one module under ``kvspec/models/families/`` (a ``ModelFamily`` subclass overriding what
differs, and one ``FAMILIES.register`` line), its test and a real config under ``tests/fixtures/configs``.
A plugin registers its own the same way. A ``model_type`` of no family is refused (``ModelConfigError``
naming it and the families), since planning an unknown hybrid as a dense decoder gives a silently wrong
figure; ``assume_dense=True`` (``--assume-dense``) plans it as the dense family on purpose.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from kvspec.errors import ModelConfigError, ModelFamilyError, UnknownModelFamilyError
from kvspec.models.config_reader import ATTENTION_TYPES, KV_HEAD_KEYS, ConfigReader, LayerCaches, single_cache
from kvspec.models.decoder import BuildSettings, FamilyLayers, build_decoder
from kvspec.models.state_shapes import StateLayout
from kvspec.models.vllm_architectures import ARCHITECTURES, VLLM_RELEASE
from kvspec.named_registry import NamedRegistry

#: Falcon's model types: without ``new_decoder_architecture`` its ``multi_query`` means one KV head.
_FALCON_TYPES = frozenset({"falcon", "RefinedWeb", "RefinedWebModel"})

#: The keys every attention decoder reads.
ATTENTION_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "max_position_embeddings",
)


def check_tensor_parallel(heads: int, kv_heads: int, tp: int, model_type: str) -> int:
    """KV heads per rank under the rule engines use: attention heads divide by TP, and KV heads divide by
    TP (split) or TP by KV heads (each rank holds one replicated KV head). Grouped-query attention needs
    the KV heads to divide the attention heads: a config where they do not is refused, not planned."""
    if kv_heads > heads or heads % kv_heads:
        raise ModelConfigError(
            f"the {model_type} config's num_key_value_heads={kv_heads} does not divide its "
            f"num_attention_heads={heads} (grouped-query attention shares each KV head among a whole number "
            "of attention heads); check the config."
        )
    if heads % tp:
        raise ModelConfigError(
            f"tensor_parallel_size={tp} does not divide the {model_type} model's {heads} attention heads; "
            f"use a divisor of {heads}."
        )
    if kv_heads % tp and tp % kv_heads:
        divisors = ", ".join(str(d) for d in range(1, kv_heads + 1) if kv_heads % d == 0)
        raise ModelConfigError(
            f"tensor_parallel_size={tp} must divide the {kv_heads} KV heads (or be a multiple of them, so each "
            f"rank replicates one); use e.g. {divisors}."
        )
    return max(1, kv_heads // tp)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelFamily:
    """A family of models kvspec plans from their Hugging Face config.

    ``key``: its registry name ("dense", "nemotron_h"); ``name``: its name for people; ``model_types``: the
    ``model_type`` values it covers (no two families share one); ``caches``: what its layers cache, in
    words (docs/MODELS.md); ``keys``: the config keys it reads; ``default_max_positions``: the
    ``max_position_embeddings`` its Hugging Face classes default to, by model type (a config that leaves it
    out must not plan another context length); ``latent_attention``: its attention caches one latent per
    token (MLA), the only kind ``kv_cache_dtype="fp8_ds_mla"`` applies to; ``head_size_from_hidden``: its
    attention's head size is ``hidden_size / heads`` whatever ``head_dim`` says (Granite 4.0-H, LFM2).

    The base class is a plain attention decoder: ``layer_types`` when the config lists them, else
    :meth:`pattern` (full attention everywhere); override what differs.
    """

    key: str
    name: str
    model_types: tuple[str, ...]
    caches: str
    keys: tuple[str, ...] = ATTENTION_KEYS
    default_max_positions: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    latent_attention: bool = False
    head_size_from_hidden: bool = False

    def build(self, config: ConfigReader, settings: BuildSettings) -> FamilyLayers:
        """One spec per cache layer of one TP rank, the context length and notes."""
        return build_decoder(self, config, settings)

    def layer_caches(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        """The caches each of the ``num_layers`` layers holds."""
        if config.has("layer_types"):
            kinds = config.layer_types("layer_types", num_layers, ATTENTION_TYPES)
            return [single_cache(k) for k in kinds]
        return self.pattern(config, num_layers)

    def pattern(self, config: ConfigReader, num_layers: int) -> list[LayerCaches]:
        """The layers' caches when the config lists no ``layer_types``: full attention in every layer."""
        return [("full",)] * num_layers

    def attention_dims(self, config: ConfigReader, tp: int) -> tuple[int, int]:
        """(KV heads on one of ``tp`` ranks, head size) of the attention layers, read as vLLM 0.34's
        architecture convertor reads them: the KV heads under the first of :data:`KV_HEAD_KEYS` the config
        sets (one for Falcon's multi-query attention), else one per attention head; the head size
        ``head_dim`` (when positive), else ``hidden_size_per_head``, else (or with
        ``head_size_from_hidden``) ``hidden_size / num_attention_heads``."""
        heads = config.positive_int("num_attention_heads")
        if (
            config.model_type in _FALCON_TYPES
            and config.get("multi_query")
            and not config.get("new_decoder_architecture")
        ):
            kv_heads = 1
        else:
            kv_key = next((k for k in KV_HEAD_KEYS if config.has(k)), None)
            kv_heads = heads if kv_key is None else config.positive_int(kv_key)
        head_dim: object = None
        if not self.head_size_from_hidden:
            # A head_dim of 0 is unset, as vLLM reads it (some config classes fill it in as 0).
            head_dim = config.get("head_dim") or config.get("hidden_size_per_head")
        if head_dim is None:
            head_dim = config.positive_int("hidden_size") // heads
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
            raise ModelConfigError(
                f"{config.model_type} config key 'head_dim' must be a positive integer, got {head_dim!r}."
            )
        return check_tensor_parallel(heads, kv_heads, tp, config.model_type), head_dim

    def state_layout(self, config: ConfigReader, tp: int, model_dtype: torch.dtype) -> StateLayout:
        """The state of the family's state layers on one of ``tp`` ranks; a family without state layers
        refuses a config that names some."""
        raise ModelConfigError(
            f"{config.model_type} config names state layers, which the {self.name} family has none of."
        )


def _check_family(name: str, family: ModelFamily) -> ModelFamily:
    given: object = family
    if not isinstance(given, ModelFamily):
        raise ModelFamilyError(
            f"Model family {name!r}: register a kvspec.models.ModelFamily (a subclass overriding what differs), "
            f"got {type(given).__name__}."
        )
    if family.key != name:
        raise ModelFamilyError(f"Model family {name!r}: its key is {family.key!r}; register it under that.")
    if not family.model_types:
        raise ModelFamilyError(f"Model family {name!r} covers no model_type.")
    for entry in FAMILIES.entries():
        shared = sorted(set(entry.item.model_types) & set(family.model_types))
        if shared and entry.name != name:
            raise ModelFamilyError(
                f"Model family {name!r}: model_type {', '.join(map(repr, shared))} is already the "
                f"{entry.name!r} family's."
            )
    return family


#: The model families by key; built-ins register in kvspec.models.families, one line each.
FAMILIES: NamedRegistry[ModelFamily] = NamedRegistry(
    what="Model family",
    error=ModelFamilyError,
    unknown_error=UnknownModelFamilyError,
    register_with="kvspec.models.FAMILIES.register",
    example="nemotron_h",
    check=_check_family,
)
#: The family ``assume_dense`` plans an unknown model_type as.
DENSE = "dense"


def model_families() -> tuple[ModelFamily, ...]:
    """Every registered family, built-ins first in the order docs/MODELS.md lists them."""
    return tuple(entry.item for entry in FAMILIES.entries())


def supported_model_types() -> list[str]:
    return sorted(t for family in model_families() for t in family.model_types)


#: What vLLM's model code keeps beside a per-token K/V cache, in words (markers of vllm_architectures).
_MARKER_WORDS = {
    "mamba1": "Mamba1 state layers",
    "mamba2": "Mamba2 state layers",
    "short_conv": "short-convolution state layers",
    "gated_delta_net": "Gated DeltaNet state layers",
    "linear_attention": "lightning (linear) attention state layers",
    "kda": "KDA (Kimi Delta Attention) state layers",
    "mla": "a compressed latent (MLA) cache",
    "sparse_indexer": "a sparse-attention indexer cache",
    "chunked_local": "chunked local attention",
}


def _served_architecture(architectures: Sequence[str]) -> tuple[str, str, tuple[str, ...]] | None:
    """(architecture, vLLM module, cache markers) of the first of ``architectures`` vLLM serves."""
    for arch in architectures:
        if arch in ARCHITECTURES:
            module, markers = ARCHITECTURES[arch]
            return arch, module, markers
    return None


def recognise_family(
    model_type: str, inner_type: str, *, assume_dense: bool = False, architectures: Sequence[str] = ()
) -> ModelFamily:
    """The family of a config whose ``model_type`` is ``model_type`` (``inner_type``: its text config's, the
    one that decides for multimodal wrappers such as Gemma 3's).

    A type no family covers is refused. When the config's ``architectures`` name one vLLM serves, the
    refusal says what that architecture's code caches (:mod:`kvspec.models.vllm_architectures`), and
    ``assume_dense`` plans it as a dense decoder only if that code shows no state, latent, indexer or
    chunked cache: planned as dense, such a model would be sized wrong without a word."""
    families = model_families()
    by_type = {t: family for family in families for t in family.model_types}
    family = by_type.get(inner_type) or by_type.get(model_type)
    if family is not None:
        return family
    unknown = f"kvspec does not know model_type {inner_type!r}" + (
        f" (in a {model_type!r} config)" if inner_type != model_type else ""
    )
    served = _served_architecture(architectures)
    beyond = [m for m in served[2] if m in _MARKER_WORDS] if served is not None else []
    if served is not None and beyond:
        raise ModelConfigError(
            f"{unknown}. vLLM {VLLM_RELEASE} serves its architecture {served[0]} (model code {served[1]!r}) "
            f"with {', '.join(_MARKER_WORDS[m] for m in beyond)}, which no kvspec family plans yet, so it is "
            "refused"
            + (
                " even with --assume-dense: planned as a dense decoder it would be sized wrong"
                if assume_dense
                else ""
            )
            + "."
        )
    if assume_dense:
        return FAMILIES.entry(DENSE).item
    names = "; ".join(f"{f.name}: {', '.join(f.model_types)}" for f in families)
    if served is not None:
        arch, module, markers = served
        windows = (
            " (its code reads per-layer sliding windows: the config's layer_types say which)"
            if "sliding_window" in markers
            else ""
        )
        raise ModelConfigError(
            f"{unknown}. vLLM {VLLM_RELEASE} serves its architecture {arch} (model code {module!r}) as an "
            f"attention decoder with no state, latent or indexer cache{windows}. Supported families: {names}. "
            "Pass --assume-dense (assume_dense=True) to plan it as a dense decoder."
        )
    raise ModelConfigError(
        f"{unknown}, so it cannot tell which layers hold which cache. Supported families: {names}. "
        "If the model is a plain decoder (full attention in every layer), pass --assume-dense "
        "(assume_dense=True) to plan it as one."
    )


__all__ = [
    "ATTENTION_KEYS",
    "DENSE",
    "FAMILIES",
    "ModelFamily",
    "check_tensor_parallel",
    "model_families",
    "recognise_family",
    "supported_model_types",
]
