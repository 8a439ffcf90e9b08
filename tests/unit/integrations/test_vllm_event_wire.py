"""vLLM's KV event wire format read without vLLM (kvspec.integrations.vllm_event_wire) and ``kvspec events``.

The payloads are encoded here with msgspec the way each release declares its events: vLLM 0.23's structs are
``array_like`` and tagged (positional arrays, the type first), 0.32's and 0.34's tagged maps; the batch is an
array ``[ts, events, dp_rank]`` in every release. Fields at their defaults are left out (``omit_defaults``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from kvspec.blocks.event_wire import (
    WireAllBlocksCleared,
    WireBlockRemoved,
    WireBlockStored,
    decode_event_batch,
    event_as_json,
)
from kvspec.cli.main import main
from kvspec.errors import EventWireError

Hash = bytes | int


class Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[object]
    data_parallel_rank: int | None = None


class _Stored(msgspec.Struct, omit_defaults=True):
    """BlockStored's fields common to every release (each release below adds its encoding)."""

    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[object] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


# vLLM 0.23: positional, tagged.
class Stored023(_Stored, array_like=True, tag="BlockStored"):
    pass


class Removed023(msgspec.Struct, array_like=True, omit_defaults=True, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: str | None
    group_idx: int | None = None


# vLLM 0.32 / 0.34: tagged maps, three more fields.
class Stored034(_Stored, tag="BlockStored"):
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class Cleared034(msgspec.Struct, omit_defaults=True, tag="AllBlocksCleared"):
    pass


H1, H2, H3 = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32


def _encode(events: list[object], rank: int | None = None) -> bytes:
    return bytes(msgspec.msgpack.encode(Batch(ts=12.5, events=events, data_parallel_rank=rank)))


def test_reads_vllm_023_positional_events() -> None:
    payload = _encode(
        [
            Stored023(
                [H1, H2],
                None,
                list(range(32)),
                16,
                None,
                "GPU",
                None,
                group_idx=1,
                kv_cache_spec_kind="sliding_window",
                kv_cache_spec_sliding_window=64,
            ),
            Removed023([H1], "GPU"),
        ]
    )
    batch = decode_event_batch(payload, seq=7)
    assert (batch.ts, batch.seq, batch.data_parallel_rank) == (12.5, 7, None)
    stored, removed = batch.events
    assert stored == WireBlockStored(
        block_hashes=(H1, H2),
        parent_block_hash=None,
        token_ids=tuple(range(32)),
        block_size=16,
        medium="GPU",
        group_idx=1,
        kv_cache_spec_kind="sliding_window",
        kv_cache_spec_sliding_window=64,
    )
    assert removed == WireBlockRemoved(block_hashes=(H1,), medium="GPU")


def test_reads_vllm_034_maps_and_int_hashes() -> None:
    payload = _encode(
        [
            Stored034(
                [3, 4],
                2,
                [5, 6],
                2,
                None,
                "GPU",
                "adapter",
                extra_keys=[("adapter",), None],
                group_idx=0,
                session_id="s1",
            ),
            Cleared034(),
        ],
        rank=1,
    )
    batch = decode_event_batch(payload)
    assert batch.data_parallel_rank == 1
    stored, cleared = batch.events
    assert isinstance(stored, WireBlockStored)
    assert (stored.block_hashes, stored.parent_block_hash, stored.lora_name, stored.session_id) == (
        (3, 4),
        2,
        "adapter",
        "s1",
    )
    assert stored.extra_keys == (("adapter",), None)
    assert cleared == WireAllBlocksCleared()
    record = event_as_json(stored)
    assert next(iter(record)) == "type" and record["type"] == "BlockStored"
    assert "locality" not in record  # None fields left out
    assert event_as_json(WireBlockRemoved(block_hashes=(H3,)))["block_hashes"] == [H3.hex()]


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"\xc1", "not msgpack"),
        (msgspec.msgpack.encode({"ts": 1}), "[ts, events, dp_rank]"),
        (msgspec.msgpack.encode([1.0, [["Bogus", 1]]]), "unknown KV event type 'Bogus'"),
        (
            msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [], "colour": 1}]]),
            "colour",
        ),
        (msgspec.msgpack.encode([1.0, [["BlockRemoved", [], None, 0, 9]]]), "at most 3"),
        (msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": []}]]), "BlockStored event"),
        (msgspec.msgpack.encode(["then", []]), "ts must be a number"),
        (msgspec.msgpack.encode([1.0, [7]]), "a map or an array"),
    ],
)
def test_refuses_what_is_not_an_event_batch(payload: bytes, fragment: str) -> None:
    with pytest.raises(EventWireError) as failure:
        decode_event_batch(payload)
    assert fragment in str(failure.value)


