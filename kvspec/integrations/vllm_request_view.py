"""A vLLM ``Request`` read in place as kvspec's ``RequestView`` (no copy: its ``block_hashes`` and
``all_token_ids`` are vLLM's own lists), for the vLLM adapters."""

from __future__ import annotations

import functools
import importlib
from typing import Any

from kvspec.blocks.hashing import BlockHash, BlockHasher
from kvspec.blocks.request import Request
from kvspec.blocks.request_view import RequestView
from kvspec.integrations.vllm_retention import RETENTION_XARG, parse_retention_seconds


class VllmRequestView:
    """What kvspec's coordinator reads from a request (``kvspec.RequestView``), read from a vLLM
    ``Request`` in place (no copies): every member is a property over the vLLM object. The hasher is a
    marker with vLLM's hash block size: vLLM's engine hashes the request, kvspec only checks the size.

    ``default_retention_seconds``: the retention of a request whose sampling parameters name none (seconds;
    None: no retention). A request names its own in ``extra_args["kv_retention_seconds"]`` (the OpenAI API's
    ``vllm_xargs``).
    """

    __slots__ = ("_default_retention", "_hasher_marker", "vllm_request")

    def __init__(
        self, vllm_request: Any, hasher: BlockHasher, default_retention_seconds: float | None = None
    ) -> None:
        # The token lists and hashes stay vLLM's own.
        self.vllm_request = vllm_request
        self._hasher_marker = hasher
        self._default_retention = default_retention_seconds

    @property
    def request_id(self) -> str:
        return str(self.vllm_request.request_id)

    @property
    def all_token_ids(self) -> list[int]:
        ids: list[int] = self.vllm_request.all_token_ids  # vLLM's own list, read in place
        return ids

    @property
    def block_hashes(self) -> list[BlockHash]:
        hashes: list[BlockHash] = self.vllm_request.block_hashes
        return hashes

    @property
    def num_computed_tokens(self) -> int:
        return int(self.vllm_request.num_computed_tokens)

    @property
    def num_preemptions(self) -> int:
        return int(self.vllm_request.num_preemptions)

    @property
    def skip_reading_prefix_cache(self) -> bool:
        request = self.vllm_request
        skip = getattr(request, "skip_reading_prefix_cache", None)
        if skip is None:  # vLLM 0.34: a hit limit of 0 turns the lookup off
            return getattr(request, "prefix_cache_hit_limit", None) == 0
        return bool(skip)

    @property
    def cache_salt(self) -> str | None:
        salt: str | None = self.vllm_request.cache_salt
        return salt

    @property
    def priority(self) -> int:
        """vLLM's scheduling priority (lower first), which an eviction policy may weigh (``BlockUse``)."""
        return int(getattr(self.vllm_request, "priority", 0))

    @property
    def retention_seconds(self) -> float | None:
        """How long this request's prefix should stay cached (seconds; ``BlockUse``): its own
        ``extra_args["kv_retention_seconds"]``, else the adapter's default. The API server refuses a bad
        value (``kvspec.integrations.vllm_plugin``); one that reaches the engine anyway counts as the default
        rather than failing a step."""
        params = getattr(self.vllm_request, "sampling_params", None)
        extra = getattr(params, "extra_args", None)
        if extra and RETENTION_XARG in extra:
            try:
                return parse_retention_seconds(extra[RETENTION_XARG])
            except ValueError:
                return self._default_retention
        return self._default_retention

    @property
    def shared_prefix_boundary(self) -> int:
        """vLLM 0.34's junction the scheduler pinned (tokens; 0: none; 0.23's requests have none)."""
        return int(getattr(self.vllm_request, "shared_prefix_boundary", 0) or 0)

    @property
    def session_id(self) -> str | None:
        """vLLM 0.34's request session (0.23's requests have none)."""
        return getattr(self.vllm_request, "session_id", None)

    @property
    def lora_name(self) -> str | None:
        lora = self.vllm_request.lora_request
        return None if lora is None else str(lora.lora_name)

    @property
    def lora_id(self) -> int | None:
        lora = self.vllm_request.lora_request
        return None if lora is None else int(lora.adapter_id)

    @property
    def num_prompt_tokens(self) -> int:
        return int(self.vllm_request.num_prompt_tokens)

    @property
    def num_tokens(self) -> int:
        return int(self.vllm_request.num_tokens)

    @property
    def block_hasher(self) -> BlockHasher | None:
        return self._hasher_marker

    @property
    def needs_extra_keys(self) -> bool:
        r = self.vllm_request
        return bool(
            r.lora_request is not None
            or r.cache_salt is not None
            or r.mm_features
            or getattr(r, "prompt_embeds", None) is not None
        )

    @property
    def block_extra_keys(self) -> list[tuple[Any, ...] | None]:
        return []

    def extra_keys_for_block(self, start: int, end: int) -> tuple[Any, ...] | None:
        return None  # vLLM's engine hashes its requests; kvspec never hashes a view

    def extra_keys_for_range(self, start: int, end: int) -> tuple[Any, ...] | None:
        """vLLM's own extra keys of tokens [start, end) (LoRA name, multimodal hashes, salt, embeddings), as
        vLLM's block pool puts them in ``BlockStored`` events."""
        keys: tuple[Any, ...] | None = _vllm_extra_keys()(self.vllm_request, start, end, 0)[0]
        return keys

    def __repr__(self) -> str:
        return f"VllmRequestView({self.request_id!r})"


@functools.cache
def _vllm_extra_keys() -> Any:
    return importlib.import_module("vllm.v1.core.kv_cache_utils").generate_block_hash_extra_keys


def as_kvspec_request(request: Any, hash_block_size: int) -> RequestView:
    """``request`` if it is kvspec's, else a view of vLLM's (for callers that hand the pool a vLLM request)."""
    if isinstance(request, (Request, VllmRequestView)):
        return request
    return VllmRequestView(request, BlockHasher(hash_block_size))
