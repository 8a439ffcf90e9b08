"""The request value the scheduler-facing API works on: token ids that grow, and their block hashes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, cast

import torch
from mypy_extensions import mypyc_attr

from kvspec.blocks.hashing import BlockHash, BlockHasher, MultiModalFeature, generate_block_hash_extra_keys
from kvspec.errors import KVSpecError, KVSpecTypeError


@mypyc_attr(allow_interpreted_subclasses=True)  # engines may extend it in plain Python (compiled build)
class Request:
    """One sequence being served.

    Invariants: ``block_hashes[i]`` is the hash of tokens [i*B, (i+1)*B) for the hasher's block size B;
    only full blocks are hashed; hashes are extended whenever tokens are appended. ``block_extra_keys[i]``
    (the extra keys that went into block i, reported in KV events) is kept only for requests that have
    extra keys (LoRA, multimodal items, cache salt, prompt embeddings).
    """

    __slots__ = (
        "_embeds_digests",
        "_hasher",
        "_next_mm_idx",
        "all_token_ids",
        "block_extra_keys",
        "block_hashes",
        "cache_salt",
        "lora_id",
        "lora_name",
        "mm_features",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "priority",
        "prompt_embeds",
        "request_id",
        "retention_seconds",
        "session_id",
        "shared_prefix_boundary",
        "skip_reading_prefix_cache",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        block_hasher: BlockHasher | None = None,
        lora_name: str | None = None,
        lora_id: int | None = None,
        mm_features: Sequence[MultiModalFeature] = (),
        cache_salt: str | None = None,
        prompt_embeds: torch.Tensor | None = None,
        skip_reading_prefix_cache: bool = False,
        session_id: str | None = None,
        priority: int = 0,
        retention_seconds: float | None = None,
    ) -> None:
        self.request_id = request_id
        # What an eviction policy may weigh (kvspec.blocks.eviction.BlockUse): the scheduling priority (lower
        # is more important, as in vLLM) and how long (seconds) the prompt's blocks should stay cached after
        # this request uses them (None: no ask). Never part of a block's hash.
        self.priority = priority
        self.retention_seconds = retention_seconds
        # The agent or conversation session the request belongs to: carried into BlockStored events for
        # routers, never part of a block's hash (two sessions share a prefix).
        self.session_id = session_id
        # The junction (tokens; 0: none) where this request's prefix stops being shared with a cached
        # sibling's, as the engine learned it at admission (``KVCacheCoordinator.lookup_prefix``): windowed
        # managers under sparse retention keep their blocks there so a third request hits it.
        self.shared_prefix_boundary = 0
        self.all_token_ids: list[int] = _token_ids(request_id, prompt_token_ids)
        self.num_prompt_tokens = len(self.all_token_ids)
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.lora_name = lora_name
        self.lora_id = lora_id
        self.mm_features = tuple(sorted(mm_features, key=lambda f: f.offset)) if mm_features else ()
        self.cache_salt = cache_salt
        self.prompt_embeds = prompt_embeds
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.block_hashes: list[BlockHash] = []
        self.block_extra_keys: list[tuple[Any, ...] | None] = []
        self._hasher = block_hasher
        self._next_mm_idx = 0
        self._embeds_digests: dict[tuple[int, int], bytes] = {}
        if block_hasher is not None:
            block_hasher.hash_new_blocks(self)

    @property
    def block_hasher(self) -> BlockHasher | None:
        """The hasher that extends ``block_hashes`` as tokens are appended (None: never hashed)."""
        return self._hasher

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def needs_extra_keys(self) -> bool:
        return bool(
            self.mm_features
            or self.lora_name is not None
            or self.cache_salt is not None
            or self.prompt_embeds is not None
        )

    def adopt_block_hashes(self, hasher: BlockHasher, block_hashes: Sequence[BlockHash]) -> None:
        """Take ``block_hashes`` as the hashes ``hasher`` gives this request's full blocks (computed in a
        faster form than token by token, e.g. :meth:`BlockHasher.hash_runs` for a trace's hash ids); from
        here on ``hasher`` extends them as tokens are appended. Only for a request built without a hasher,
        with no extra keys, and with one hash per full block."""
        full = len(self.all_token_ids) // hasher.block_size
        if self._hasher is not None or self.block_hashes or self.needs_extra_keys:
            raise KVSpecError(
                f"Request {self.request_id!r}: block hashes can only be adopted by a request built without a "
                "hasher and without extra keys (LoRA, multimodal items, cache salt, prompt embeddings)."
            )
        if len(block_hashes) != full:
            raise KVSpecError(
                f"Request {self.request_id!r}: {len(block_hashes)} block hashes for {full} full blocks of "
                f"{hasher.block_size} tokens."
            )
        self._hasher = hasher
        self.block_hashes = list(block_hashes)

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        """Append generated tokens and hash any block they complete."""
        tokens = self.all_token_ids
        if isinstance(token_ids, int):
            tokens.append(token_ids)
        else:
            tokens.extend(token_ids)
        hasher = self._hasher
        if hasher is not None and len(tokens) >= (len(self.block_hashes) + 1) * hasher.block_size:
            hasher.hash_new_blocks(self)

    def _prompt_embeds_digest(self, start: int, end: int) -> bytes:
        key = (start, end)
        digest = self._embeds_digests.get(key)
        if digest is None:
            assert self.prompt_embeds is not None
            chunk = self.prompt_embeds[start:end].detach().contiguous().cpu()
            raw = chunk.view(torch.uint8).numpy().tobytes() if chunk.numel() else b""
            digest = hashlib.sha256(raw).digest()
            self._embeds_digests[key] = digest
        return digest

    def _extra_keys(self, start: int, end: int, start_mm_idx: int) -> tuple[tuple[Any, ...] | None, int]:
        return generate_block_hash_extra_keys(
            lora_name=self.lora_name,
            mm_features=self.mm_features,
            cache_salt=self.cache_salt,
            prompt_embeds_digest=(self._prompt_embeds_digest if self.prompt_embeds is not None else None),
            start=start,
            end=end,
            start_mm_idx=start_mm_idx,
        )

    def extra_keys_for_block(self, start: int, end: int) -> tuple[Any, ...] | None:
        """Extra hash keys of tokens [start, end); advances the multimodal cursor (blocks go in order)."""
        keys, self._next_mm_idx = self._extra_keys(start, end, self._next_mm_idx)
        return keys

    def extra_keys_for_range(self, start: int, end: int) -> tuple[Any, ...] | None:
        """Extra hash keys of tokens [start, end), computed afresh (KV events; the hashing cursor stays)."""
        return self._extra_keys(start, end, 0)[0]

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, hashed_blocks={len(self.block_hashes)})"
        )


def _token_ids(request_id: str, prompt_token_ids: object) -> list[int]:
    """The prompt as a new list of token ids, checked at the door: a str, bytes or non-sequence prompt, or ends
    that are not ints (a str, float or tensor element), are a KVSpecTypeError here rather than a failure deep
    in hashing. Only the ends are checked (O(1) per request); KVSPEC_TYPECHECK=full checks every id. Typed
    ``object`` so the compiled build's own argument checks do not answer first with a bare TypeError."""
    if isinstance(prompt_token_ids, (str, bytes)) or not isinstance(prompt_token_ids, Sequence):
        raise KVSpecTypeError(
            f"Request {request_id!r}: prompt_token_ids must be a list of token ids (ints), got "
            f"{type(prompt_token_ids).__name__}; tokenize the prompt first."
        )
    ids: list[object] = list(prompt_token_ids)
    if ids:
        for end in (ids[0], ids[-1]):
            if type(end) is not int:
                raise KVSpecTypeError(
                    f"Request {request_id!r}: token ids must be ints, got {type(end).__name__} {end!r:.40}."
                )
    return cast("list[int]", ids)
