"""What the coordinator, the managers and the block pool read from a request: a Protocol.

kvspec's own :class:`kvspec.blocks.request.Request` satisfies it; so does an engine's adapter that reads its own
request objects in place (the vLLM adapter's ``VllmRequestView``). Typing the hot path against this
Protocol rather than the class is what lets the compiled build compile ``Request`` as a native class
while adapters stay plain Python classes (a compiled class's attributes cannot be replaced by an
interpreted subclass's properties).

Units: every count is in tokens. Invariants the coordinator relies on: ``num_tokens ==
len(all_token_ids)``; ``block_hashes[i]`` covers tokens [i*B, (i+1)*B) for the hasher's block size B
(only full blocks are hashed); ``block_hasher`` is None only for requests that are never hashed (no
prefix caching).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from kvspec.blocks.hashing import BlockHash, BlockHasher


# The hasher's members (kvspec.blocks.hashing.HashedRequest) are declared again rather than inherited: that
# protocol lives in a module the compiled build compiles, and mypyc gives its classes __getstate__,
# __setstate__ and __mypyc_attrs__, which isinstance() against a protocol deriving from it would require.
@runtime_checkable
class RequestView(Protocol):
    """A request as the KV-cache core reads it (read-only members; plain attributes satisfy them).
    Everything a ``HashedRequest`` has, so a view can be hashed by kvspec's ``BlockHasher`` too."""

    @property
    def request_id(self) -> str: ...

    @property
    def all_token_ids(self) -> Sequence[int]: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_computed_tokens(self) -> int: ...

    @property
    def num_preemptions(self) -> int: ...

    @property
    def skip_reading_prefix_cache(self) -> bool: ...

    @property
    def block_hasher(self) -> BlockHasher | None: ...

    @property
    def block_hashes(self) -> list[BlockHash]: ...

    @property
    def block_extra_keys(self) -> list[tuple[Any, ...] | None]: ...

    @property
    def needs_extra_keys(self) -> bool: ...

    @property
    def lora_name(self) -> str | None: ...

    @property
    def lora_id(self) -> int | None: ...

    @property
    def cache_salt(self) -> str | None: ...

    def extra_keys_for_block(self, start: int, end: int) -> tuple[Any, ...] | None: ...

    def extra_keys_for_range(self, start: int, end: int) -> tuple[Any, ...] | None:
        """The extra keys of tokens [start, end) as a block covering that range carries them in a KV event
        (vLLM 0.23's ``BlockStored.extra_keys``); no state advances, so any range may be asked in any order."""
        ...
