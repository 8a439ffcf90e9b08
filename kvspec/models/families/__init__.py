"""The built-in model families, one module each; importing this package registers them in
:data:`kvspec.models.family.FAMILIES`, in the order docs/MODELS.md lists them (the order below)."""

# isort: off
from kvspec.models.families import dense, gemma, gpt_oss, llama4, mla  # noqa: F401  (each registers its family)
from kvspec.models.families import jamba, nemotron_h, granite_hybrid, falcon_h1, zamba2  # noqa: F401
from kvspec.models.families import qwen3_next, minimax, lfm2, whisper  # noqa: F401

# isort: on
from kvspec.models.family import (
    FAMILIES,
    ModelFamily,
    model_families,
    recognise_family,
    supported_model_types,
)

__all__ = ["FAMILIES", "ModelFamily", "model_families", "recognise_family", "supported_model_types"]
