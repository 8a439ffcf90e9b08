"""The vLLM adapter module split by concern (issue 35): each piece is importable without vLLM, the adapter
module re-exports the public names, and the moved helpers keep their behaviour."""

from __future__ import annotations

import functools

from kvspec.integrations import vllm_events, vllm_facades, vllm_kv_cache_manager, vllm_request_view


def test_the_adapter_module_reexports_the_public_names() -> None:
    for name in vllm_kv_cache_manager.__all__:
        assert hasattr(vllm_kv_cache_manager, name), name
    assert vllm_kv_cache_manager.VllmRequestView is vllm_request_view.VllmRequestView
    assert vllm_kv_cache_manager.Vllm034BlockPool is vllm_facades.Vllm034BlockPool
    assert vllm_kv_cache_manager.event_to_vllm is vllm_events.event_to_vllm


def test_a_spec_group_holds_lists_and_only_the_lookups_are_cached() -> None:
    """vLLM 0.34's ``coordinator.attention_groups`` entries carry a list of group ids (a cache decorator on
    the class, left by the split, made building one a TypeError)."""
    group = vllm_facades.VllmSpecGroup(spec=None, group_ids=[0, 2], manager_cls=object, use_eagle=False)
    assert group.group_ids == [0, 2] and isinstance(vllm_facades.VllmSpecGroup, type)
    # The import-once lookups of vLLM's modules stay cached functions.
    for fn in (
        vllm_request_view._vllm_extra_keys,
        vllm_events._vllm_event_api,
        vllm_facades._register_with_vllm,
    ):
        assert isinstance(fn, functools._lru_cache_wrapper), fn
