"""Request traces: the Mooncake format and kvspec's own JSONL, read into :class:`TraceRequest` values.

Two formats, one JSON object a line (blank lines are skipped):

- **Mooncake** (Kimi's production traces, FAST'25; ``shared/traces/``): ``timestamp`` (ms from the start),
  ``input_length``, ``output_length`` and ``hash_ids``, one id per 512-token prefix block (the last may
  cover a partial block). Equal leading ids mean a shared prefix.
- **kvspec**: ``output_length`` and either ``token_ids`` (the prompt) or ``hash_ids`` with
  ``hash_block_size`` (tokens per id) and ``input_length``; optional ``arrival_ms`` (default: the previous
  request's), ``priority`` (int, lower first as in vLLM) and ``retention_seconds`` (how long the prompt's
  prefix may stay pinned). A Mooncake line is also accepted there.

Hash ids become tokens deterministically (:func:`prompt_tokens`): id ``h`` covers ``block`` tokens of id
``h`` (the last id only as many as ``input_length`` leaves), so equal hash prefixes give equal token prefixes
and distinct ids never share a token. Every block of ``h`` holds the one int object ``h``: a 12,000-request
trace expands to 144 million token slots but only as many ints as it has blocks. Hash ids stay below
:data:`HASH_ID_LIMIT` (2**31), under every token id a replay generates (from 3 * 10**9). A bad line raises
:class:`TraceFormatError` naming the file, the line and the field.

Reading is bounded: the file is streamed a line at a time (gzip read transparently, by its ``.gz`` suffix or
its magic bytes); a line over :data:`MAX_LINE_BYTES` is an error naming it, before it is held whole; a path
that is not a regular file (a FIFO, ``/dev/zero``) is refused before it is read. ``read_trace(...,
max_prompt_tokens=N)`` keeps only the length of a prompt over N tokens (``over_length``): an engine refuses
it, so its ids are never held or expanded.
"""

from __future__ import annotations

import gzip
import json
import math
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec.errors import TraceFormatError

#: Tokens per hash id in Mooncake traces.
MOONCAKE_BLOCK_TOKENS = 512
#: The longest trace line read (bytes): 4 MiB holds half a million hash ids, a 256-million-token prompt.
MAX_LINE_BYTES = 4 << 20
#: Token ids are 32-bit (they are hashed as uint32).
TOKEN_ID_LIMIT = 1 << 32
#: Hash ids are below this: id h stands for tokens of id h, and generated tokens start above it (3 * 10**9).
HASH_ID_LIMIT = 1 << 31


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceRequest:
    """One request of a trace. Lengths in tokens, times in milliseconds from the trace's start.

    ``over_length``: the prompt was longer than the reader's ``max_prompt_tokens``; only its lengths are kept
    (``token_ids`` and ``hash_ids`` empty), since an engine refuses it without reading it.

    Invariants: exactly one of ``token_ids`` and ``hash_ids`` is set; with ``token_ids``,
    ``input_length == len(token_ids)``; with ``hash_ids``, ``hash_block_size`` is set and
    ``(len(hash_ids) - 1) * hash_block_size < input_length <= len(hash_ids) * hash_block_size``.
    """

    line: int
    arrival_ms: float
    input_length: int
    output_length: int
    token_ids: tuple[int, ...] | None = None
    hash_ids: tuple[int, ...] | None = None
    hash_block_size: int | None = None
    priority: int = 0
    retention_seconds: float | None = None
    over_length: bool = False

    def prompt_tokens(self) -> list[int]:
        """The prompt's token ids (``hash_ids`` expanded, see the module docstring)."""
        return prompt_tokens(self)


def prompt_tokens(request: TraceRequest) -> list[int]:
    """The prompt of ``request`` as token ids: hash id ``h`` of a ``B``-token block gives ``B`` tokens of id
    ``h`` (the last id only as many as ``input_length`` leaves)."""
    if request.over_length:
        raise TraceFormatError(
            f"trace line {request.line}: the prompt of {request.input_length:,} tokens was over the reader's "
            "max_prompt_tokens and is not kept; an engine refuses it"
        )
    if request.token_ids is not None:
        return list(request.token_ids)
    assert request.hash_ids is not None and request.hash_block_size is not None
    block = request.hash_block_size
    tokens: list[int] = []
    remaining = request.input_length
    for h in request.hash_ids:
        n = block if remaining >= block else remaining
        tokens += [h] * n
        remaining -= n
    return tokens


