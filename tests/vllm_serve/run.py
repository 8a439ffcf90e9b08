"""Serve one model stock and on kvspec, drive each server the same way, and write what came back.

    python -m tests.vllm_serve.run --model gemma3-tiny --out DIR [--bench-prompts N] [--configs stock,lru,...]

For each server configuration (:data:`CONFIGS`: stock vLLM; kvspec with LRU; with LFU; with the retention
policy, the first popular prompt pinned for ten minutes at the least important priority and the one-off
prompts less important than the other popular ones, under vLLM's priority scheduling) it starts ``vllm serve``, subscribes to its KV
events, runs the API workload then the pressure workload (tests/vllm_serve/client.py), reads the prefix-cache
counters from ``/metrics``, runs ``vllm bench serve`` on a shared-prefix dataset, and stops the server. It
writes ``DIR/<model>.json``: per configuration the answers, the events (decoded by kvspec's wire reader, as
JSON), the counters, the benchmark's figures and whether the log says kvspec manages the KV cache.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.vllm_engine.checkpoints import MODELS, write_checkpoint
from tests.vllm_serve.client import answers_as_json, api_workload, pressure_workload, run_workload
from tests.vllm_serve.server import SERVED_NAME, Server, ServerConfig, running_server, scrape_metrics
from tests.vllm_serve.tokenizer import write_tokenizer

#: How long the first system prompt is pinned in the retention configuration (seconds).
PIN_SECONDS = 600.0
CONFIGS: dict[str, ServerConfig] = {
    "stock": ServerConfig(label="stock"),
    "kvspec-lru": ServerConfig(label="kvspec-lru", plugin_env={"KVSPEC_VLLM": "1"}),
    "kvspec-lfu": ServerConfig(
        label="kvspec-lfu", plugin_env={"KVSPEC_VLLM": "1", "KVSPEC_VLLM_EVICTION": "lfu"}
    ),
    "kvspec-pins": ServerConfig(
        label="kvspec-pins",
        plugin_env={"KVSPEC_VLLM": "1", "KVSPEC_VLLM_EVICTION": "retention"},
        scheduling_policy="priority",
    ),
}
#: A hardware platform's plugin written for vLLM's registry (tests/vllm_platform, the capped platform), served
#: stock and on kvspec (issue 49): run on request (``--configs``), not by default, and only the API workload.
PLATFORM_CONFIGS: dict[str, ServerConfig] = {
    # vLLM's own CPU platform with the plugin installed but not switched on: what the platform changes.
    "platform-off": ServerConfig(label="platform-off"),
    "platform-stock": ServerConfig(label="platform-stock", plugin_env={"CAPPED_PLATFORM": "1"}),
    "platform-kvspec": ServerConfig(
        label="platform-kvspec", plugin_env={"CAPPED_PLATFORM": "1", "KVSPEC_VLLM": "1"}
    ),
}
#: The one-off prompts' scheduling priority in the retention configuration (less important than the default 0).
ONEOFF_PRIORITY = 5
#: The pinned prompt's priority there: the least important of all, so only its pin keeps it (the unpinned
#: popular prompts, at 0, outlast the one-offs by priority alone).
PINNED_PRIORITY = 9
#: The line the plugin logs where kvspec's adapter is built (kvspec.integrations.vllm_plugin).
MANAGES_LINE = "manages the KV cache"
METRICS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


def model_dir(work_dir: Path, name: str) -> Path:
    directory = write_checkpoint(MODELS[name], work_dir / "models" / name)
    return write_tokenizer(directory)


class EventCollector:
    """Every KV event batch a server publishes while it runs (a thread on a ZMQ SUB socket bound to the
    server's events endpoint on 127.0.0.1, to which its publisher connects)."""

    def __init__(self, endpoint: str) -> None:
        import zmq

        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = context.socket(zmq.SUB)
        self._socket.bind(endpoint)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._stop = threading.Event()
        self.batches: list[Any] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        time.sleep(1.0)  # ZMQ's slow joiner: let the subscription reach the publisher before anything is sent

    def _run(self) -> None:
        from kvspec.blocks.event_wire import decode_event_batch

        while not self._stop.is_set():
            if self._socket.poll(200):
                _, seq, payload = self._socket.recv_multipart()
                self.batches.append(decode_event_batch(payload, seq=int.from_bytes(seq, "big")))

    def stop(self, settle_s: float = 1.5) -> list[dict[str, Any]]:
        """Stop after ``settle_s`` (the last step's events are in flight); the events, in order, as JSON."""
        from kvspec.blocks.event_wire import event_as_json

        time.sleep(settle_s)
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)
        return [event_as_json(e) for batch in self.batches for e in batch.events]


