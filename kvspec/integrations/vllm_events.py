"""kvspec's KV cache events as vLLM's (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``), for the
vLLM adapters; vLLM is imported only when an event is converted."""

from __future__ import annotations

import functools
import importlib
from typing import Any

from kvspec.blocks.events import AllBlocksCleared, BlockRemoved, BlockStored


@functools.cache
def _vllm_event_api() -> tuple[Any, Any, Any]:
    """vLLM's event module, its external-hash conversion, and (vLLM 0.34) its conversion of the tagged
    extra keys to the untagged form events publish, or None (0.23 publishes them as hashed)."""
    events = importlib.import_module("vllm.distributed.kv_events")
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    return events, utils.maybe_convert_block_hash, getattr(utils, "to_event_extra_keys", None)


def event_to_vllm(event: object) -> Any:
    """vLLM's KV event for kvspec's (same fields; hashes in vLLM's external form, an int of the low 64 bits
    unless VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is off); anything else (already vLLM's) is returned as is."""
    ev, external, event_keys = _vllm_event_api()
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        # vLLM 0.34's event also carries the EAGLE lookahead tokens and the session (0.23's has neither).
        optional: dict[str, Any] = {}
        if event.lookahead_token_ids is not None:
            optional["lookahead_token_ids"] = event.lookahead_token_ids
        if event.session_id is not None:  # vLLM 0.34's field too
            optional["session_id"] = event.session_id
        return ev.BlockStored(
            **optional,
            block_hashes=[external(h) for h in event.block_hashes],
            parent_block_hash=None if parent is None else external(parent),
            token_ids=list(event.token_ids),
            block_size=event.block_size,
            lora_id=event.lora_id,
            medium=event.medium,
            lora_name=event.lora_name,
            extra_keys=event.extra_keys if event_keys is None else event_keys(event.extra_keys),
            group_idx=event.group_idx,
            kv_cache_spec_kind=event.kv_cache_spec_kind,
            kv_cache_spec_sliding_window=event.kv_cache_spec_sliding_window,
        )
    if isinstance(event, BlockRemoved):
        return ev.BlockRemoved(
            block_hashes=[external(h) for h in event.block_hashes],
            medium=event.medium,
            group_idx=event.group_idx,
        )
    if isinstance(event, AllBlocksCleared):
        return ev.AllBlocksCleared()
    return event
