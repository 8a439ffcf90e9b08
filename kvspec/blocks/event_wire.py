"""vLLM's KV events as they travel: the msgpack payloads its ZMQ publisher sends, decoded without vLLM.

vLLM's ``ZmqEventPublisher`` sends each step's events as a multipart message ``(topic, seq, payload)``:
``seq`` an 8-byte big-endian counter, ``payload`` a msgpack ``KVEventBatch`` ``[ts, events, dp_rank]``.
How an event is encoded depends on the release:

- vLLM 0.23: a positional array whose first item is the event's type (``["BlockStored", hashes, parent,
  token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, kind, sliding_window]``,
  trailing defaults left out);
- vLLM 0.32 and 0.34: a map tagged ``"type"`` (fields at their defaults left out).

:func:`decode_event_batch` reads both into frozen values (:class:`WireEventBatch`), so a consumer (``kvspec
events``, a router's index) does not depend on vLLM or on the release. Block hashes stay as sent: ``bytes``
(vLLM's sha256 family) or ``int``. :func:`encode_event_batch` writes kvspec's events in either format.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from kvspec.blocks.events import BlockRemoved, BlockStored, KVCacheEvent
from kvspec.errors import EventWireError

#: A block hash as vLLM's events carry it.
WireBlockHash = bytes | int


@dataclass(frozen=True, kw_only=True)
class WireBlockStored:
    """Blocks that became cached (one event per run of consecutive blocks of one request and group)."""

    block_hashes: tuple[WireBlockHash, ...]
    parent_block_hash: WireBlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class WireBlockRemoved:
    """Blocks evicted from the cache."""

    block_hashes: tuple[WireBlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass(frozen=True, kw_only=True)
class WireAllBlocksCleared:
    """The whole prefix cache was dropped (``reset_prefix_cache``)."""


WireEvent = WireBlockStored | WireBlockRemoved | WireAllBlocksCleared


@dataclass(frozen=True, kw_only=True)
class WireEventBatch:
    """One publish: ``ts`` the engine's time (seconds since the epoch), ``events`` in order, the data-parallel
    rank (None: not set), and ``seq`` the publisher's counter (None when not read from a ZMQ message)."""

    ts: float
    events: tuple[WireEvent, ...]
    data_parallel_rank: int | None = None
    seq: int | None = None


#: Field order of vLLM 0.23's positional events (after the type tag).
_POSITIONAL: Final[Mapping[str, tuple[str, ...]]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}
_CLASSES: Final[Mapping[str, type[WireEvent]]] = {
    "BlockStored": WireBlockStored,
    "BlockRemoved": WireBlockRemoved,
    "AllBlocksCleared": WireAllBlocksCleared,
}
_TUPLES: Final = frozenset({"block_hashes", "token_ids", "extra_keys"})


# What encode_event_batch writes for 0.32 / 0.34: maps tagged "type", in vLLM's field order, fields at None
# left out but BlockStored's first six (which vLLM's classes declare without a default). Structs, not dicts:
# msgspec writes them in C, and a fleet encodes every step's events. gc=False: they hold lists of hashes and
# ids, never themselves, so the cycle collector need not track millions of them.
class _StoredMap(msgspec.Struct, tag="BlockStored", tag_field="type", omit_defaults=True, gc=False):
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _RemovedMap(msgspec.Struct, tag="BlockRemoved", tag_field="type", omit_defaults=True, gc=False):
    block_hashes: list[Any]
    medium: str | None = None
    group_idx: int | None = None


class _ClearedMap(msgspec.Struct, tag="AllBlocksCleared", tag_field="type"):
    pass


_CLEARED_MAP: Final = _ClearedMap()
_encode: Final = msgspec.msgpack.Encoder().encode


def _frozen(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_frozen(item) for item in value)
    return value