def _int(obj: dict[str, Any], key: str, where: str, *, minimum: int = 0, required: bool = True) -> int | None:
    value: object = obj.get(key)
    if value is None:
        if required:
            raise TraceFormatError(f"{where}: missing {key!r} (an integer >= {minimum})")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceFormatError(f"{where}: {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _ids(obj: dict[str, Any], key: str, where: str, *, limit: int) -> tuple[int, ...]:
    value = obj.get(key)
    if not isinstance(value, list) or not value:
        raise TraceFormatError(f"{where}: {key!r} must be a non-empty list of integers >= 0")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise TraceFormatError(f"{where}: {key!r} holds {item!r}; every entry must be an integer >= 0")
        if item >= limit:
            raise TraceFormatError(
                f"{where}: {key!r} holds {item:,}; entries must be below {limit:,} ("
                + (
                    "a hash id is its block's token id, below generated tokens)"
                    if key == "hash_ids"
                    else "token ids are 32-bit)"
                )
            )
    return tuple(value)


def parse_line(
    obj: object,
    *,
    line: int,
    where: str,
    previous_arrival_ms: float = 0.0,
    max_prompt_tokens: int | None = None,
) -> TraceRequest:
    """One trace line (already JSON-decoded) as a :class:`TraceRequest`; ``where`` names it in errors. A
    prompt over ``max_prompt_tokens`` keeps its lengths only (``over_length``)."""
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    output_length = _int(obj, "output_length", where)
    assert output_length is not None
    priority = obj.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TraceFormatError(f"{where}: 'priority' must be an integer, got {priority!r}")
    retention = obj.get("retention_seconds")
    if retention is not None and (
        isinstance(retention, bool)
        or not isinstance(retention, (int, float))
        or not math.isfinite(retention)
        or retention < 0
    ):
        raise TraceFormatError(f"{where}: 'retention_seconds' must be a number >= 0, got {retention!r}")
    arrival_key = "timestamp" if "timestamp" in obj else "arrival_ms"
    arrival = obj.get(arrival_key, previous_arrival_ms)
    if (
        isinstance(arrival, bool)
        or not isinstance(arrival, (int, float))
        or not math.isfinite(arrival)
        or arrival < 0
    ):
        raise TraceFormatError(
            f"{where}: {arrival_key!r} must be a number of milliseconds >= 0, got {arrival!r}"
        )
    if arrival < previous_arrival_ms:
        raise TraceFormatError(
            f"{where}: {arrival_key!r} {arrival} is before the previous request's {previous_arrival_ms}; "
            "a trace lists requests in arrival order"
        )
    common: dict[str, Any] = {
        "line": line,
        "arrival_ms": float(arrival),
        "output_length": output_length,
        "priority": priority,
        "retention_seconds": None if retention is None else float(retention),
    }
    if "token_ids" in obj:
        if "hash_ids" in obj:
            raise TraceFormatError(f"{where}: give 'token_ids' or 'hash_ids', not both")
        tokens = _ids(obj, "token_ids", where, limit=TOKEN_ID_LIMIT)
        length = _int(obj, "input_length", where, minimum=1, required=False)
        if length is not None and length != len(tokens):
            raise TraceFormatError(f"{where}: 'input_length' {length} != {len(tokens)} token ids")
        if max_prompt_tokens is not None and len(tokens) > max_prompt_tokens:
            return TraceRequest(input_length=len(tokens), token_ids=(), over_length=True, **common)
        return TraceRequest(input_length=len(tokens), token_ids=tokens, **common)
    if "hash_ids" not in obj:
        raise TraceFormatError(f"{where}: missing 'token_ids' or 'hash_ids'")
    block = MOONCAKE_BLOCK_TOKENS if "timestamp" in obj and "hash_block_size" not in obj else None
    if block is None and "hash_block_size" not in obj:
        raise TraceFormatError(
            f"{where}: a line of 'hash_ids' needs 'hash_block_size' (tokens per id, kvspec's format) or "
            "'timestamp' (Mooncake's format, 512 tokens per id)"
        )
    if block is None:
        block = _int(obj, "hash_block_size", where, minimum=1)
    assert block is not None
    hash_ids = _ids(obj, "hash_ids", where, limit=HASH_ID_LIMIT)
    length = _int(obj, "input_length", where, minimum=1)
    assert length is not None
    if not (len(hash_ids) - 1) * block < length <= len(hash_ids) * block:
        raise TraceFormatError(
            f"{where}: 'input_length' {length} does not fit {len(hash_ids)} hash ids of {block} tokens "
            f"(it must be in ({(len(hash_ids) - 1) * block}, {len(hash_ids) * block}])"
        )
    if max_prompt_tokens is not None and length > max_prompt_tokens:
        return TraceRequest(
            input_length=length, hash_ids=(), hash_block_size=block, over_length=True, **common
        )
    return TraceRequest(input_length=length, hash_ids=hash_ids, hash_block_size=block, **common)


def read_trace(
    path: str | Path, *, limit: int | None = None, max_prompt_tokens: int | None = None
) -> Iterator[TraceRequest]:
    """The requests of the trace at ``path`` in file order (at most ``limit``), streamed; see the module
    docstring. A prompt over ``max_prompt_tokens`` is yielded with its lengths only (``over_length``).

    Raises :class:`TraceFormatError` for a missing or unreadable file, a path that is not a regular file, a
    line over :data:`MAX_LINE_BYTES`, a line that is not UTF-8 JSON, or a bad field, naming the file and
    the line."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise TraceFormatError(
            f"trace {str(path)!r} is not a regular file (a folder, FIFO or device); give a JSONL file"
        )
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from None
    with raw:
        compressed = path.suffix == ".gz" or raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        handle = gzip.GzipFile(fileobj=raw) if compressed else raw
        yield from _read_lines(handle, path.name, limit, max_prompt_tokens)


def _read_lines(
    handle: Any, name: str, limit: int | None, max_prompt_tokens: int | None
) -> Iterator[TraceRequest]:
    previous = 0.0
    count = 0
    number = 0
    while limit is None or count < limit:
        number += 1
        where = f"{name} line {number}"
        try:
            data: bytes = handle.readline(MAX_LINE_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"{where}: cannot read the file ({exc})") from None
        if not data:
            return
        if len(data) > MAX_LINE_BYTES:
            raise TraceFormatError(
                f"{where}: longer than {MAX_LINE_BYTES:,} bytes; a trace line is one request's JSON object "
                "(is this a trace file?)"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceFormatError(
                f"{where}: not UTF-8 text (byte {exc.start}); is this a JSONL trace?"
            ) from None
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise TraceFormatError(f"{where}: nests JSON too deeply to be a trace line") from None
        request = parse_line(
            obj, line=number, where=where, previous_arrival_ms=previous, max_prompt_tokens=max_prompt_tokens
        )
        previous = request.arrival_ms
        count += 1
        yield request
