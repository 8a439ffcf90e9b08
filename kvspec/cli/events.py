"""``kvspec events``: print the KV events a vLLM engine publishes (``--kv-events-config``), any release.

It subscribes to vLLM's ZMQ publisher and prints each event as it comes, one line each (``--json``: one
JSON object per line, with the batch's ``seq`` and ``ts``); it stops after ``--count`` events or when
``--idle-timeout`` seconds pass with none. The decoding is ``kvspec.blocks.event_wire`` (vLLM 0.23's
positional arrays and 0.32/0.34's tagged maps alike). Needs ``pip install 'kvspec[vllm]'`` (pyzmq, msgspec).
"""

from __future__ import annotations

import argparse
import json
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


def add_events_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "events", help="print the KV events a vLLM engine publishes (its --kv-events-config endpoint)"
    )
    p.add_argument(
        "--endpoint",
        default="tcp://127.0.0.1:5557",
        help="the publisher's address (default tcp://127.0.0.1:5557, vLLM's default port)",
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

    # "Never" is a very long poll: ZMQ takes milliseconds in a C int.
    timeout = args.idle_timeout if args.idle_timeout is not None else 2_000_000.0
    printed = 0
    try:
        for batch in receive_batches(args.endpoint, topic=args.topic, idle_timeout_s=timeout):
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
    return 0