def decode_event(raw: object) -> WireEvent:
    """One event as decoded from msgpack (a 0.23 array or a 0.32/0.34 map) as a frozen value."""
    if isinstance(raw, Mapping):
        kind = raw.get("type")
        fields = {str(k): v for k, v in raw.items() if k != "type"}
    elif isinstance(raw, Sequence) and not isinstance(raw, (str, bytes)) and raw:
        kind = raw[0]
        names = _POSITIONAL.get(str(kind))
        if names is None:
            raise EventWireError(f"unknown KV event type {kind!r} (known: {', '.join(_CLASSES)})")
        if len(raw) - 1 > len(names):
            raise EventWireError(
                f"{kind} event with {len(raw) - 1} fields; vLLM 0.23's has at most {len(names)}"
            )
        fields = dict(zip(names, raw[1:]))
    else:
        raise EventWireError(f"a KV event must be a map or an array, got {type(raw).__name__}")
    cls = _CLASSES.get(str(kind))
    if cls is None:
        raise EventWireError(f"unknown KV event type {kind!r} (known: {', '.join(_CLASSES)})")
    known = cls.__dataclass_fields__
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise EventWireError(f"{kind} event with fields kvspec does not know: {', '.join(unknown)}")
    values: dict[str, Any] = {
        name: (_frozen(v) if name in _TUPLES and v is not None else v) for name, v in fields.items()
    }
    try:
        return cls(**values)
    except TypeError as exc:
        raise EventWireError(f"{kind} event: {exc}") from None


def decode_event_batch(payload: bytes, *, seq: int | None = None) -> WireEventBatch:
    """A publisher's msgpack payload as a :class:`WireEventBatch` (``EventWireError`` if it is not one)."""
    try:
        import msgspec
    except ImportError as exc:  # pragma: no cover - kvspec[vllm] brings it
        raise EventWireError("decoding vLLM's KV events needs msgspec: pip install 'kvspec[vllm]'") from exc
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise EventWireError(f"not msgpack: {exc}") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise EventWireError(f"a KV event batch is [ts, events, dp_rank], got {type(raw).__name__}")
    ts = raw[0]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise EventWireError(f"a KV event batch's ts must be a number, got {ts!r}")
    rank = raw[2] if len(raw) > 2 else None
    return WireEventBatch(
        ts=float(ts), events=tuple(decode_event(e) for e in raw[1]), data_parallel_rank=rank, seq=seq
    )


def _event_fields(event: KVCacheEvent) -> tuple[str, dict[str, Any]]:
    if isinstance(event, BlockStored):
        fields: dict[str, Any] = {
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": event.medium,
            "lora_name": event.lora_name,
            "extra_keys": event.extra_keys,
            "group_idx": event.group_idx,
            "kv_cache_spec_kind": event.kv_cache_spec_kind,
            "kv_cache_spec_sliding_window": event.kv_cache_spec_sliding_window,
        }
        return "BlockStored", fields
    if isinstance(event, BlockRemoved):
        return "BlockRemoved", {
            "block_hashes": list(event.block_hashes),
            "medium": event.medium,
            "group_idx": event.group_idx,
        }
    return "AllBlocksCleared", {}


#: The wire formats kvspec writes and reads: ``"0.34"`` (tagged maps, vLLM 0.32 on) and ``"0.23"`` (positional
#: arrays). A release names its format in ``ReleaseProfile.events.wire``.
WIRE_FORMATS: Final = ("0.34", "0.23")