def run_bench(server: Server, directory: Path, out: Path, num_prompts: int) -> dict[str, Any]:
    """``vllm bench serve`` (vLLM's ``vllm.benchmarks.serve``) on a prefix-repetition dataset: 4 prefixes of
    160 tokens, 48-token suffixes, 8 output tokens, at most 4 requests in flight; its result JSON."""
    result_name = f"bench-{server.config.label}.json"
    args = [
        "--backend", "openai", "--base-url", server.base_url, "--endpoint", "/v1/completions",
        "--model", SERVED_NAME, "--tokenizer", str(directory),
        "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "160",
        "--prefix-repetition-suffix-len", "48", "--prefix-repetition-num-prefixes", "4",
        "--prefix-repetition-output-len", "8", "--num-prompts", str(num_prompts),
        "--max-concurrency", "4", "--request-rate", "inf", "--seed", "0", "--ignore-eos",
        "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--result-dir", str(out), "--result-filename", result_name, "--disable-tqdm",
    ]  # fmt: skip
    log = out / f"bench-{server.config.label}.log"
    with log.open("w") as handle:
        done = subprocess.run(
            [sys.executable, "-m", "tests.vllm_serve.bench_serve", *args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            timeout=600,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(
            f"vllm bench serve failed ({done.returncode}); its log ends:\n{log.read_text()[-3000:]}"
        )
    result: dict[str, Any] = json.loads((out / result_name).read_text())
    keep = (
        "completed", "total_input_tokens", "total_output_tokens", "duration", "request_throughput",
        "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p50_ttft_ms",
        "p90_ttft_ms", "p99_ttft_ms", "mean_e2el_ms", "p99_e2el_ms",
    )  # fmt: skip
    return {k: result[k] for k in keep if k in result}


def retention_probes(base_url: str) -> list[dict[str, Any]]:
    """Requests with a retention kvspec must refuse or take: each value, the HTTP status and the error's
    ``param`` (a refusal must be a 400 naming the field, the server still serving afterwards)."""
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="kvspec", max_retries=0, timeout=60)
    found = []
    for value in (-1, "ten minutes", 600):
        try:
            client.completions.create(
                model=SERVED_NAME,
                prompt="probe",
                max_tokens=1,
                extra_body={"vllm_xargs": {"kv_retention_seconds": value}},
            )
            found.append({"value": value, "status": 200, "param": None})
        except openai.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            found.append(
                {
                    "value": value,
                    "status": exc.status_code,
                    "param": body.get("param"),
                    "message": body.get("message"),
                }
            )
    return found


def run_config(name: str, model: str, work_dir: Path, out: Path, bench_prompts: int) -> dict[str, Any]:
    config = CONFIGS[name] if name in CONFIGS else PLATFORM_CONFIGS[name]
    directory = model_dir(work_dir, model)
    pins = name == "kvspec-pins"
    platform = name in PLATFORM_CONFIGS
    with running_server(directory, model, config, work_dir) as server:
        assert server.events_endpoint is not None
        collector = EventCollector(server.events_endpoint)
        api = run_workload(server.base_url, api_workload())
        counters = scrape_metrics(server.base_url, METRICS)
        events = collector.stop()
        pressure = (
            []
            if platform
            else run_workload(
                server.base_url,
                pressure_workload(
                    retention_s=PIN_SECONDS if pins else None,
                    oneoff_priority=ONEOFF_PRIORITY if pins else 0,
                    pinned_priority=PINNED_PRIORITY if pins else 0,
                ),
            )
        )
        bench = run_bench(server, directory, out, bench_prompts) if bench_prompts and not platform else None
        probes = retention_probes(server.base_url) if name in CONFIGS and name != "stock" else []
        log = server.log_text()
        pgid = server.process.pid
    return {
        "config": name,
        "pgid": pgid,
        "retention_probes": probes,
        "plugin_env": dict(config.plugin_env),
        "kvspec_manages": MANAGES_LINE in log,
        "manages_line": next((line for line in log.splitlines() if MANAGES_LINE in line), None),
        "api": answers_as_json(api),
        "api_metrics": counters,
        "events": events,
        "pressure": answers_as_json(pressure),
        "bench": bench,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gemma3-tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="comma-separated names from CONFIGS or PLATFORM_CONFIGS (the platform plugin's servers)",
    )
    parser.add_argument(
        "--bench-prompts", type=int, default=64, help="vllm bench serve's prompts (0: skip it)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work_dir = args.out / "work"
    work_dir.mkdir(exist_ok=True)
    results = {}
    for name in args.configs.split(","):
        start = time.perf_counter()
        results[name] = run_config(name, args.model, work_dir, args.out, args.bench_prompts)
        print(f"{args.model} {name}: {time.perf_counter() - start:.0f} s", flush=True)
    (args.out / f"{args.model}.json").write_text(json.dumps({"model": args.model, "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
