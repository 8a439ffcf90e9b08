"""vLLM's names for the state of kvspec's single-type managers, and a manager seen as vLLM's coordinator
lists it (vLLM's code and tests read ``req_to_blocks``, ``num_cached_block``, ...)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

__all__ = ["VLLM_STATE_NAMES", "VllmManagerView"]


#: vLLM's names for a manager's state that kvspec's base manager keeps under another name (vLLM's tests read
#: and write them). ``req_to_blocks``, ``num_cached_block`` and ``_null_block`` are the base manager's own.
VLLM_STATE_NAMES: dict[str, str] = {
    "new_block_ids": "_new_block_ids",
    "records_new_block_ids": "tracks_new_block_ids",  # vLLM 0.34's name
    "_pending_cow_copies": "_pending_copies",  # vLLM 0.34's sub-block hits' queued block copies
}

#: Settings vLLM keeps as plain manager attributes its tests set, kvspec on the manager's context.
_SETTABLE_CONTEXT_NAMES = frozenset({"use_eagle"})


_CONTEXT_NAMES = frozenset({"dcp_world_size", "pcp_world_size", "max_model_len"})


class VllmManagerView:
    """One of kvspec's managers as vLLM's coordinator lists it (``single_type_managers``): every attribute is
    the manager's, vLLM's state names included, and ``isinstance`` sees the manager's class; its
    ``kv_cache_spec`` is vLLM's spec of the group when given (vLLM code type-checks it)."""

    __slots__ = ("_manager", "_vllm_spec")
    _manager: Any
    _vllm_spec: Any

    def __init__(self, manager: object, vllm_spec: object = None) -> None:
        object.__setattr__(self, "_manager", manager)
        object.__setattr__(self, "_vllm_spec", vllm_spec)

    if not TYPE_CHECKING:  # checkers keep the view's own class; only isinstance() is meant to be fooled

        @property
        def __class__(self) -> type:  # isinstance(view, SlidingWindowManager) answers for the manager
            return type(self._manager)

    def __getattr__(self, name: str) -> Any:
        if name in _CONTEXT_NAMES:  # settings vLLM keeps on the manager, kvspec on its context
            return getattr(self._manager.context, name)
        if name == "kv_cache_spec" and self._vllm_spec is not None:
            return self._vllm_spec
        return getattr(self._manager, VLLM_STATE_NAMES.get(name, name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SETTABLE_CONTEXT_NAMES:
            manager = self._manager
            manager.context = dataclasses.replace(manager.context, **{name: value})
            return
        setattr(self._manager, VLLM_STATE_NAMES.get(name, name), value)
