"""What an offload tier is: the values and the protocol, in vLLM 0.34's ``kv_offload`` shape.

A tier holds KV blocks below the GPU's block pool (host memory, a pool shared by a fleet's instances). It is
keyed by :data:`OffloadKey`: a block hash followed by its KV-cache group index as four big-endian bytes,
vLLM 0.34's ``make_offload_key``, so one key is one group's block of one prefix. A tier is driven by an
engine's connector (:mod:`kvspec.tiers.connector`) through the calls of vLLM's ``OffloadingManager``:

- ``lookup(key, request)``: is the block held and ready (``HIT``), held but still being written
  (``HIT_PENDING``), or not held (``MISS``). Records nothing.
- ``prepare_load(keys, request)`` pins the keys (they cannot be evicted until ``complete_load``) and counts
  the request's use of them; ``complete_load(keys, request)`` unpins.
- ``prepare_store(keys, request)``: which of ``keys`` the tier will take (the ones it lacks and admits),
  evicting others to make room; ``None`` when it cannot make room (every candidate is pinned or offered).
  The taken keys are held but not ready until ``complete_store(keys, request, success)``.
- ``on_request_finished(request)``: the request's accesses are committed to the tier's order (vLLM's LRU
  and ARC reorder here, tail to head).
- ``take_events()``: what was stored and removed since the last call (:class:`TierEvent`), for KV events
  carrying the tier's ``medium``.

Per-request state lives on the :class:`TierRequest` each request carries (vLLM's ``ReqContext``): each block's
end-token position, which the LRU orders by, and a slot per tier for its own bookkeeping.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final, Protocol, TypeVar, runtime_checkable

#: One group's block of one prefix: the block hash, then the group index as 4 big-endian bytes.
OffloadKey = bytes

#: KV event media, as vLLM's ``kv_events`` names them.
MEDIUM_GPU: Final = "GPU"
MEDIUM_CPU: Final = "CPU"
MEDIUM_STORAGE: Final = "STORAGE"

_T = TypeVar("_T")


def offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """The key of group ``group_idx``'s block under ``block_hash`` (vLLM 0.34's ``make_offload_key``)."""
    return block_hash + group_idx.to_bytes(4, "big", signed=False)


def key_block_hash(key: OffloadKey) -> bytes:
    """The block hash of ``key``."""
    return key[:-4]


def key_group(key: OffloadKey) -> int:
    """The group index of ``key``."""
    return int.from_bytes(key[-4:], "big", signed=False)


class LookupResult(Enum):
    """What :meth:`OffloadTier.lookup` says of one key."""

    MISS = "miss"
    HIT = "hit"
    HIT_PENDING = "hit_pending"


class TierRequest:
    """One request's offloading context (vLLM's ``ReqContext``): its id, each offered or loaded key's
    end-token position (tokens: the position just past the block's last token), and one state slot per
    state type, which tiers use for their per-request bookkeeping."""

    __slots__ = ("_positions", "_state", "request_id")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._positions: dict[OffloadKey, int] = {}
        self._state: dict[type, object] = {}

    def set_position(self, key: OffloadKey, end_token: int) -> None:
        self._positions[key] = end_token

    def position(self, key: OffloadKey) -> int | None:
        return self._positions.get(key)

    def get_state(self, cls: type[_T]) -> _T | None:
        found = self._state.get(cls)
        return found if isinstance(found, cls) else None

    def set_state(self, value: object) -> None:
        self._state[type(value)] = value


@dataclass(frozen=True, kw_only=True, slots=True)
class StorePlan:
    """What :meth:`OffloadTier.prepare_store` decided: ``keys_to_store`` (taken, not ready until
    ``complete_store``) and ``evicted_keys`` (removed to make room), in the tier's order."""

    keys_to_store: tuple[OffloadKey, ...]
    evicted_keys: tuple[OffloadKey, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class TierEvent:
    """Keys a tier stored (``removed`` False: ready to load) or removed, on ``medium`` ("CPU",
    "STORAGE"); ``metadata_only``: a failed store's keys released without ever being announced."""

    keys: tuple[OffloadKey, ...]
    medium: str
    removed: bool
    metadata_only: bool = False


@runtime_checkable
class OffloadTier(Protocol):
    """An offload tier (see the module docstring for the call order). ``medium``: the KV-event medium of
    its blocks; ``capacity_blocks``: how many keys it can hold; ``num_blocks``: how many it holds now.

    The keys and the request are positional-only: a tier ported from vLLM's ``OffloadingManager`` keeps
    vLLM's parameter names (``req_context``), and every type checker accepts it as this protocol."""

    @property
    def medium(self) -> str: ...

    @property
    def capacity_blocks(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    def lookup(self, key: OffloadKey, request: TierRequest, /) -> LookupResult: ...

    def prepare_load(self, keys: Collection[OffloadKey], request: TierRequest, /) -> None: ...

    def complete_load(self, keys: Collection[OffloadKey], request: TierRequest, /) -> None: ...

    def prepare_store(self, keys: Sequence[OffloadKey], request: TierRequest, /) -> StorePlan | None: ...

    def complete_store(
        self, keys: Collection[OffloadKey], request: TierRequest, /, success: bool = True
    ) -> None: ...

    def on_request_finished(self, request: TierRequest, /) -> None: ...

    def take_events(self) -> list[TierEvent]: ...

    def reset(self) -> None: ...


__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "MEDIUM_STORAGE",
    "LookupResult",
    "OffloadKey",
    "OffloadTier",
    "StorePlan",
    "TierEvent",
    "TierRequest",
    "key_block_hash",
    "key_group",
    "offload_key",
]
