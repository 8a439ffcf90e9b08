"""The protocols are shaped so that a port keeping vLLM's parameter names satisfies them under every checker:
a parameter vLLM names differently is positional-only (then no checker compares its name), in the protocol and
in every built-in a plugin overrides; and the registry's run-time checks agree with that."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

import pytest
import torch

from kvspec import (
    FullAttentionManager,
    FullAttentionSpec,
    KVCacheManager,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    Registry,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from kvspec.contracts.vllm_config import VllmConfig
from kvspec.errors import ManagerSignatureError
from kvspec.managers import SingleTypeKVCacheManager
from kvspec.tiers import HostTier, OffloadTier, SharedPool

#: (owner, method) -> the parameters that must be positional-only (vLLM's names differ: vllm_config,
#: kv_cache_specs, processed_computed_tokens, req_context).
POSITIONAL_ONLY: list[tuple[type, str, tuple[str, ...]]] = [
    *(
        (owner, "max_memory_usage_bytes", ("limits",))
        for owner in (KVCacheSpec, FullAttentionSpec, SlidingWindowSpec, MambaSpec, UniformTypeKVCacheSpecs)
    ),
    *((owner, "merge", ("specs",)) for owner in (KVCacheSpec, FullAttentionSpec, MambaSpec)),
    *(
        (owner, "is_uniform_with_collection", ("specs",))
        for owner in (KVCacheSpec, FullAttentionSpec, MLAAttentionSpec, MambaSpec)
    ),
    *((owner, "copy_with_new_block_size", ("block_size",)) for owner in (KVCacheSpec, FullAttentionSpec)),
    *(
        (owner, "remove_skipped_blocks", ("request_id", "total_computed_tokens"))
        for owner in (KVCacheManager, SingleTypeKVCacheManager)
    ),
    *(
        (owner, method, params)
        for owner in (OffloadTier, HostTier, SharedPool)
        for method, params in (
            ("lookup", ("key", "request")),
            ("prepare_load", ("keys", "request")),
            ("complete_load", ("keys", "request")),
            ("prepare_store", ("keys", "request")),
            ("complete_store", ("keys", "request")),
            ("on_request_finished", ("request",)),
        )
    ),
]


@pytest.mark.parametrize(
    ("owner", "method", "names"), POSITIONAL_ONLY, ids=[f"{o.__name__}.{m}" for o, m, _ in POSITIONAL_ONLY]
)
def test_parameters_vllm_names_differently_are_positional_only(
    owner: type, method: str, names: tuple[str, ...]
) -> None:
    params = inspect.signature(inspect.getattr_static(owner, method).__get__(None, owner)).parameters
    kinds = {n: params[n].kind for n in names}
    assert all(kind is inspect.Parameter.POSITIONAL_ONLY for kind in kinds.values()), kinds


def test_the_protocol_merge_keeps_list_of_self_and_the_builtins_take_list_of_any() -> None:
    """The protocol checks a plugin's merge against ``list[Self]``; the built-ins take ``list[Any]`` so that a
    subclass's vLLM-style ``list[Self]`` override is valid under pyright too (list is invariant)."""
    assert "list[Self]" in str(inspect.signature(KVCacheSpec.merge))
    builtins: tuple[type[KVCacheSpec], ...] = (FullAttentionSpec, MambaSpec, UniformTypeKVCacheSpecs)
    for builtin in builtins:
        hint = get_type_hints(builtin.merge)["specs"]
        assert hint == list[Any], (builtin, hint)


@dataclass(frozen=True, kw_only=True, slots=True)
class VllmNamedSpec(FullAttentionSpec):
    """A port that keeps vLLM's parameter names."""

    def max_memory_usage_bytes(self, vllm_config: VllmConfig) -> int:
        return vllm_config.model_config.max_model_len * 0 + self.page_size_bytes

    def is_uniform_with_collection(self, kv_cache_specs: Any) -> bool:
        return True


class VllmNamedManager(FullAttentionManager):
    """A manager keeping vLLM 0.34's name for the skipped-blocks count."""

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        super().remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)


def test_a_port_keeping_vllms_names_registers() -> None:
    registry: Registry[Any, Any] = Registry(name="ports")
    registry.register(VllmNamedSpec, VllmNamedManager, FullAttentionSpec)
    spec = VllmNamedSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16)
    assert registry.get_manager_class(spec) is VllmNamedManager


def _manager_with(method: Callable[..., None]) -> type:
    return type("Renamed", (FullAttentionManager,), {"free": method})


def test_a_renamed_parameter_the_coordinator_passes_by_name_is_still_refused() -> None:
    """Only positional-only protocol parameters may take another name: elsewhere the order-mixing guard holds."""

    def free(self: Any, req: str) -> None:
        pass

    def gap(self: Any, request_id: str, total_tokens: int, num_prompt_tokens: int | None = None) -> None:
        pass

    registry: Registry[Any, Any] = Registry(name="renamed")
    registry.register(FullAttentionSpec, type("Gap", (FullAttentionManager,), {"remove_skipped_blocks": gap}))
    with pytest.raises(ManagerSignatureError, match="parameter 1 is 'req', the protocol's is 'request_id'"):
        Registry[Any, Any](name="free").register(FullAttentionSpec, _manager_with(free))

    def swapped(
        self: Any, total_computed_tokens: int, request_id: str, num_prompt_tokens: int | None = None
    ) -> None:
        pass

    with pytest.raises(
        ManagerSignatureError, match="takes total_computed_tokens: int, the protocol's is str"
    ):
        Registry[Any, Any](name="swapped").register(
            FullAttentionSpec, type("Swapped", (FullAttentionManager,), {"remove_skipped_blocks": swapped})
        )
