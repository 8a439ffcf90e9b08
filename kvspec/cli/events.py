"""``kvspec events``: print the KV events a vLLM engine publishes (``--kv-events-config``), any release.

It subscribes to vLLM's ZMQ publisher and prints each event as it comes, one line each (``--json``: one
JSON object per line, with the batch's ``seq`` and ``ts``); it stops after ``--count`` events or when
``--idle-timeout`` seconds pass with none (saying so when none came at all). The decoding is
``kvspec.blocks.event_wire`` (vLLM 0.23's positional arrays and 0.32/0.34's tagged maps alike). Needs
``pip install 'kvspec[vllm]'`` (pyzmq, msgspec).

Which side binds: vLLM's publisher binds an endpoint with ``*`` or ``::`` and ``ipc://`` ones, and connects
to any other ``tcp://HOST:PORT``. ``--endpoint`` takes the endpoint exactly as vLLM's config writes it and
does the other half (connects to ``tcp://*:5557`` on this machine, binds ``tcp://127.0.0.1:5557`` for a
publisher that connects, loopback only); ``--connect`` and ``--bind`` say it explicitly. Every endpoint is
checked before a socket opens (one line, exit 2).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from kvspec.cli.args import positive_int


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds > 0")
    return value


#: vLLM's default KV event endpoint (its publisher binds every interface on port 5557).
VLLM_DEFAULT_ENDPOINT = "tcp://*:5557"
_TCP = re.compile(r"^tcp://(\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$")


def check_endpoint(endpoint: str, option: str) -> str:
    """``endpoint`` if it is a ZMQ endpoint a subscriber can use: ``tcp://HOST:PORT`` (a port 1-65535) or
    ``ipc://PATH``; else ``argparse.ArgumentTypeError`` saying what to write."""
    if endpoint.startswith("ipc://"):
        if len(endpoint) == len("ipc://"):
            raise argparse.ArgumentTypeError(
                f"{option} {endpoint!r}: name a socket path, e.g. ipc:///tmp/kv-events"
            )
        return endpoint
    if endpoint.startswith("inproc://"):
        raise argparse.ArgumentTypeError(
            f"{option} {endpoint!r}: inproc:// lives inside one process; use ipc:///PATH or tcp://HOST:PORT"
        )
    match = _TCP.match(endpoint)
    if match is None or not 1 <= int(match[2]) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{option} {endpoint!r}: expected tcp://HOST:PORT (port 1-65535) or ipc:///PATH, "
            "e.g. tcp://127.0.0.1:5557"
        )
    return endpoint


def subscription(args: argparse.Namespace) -> tuple[str, bool]:
    """(address, bind) of the subscriber: ``--connect`` and ``--bind`` as given; ``--endpoint`` (vLLM's
    own endpoint) complemented by vLLM's rule: a publisher that binds (``*``, ``::``, ``ipc://``) is
    connected to (``*`` on this machine's loopback), one that connects is bound for."""
    if args.connect is not None:
        if "*" in args.connect:
            raise argparse.ArgumentTypeError(
                f"--connect {args.connect!r}: '*' is a bind address; name the publisher's host, e.g. "
                f"{args.connect.replace('*', '127.0.0.1')}"
            )
        return args.connect, False
    if args.bind is not None:
        return args.bind, True
    endpoint = args.endpoint or VLLM_DEFAULT_ENDPOINT
    if endpoint.startswith("ipc://"):
        return endpoint, False
    if "*" in endpoint:
        return endpoint.replace("*", "127.0.0.1"), False
    if "::" in endpoint:
        return re.sub(r"\[[0-9A-Fa-f:.]*\]", "[::1]", endpoint), False
    return endpoint, True


def add_events_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "events", help="print the KV events a vLLM engine publishes (its --kv-events-config endpoint)"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--endpoint",
        type=lambda text: check_endpoint(text, "--endpoint"),
        default=None,
        help="the endpoint exactly as vLLM's --kv-events-config writes it (default tcp://*:5557, vLLM's): "
        "kvspec connects where vLLM binds and binds where vLLM connects",
    )
    where.add_argument(
        "--connect",
        type=lambda text: check_endpoint(text, "--connect"),
        default=None,
        metavar="ENDPOINT",
        help="connect to a publisher bound at ENDPOINT",
    )
    where.add_argument(
        "--bind",
        type=lambda text: check_endpoint(text, "--bind"),
        default=None,
        metavar="ENDPOINT",
        help="bind ENDPOINT for a publisher that connects (e.g. tcp://127.0.0.1:5557, loopback only)",
    )
    p.add_argument("--topic", default="", help="the publisher's topic (default: every topic)")
    p.add_argument("--count", type=positive_int, default=None, help="stop after this many events")
    p.add_argument(
        "--idle-timeout",
        type=_positive_seconds,
        default=None,
        help="stop when this many seconds pass with no event (default: never)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per event")
    p.set_defaults(func=cmd_events)


def _line(seq: int | None, record: dict[str, Any]) -> str:
    kind = record["type"]
    parts = [f"seq {seq}", kind]
    if "group_idx" in record:
        parts.append(f"group {record['group_idx']}")
    if kind != "AllBlocksCleared":
        hashes = record["block_hashes"]
        first = str(hashes[0])[:16] if hashes else "-"
        parts.append(f"{len(hashes)} block{'s' if len(hashes) != 1 else ''} from {first}")
    if kind == "BlockStored":
        parts.append(f"{len(record['token_ids'])} tokens")
        if record.get("kv_cache_spec_kind"):
            parts.append(str(record["kv_cache_spec_kind"]))
    return "  ".join(parts)


def cmd_events(args: argparse.Namespace) -> int:
    from kvspec.blocks.event_wire import event_as_json, receive_batches
    from kvspec.errors import EventWireError

    try:
        address, bind = subscription(args)
    except argparse.ArgumentTypeError as exc:
        print(f"kvspec events: {exc}", file=sys.stderr)
        return 2
    # "Never" is a very long poll: ZMQ takes milliseconds in a C int.
    timeout = args.idle_timeout if args.idle_timeout is not None else 2_000_000.0
    printed = 0
    try:
        for batch in receive_batches(address, topic=args.topic, idle_timeout_s=timeout, bind=bind):
            for event in batch.events:
                record = event_as_json(event)
                if args.json:
                    print(json.dumps({"seq": batch.seq, "ts": batch.ts, **record}), flush=True)
                else:
                    print(_line(batch.seq, record), flush=True)
                printed += 1
                if args.count is not None and printed >= args.count:
                    return 0
    except EventWireError as exc:
        print(f"kvspec events: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    if printed == 0:
        how = f"bound to {address} (the publisher connects)" if bind else f"connected to {address}"
        print(
            f"kvspec events: no KV event in {args.idle_timeout:g} s, {how}. Is vLLM serving with "
            '--kv-events-config \'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": ...}\' '
            "and prefix caching on, and is a request running? (--endpoint takes vLLM's endpoint as written.)",
            file=sys.stderr,
        )
        return 1
    return 0