def encode_event_batch(
    events: Sequence[KVCacheEvent],
    *,
    ts: float,
    wire: str = "0.34",
    data_parallel_rank: int | None = None,
) -> bytes:
    """kvspec's KV events as one publisher payload in vLLM's wire format: ``"0.34"`` (0.32's too): events as
    msgpack maps tagged ``"type"``, fields at their default left out (msgspec's ``omit_defaults``);
    ``"0.23"``: positional arrays ``[tag, field, ...]`` in vLLM 0.23's field order. The batch is
    ``[ts, events, data_parallel_rank]`` either way. :func:`decode_event_batch` reads both back."""
    if wire not in WIRE_FORMATS:
        raise EventWireError(
            f"unknown KV event wire format {wire!r}; kvspec writes {' or '.join(map(repr, WIRE_FORMATS))} "
            "(a release's format is its profile's events.wire)"
        )
    encoded: list[Any] = []
    if wire == "0.23":
        for event in events:
            kind, fields = _event_fields(event)
            encoded.append([kind, *(fields.get(name) for name in _POSITIONAL[kind])])
        return _encode([ts, encoded, data_parallel_rank])
    append = encoded.append
    for event in events:
        if isinstance(event, BlockRemoved):
            append(_RemovedMap(event.block_hashes, event.medium, event.group_idx))
        elif isinstance(event, BlockStored):
            append(
                _StoredMap(
                    event.block_hashes,
                    event.parent_block_hash,
                    event.token_ids,
                    event.block_size,
                    event.lora_id,
                    event.medium,
                    event.lora_name,
                    event.extra_keys,
                    event.group_idx,
                    event.kv_cache_spec_kind,
                    event.kv_cache_spec_sliding_window,
                )
            )
        else:
            append(_CLEARED_MAP)
    return _encode([ts, encoded, data_parallel_rank])


def receive_batches(
    endpoint: str,
    *,
    topic: str = "",
    idle_timeout_s: float = 5.0,
    max_batches: int | None = None,
    bind: bool = False,
) -> Iterator[WireEventBatch]:
    """Subscribe to a vLLM KV event publisher and yield its batches as they come, until ``idle_timeout_s``
    seconds pass with none or ``max_batches`` came. ``bind`` False: connect to ``endpoint``, where the
    publisher is bound (vLLM binds ``tcp://*:PORT`` and ``ipc://`` endpoints); True: bind ``endpoint`` and
    let the publisher connect (vLLM connects to any other ``tcp://HOST:PORT``). Needs pyzmq and msgspec
    (``pip install 'kvspec[vllm]'``). A subscriber sees only what is published after it joined (ZMQ's
    publish-subscribe drops the rest). A socket ZMQ refuses (a malformed address, a port in use) is an
    EventWireError naming the endpoint."""
    try:
        import zmq
    except ImportError as exc:  # pragma: no cover - kvspec[vllm] brings it
        raise EventWireError(
            "subscribing to vLLM's KV events needs pyzmq: pip install 'kvspec[vllm]'"
        ) from exc
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    socket = context.socket(zmq.SUB)
    try:
        try:
            if bind:
                socket.bind(endpoint)
            else:
                socket.connect(endpoint)
        except zmq.ZMQError as exc:
            raise EventWireError(
                f"cannot {'bind' if bind else 'connect to'} {endpoint!r}: {exc.strerror or exc}"
            ) from None
        socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        received = 0
        while max_batches is None or received < max_batches:
            if not socket.poll(int(idle_timeout_s * 1000)):
                return
            parts = socket.recv_multipart()
            if len(parts) != 3:
                raise EventWireError(
                    f"a KV event message has 3 parts (topic, seq, payload), got {len(parts)}"
                )
            _, seq, payload = parts
            received += 1
            yield decode_event_batch(payload, seq=int.from_bytes(seq, "big"))
    finally:
        socket.close(linger=0)


def event_as_json(event: WireEvent) -> dict[str, Any]:
    """``event`` as a JSON-ready dict: ``type`` first, fields at None left out, bytes as hex strings."""
    out: dict[str, Any] = {"type": type(event).__name__.removeprefix("Wire")}
    for name in type(event).__dataclass_fields__:
        value = getattr(event, name)
        if value is not None:
            out[name] = _jsonable(value)
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


__all__ = [
    "EventWireError",
    "WireAllBlocksCleared",
    "WireBlockHash",
    "WireBlockRemoved",
    "WireBlockStored",
    "WireEvent",
    "WireEventBatch",
    "decode_event",
    "decode_event_batch",
    "event_as_json",
    "encode_event_batch",
    "receive_batches",
]