def test_kvspec_events_prints_what_a_publisher_sends(capsys: pytest.CaptureFixture[str]) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    pub = context.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    payload = _encode(
        [Stored034([H1], None, [1, 2], 2, None, "GPU", None, group_idx=0), Removed023([H1], "GPU")]
    )
    codes: list[int] = []
    subscriber = threading.Thread(
        target=lambda: codes.append(
            main(
                [
                    "events",
                    "--connect",
                    f"tcp://127.0.0.1:{port}",
                    "--topic",
                    "kv",
                    "--count",
                    "2",
                    "--json",
                    "--idle-timeout",
                    "20",
                ]
            )
        )
    )
    subscriber.start()
    seq = 0
    deadline = time.monotonic() + 20
    while subscriber.is_alive() and time.monotonic() < deadline:  # ZMQ drops what is sent before it joins
        pub.send_multipart((b"kv", seq.to_bytes(8, "big"), payload))
        seq += 1
        time.sleep(0.05)
    subscriber.join(5)
    pub.close(linger=0)
    assert codes == [0]
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert len(lines) == 2
    import json

    first, second = (json.loads(line) for line in lines)
    assert first["type"] == "BlockStored" and first["block_hashes"] == [H1.hex()] and first["ts"] == 12.5
    assert second["type"] == "BlockRemoved" and second["seq"] == first["seq"]


def test_kvspec_events_stops_when_idle_and_says_nothing_came(capsys: pytest.CaptureFixture[str]) -> None:
    start = time.monotonic()
    assert main(["events", "--connect", "tcp://127.0.0.1:9", "--idle-timeout", "0.3"]) == 1
    assert time.monotonic() - start < 5
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        "no KV event in 0.3 s, connected to tcp://127.0.0.1:9. Is vLLM serving with --kv-events-config" in err
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--endpoint", "tcp://127.0.0.1"], "expected tcp://HOST:PORT (port 1-65535) or ipc:///PATH"),
        (["--endpoint", "tcp://127.0.0.1:70000"], "expected tcp://HOST:PORT"),
        (["--bind", "udp://127.0.0.1:5557"], "expected tcp://HOST:PORT"),
        (["--connect", "inproc://kv"], "inproc:// lives inside one process"),
        (["--endpoint", "ipc://"], "name a socket path"),
    ],
)
def test_kvspec_events_refuses_a_malformed_endpoint_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["events", *argv, "--idle-timeout", "0.1"])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_kvspec_events_will_not_connect_to_a_bind_address(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 51: vLLM's ``tcp://*:5557`` copied into the subscriber ended in a ZMQError traceback."""
    assert main(["events", "--connect", "tcp://*:5557", "--idle-timeout", "0.1"]) == 2
    assert (
        "'*' is a bind address; name the publisher's host, e.g. tcp://127.0.0.1:5557"
        in capsys.readouterr().err
    )


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("vllm_endpoint", ["tcp://*:{port}", "tcp://127.0.0.1:{port}", "ipc://{tmp}/kv"])
def test_kvspec_events_pairs_with_the_endpoint_vllm_was_given(
    vllm_endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--endpoint`` takes vLLM's endpoint as written and does the other half of vLLM's rule: a publisher
    bound on every interface or on ipc:// is connected to; one that connects (loopback) is bound for."""
    endpoint = vllm_endpoint.format(port=_free_port(), tmp=tmp_path)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    pub = context.socket(zmq.PUB)
    vllm_binds = "*" in endpoint or endpoint.startswith("ipc://")
    codes: list[int] = []
    subscriber = threading.Thread(
        target=lambda: codes.append(
            main(["events", "--endpoint", endpoint, "--count", "1", "--json", "--idle-timeout", "20"])
        )
    )
    if vllm_binds:
        pub.bind(endpoint)
        subscriber.start()
    else:
        subscriber.start()
        time.sleep(0.3)  # the subscriber binds first, as it would be started before the server
        pub.connect(endpoint)
    payload = _encode([Removed023([H1], "GPU")])
    seq = 0
    deadline = time.monotonic() + 20
    while subscriber.is_alive() and time.monotonic() < deadline:
        pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))
        seq += 1
        time.sleep(0.05)
    subscriber.join(5)
    pub.close(linger=0)
    assert codes == [0]
    assert '"type": "BlockRemoved"' in capsys.readouterr().out
