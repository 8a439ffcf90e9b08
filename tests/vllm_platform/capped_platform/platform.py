"""The platform: vLLM's CPU platform whose full-attention layers emit ``CappedFullAttentionSpec``.

vLLM imports this module while it resolves its current platform, so it imports only the platform base here;
the layers are taught the platform's spec when vLLM first asks the platform for an attention backend (in the
process that builds the model, before any layer's KV-cache spec is read), as a platform patches vLLM's
modules from its own hooks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.platforms.cpu import CpuPlatform

_layers_taught = False


def _teach_layers() -> None:
    """vLLM's attention layers answer this platform's spec where theirs would be plain full attention."""
    global _layers_taught
    if _layers_taught:
        return
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from capped_platform.kv_cache import CappedFullAttentionSpec

    own_spec = Attention.get_kv_cache_spec

    def platform_spec(self: Any, vllm_config: Any) -> Any:
        spec = own_spec(self, vllm_config)
        if type(spec) is FullAttentionSpec:
            fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.init}
            return CappedFullAttentionSpec(**fields)
        return spec

    Attention.get_kv_cache_spec = platform_spec
    _layers_taught = True


class CappedCpuPlatform(CpuPlatform):  # type: ignore[misc]
    """vLLM's CPU platform, with this platform's KV-cache spec and manager."""

    @classmethod
    def get_attn_backend_cls(cls, *args: Any, **kwargs: Any) -> Any:
        _teach_layers()
        return super().get_attn_backend_cls(*args, **kwargs)

    @classmethod
    def register_custom_kv_cache_specs(cls, vllm_config: Any) -> None:
        from capped_platform.kv_cache import register_capped_specs

        register_capped_specs()
