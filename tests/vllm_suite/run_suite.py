"""Run vLLM's own KV-cache and scheduler tests twice: on stock vLLM, and on kvspec through the shim.

Called by ``nox -s vllm`` in a virtualenv holding the vLLM release (0.23.0 or 0.34.0, ``--release``; no deps),
CPU torch and kvspec. Steps:

1. obtain that release's source distribution from the package index (the simple API's JSON form; the
   archive's sha256 is checked against the index) and cache it under ``.nox/vllm-sdist/``;
2. unpack only the test files below (and the helpers they import) into ``.nox/vllm-suite/``;
3. write a local Hugging Face cache holding the ``config.json`` of the models the tests name (the hub is
   unreachable here; the configs in ``hf_configs/`` are the models' public architecture fields), and for the
   two multimodal models their public processor files (``hf_processors/``) with a stand-in tokenizer;
4. run pytest on stock vLLM, then with ``shim_conftest.py`` (kvspec's adapter routed in), and print per
   file: passed, failed, skipped, the expected differences and the out-of-scope tests with reasons.

vLLM's code is never copied into this repository: the files are fetched at run time.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import html.parser
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


@dataclasses.dataclass(frozen=True)
class Release:
    """One vLLM release's test files in scope, what the shim routes to kvspec in each, and the helper
    files and packages they import."""

    version: str
    test_files: tuple[str, ...]
    # What the shim routes to kvspec in each file. A file not listed still runs vLLM's own classes on the
    # kvspec side (the shim does not route them): its kvspec column is not a kvspec result.
    routed: dict[str, str]
    helper_files: tuple[str, ...]
    packages: tuple[str, ...]

    @property
    def sdist(self) -> str:
        return f"vllm-{self.version}.tar.gz"


_SCHEDULER = "the Scheduler's KVCacheManager"
# 0.34.0's files get install(): the KVCacheManager a test builds is kvspec's; where a file is not routed by
# name below, the planning functions it calls by name stay vLLM's (no 0.34 facade for those yet).
_BUILT = "the KVCacheManager its tests build (planning and managers called by name stay vLLM's)"
RELEASES = {
    "0.23.0": Release(
        version="0.23.0",
        test_files=(
            "tests/v1/core/test_prefix_caching.py",
            "tests/v1/core/test_kv_cache_utils.py",
            "tests/v1/core/test_single_type_kv_cache_manager.py",
            "tests/v1/test_kv_cache_spec_registry.py",
            "tests/v1/core/test_kv_sharing.py",
            "tests/v1/core/test_kv_cache_metrics.py",
            "tests/v1/core/test_scheduler.py",
        ),
        routed={
            "tests/v1/core/test_prefix_caching.py": "KVCacheManager (and its block pool, coordinator, managers)",
            "tests/v1/core/test_scheduler.py": _SCHEDULER,
            "tests/v1/core/test_single_type_kv_cache_manager.py": "BlockPool, KVCacheBlock, the managers (vLLM-style)",
            "tests/v1/test_kv_cache_spec_registry.py": "specs, managers, the registry (kvspec's facade)",
            "tests/v1/core/test_kv_sharing.py": "add_kv_sharing_layers_to_kv_cache_groups (kvspec.planning decides)",
            "tests/v1/core/test_kv_cache_metrics.py": "BlockMetricsState, KVCacheMetricsCollector (kvspec.blocks.metrics)",
            "tests/v1/core/test_kv_cache_utils.py": (
                "KVCacheBlock, FreeKVCacheBlockQueue, KVCacheManager, the planning functions (kvspec.integrations."
                "vllm_planning); the block-hash functions stay vLLM's (under the adapter vLLM's engine hashes)"
            ),
        },
        helper_files=("tests/v1/core/utils.py", "tests/v1/kv_connector/unit/utils.py"),
        packages=(
            "tests",
            "tests/v1",
            "tests/v1/core",
            "tests/v1/kv_connector",
            "tests/v1/kv_connector/unit",
        ),
    ),
    "0.34.0": Release(
        version="0.34.0",
        test_files=(
            "tests/v1/core/test_prefix_caching.py",
            "tests/v1/core/test_kv_cache_utils.py",
            "tests/v1/core/test_kv_cache_planning.py",
            "tests/v1/core/test_kv_cache_config_builder.py",
            "tests/v1/core/test_contiguous_kv_packing.py",
            "tests/v1/core/test_single_type_kv_cache_manager.py",
            "tests/v1/core/test_kv_cache_metrics.py",
            "tests/v1/core/test_kv_sharing.py",
            "tests/v1/core/test_prompt_block_hash_vectors.py",
            "tests/v1/core/test_mamba_align_chunk_split.py",
            "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py",
            "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py",
            "tests/v1/core/prefix_cache/test_mamba_eagle_resume_checkpoint.py",
            "tests/v1/test_kv_cache_spec_registry.py",
            "tests/v1/core/test_scheduler.py",
            "tests/v1/core/test_async_scheduler.py",
            "tests/v1/core/test_deferred_block_free.py",
            "tests/v1/core/test_swa_inflight_window_free.py",
            "tests/v1/core/test_prefix_replay.py",
            "tests/v1/core/test_priority_preemption_bug.py",
            "tests/v1/core/test_priority_scheduler_random.py",
            "tests/v1/core/test_worker_slot_overflow.py",
        ),
        routed={
            "tests/v1/core/test_prefix_caching.py": "KVCacheManager (kvspec's coordinator, pool and managers)",
            "tests/v1/core/test_scheduler.py": _SCHEDULER,
            "tests/v1/core/test_async_scheduler.py": _SCHEDULER,
            "tests/v1/core/test_deferred_block_free.py": _SCHEDULER,
            "tests/v1/core/test_swa_inflight_window_free.py": _SCHEDULER,
            "tests/v1/core/test_prefix_replay.py": _SCHEDULER,
            "tests/v1/core/test_priority_preemption_bug.py": _SCHEDULER,
            "tests/v1/core/test_priority_scheduler_random.py": _SCHEDULER,
            "tests/v1/core/test_worker_slot_overflow.py": _SCHEDULER,
            "tests/v1/core/test_mamba_align_chunk_split.py": _SCHEDULER,
            "tests/v1/core/test_kv_cache_utils.py": _BUILT,
            "tests/v1/core/test_contiguous_kv_packing.py": _BUILT,
            "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py": _BUILT,
            "tests/v1/core/prefix_cache/test_mamba_eagle_resume_checkpoint.py": _BUILT,
            "tests/v1/core/test_kv_cache_metrics.py": "BlockMetricsState, KVCacheMetricsCollector (kvspec.blocks.metrics)",
            "tests/v1/core/test_kv_sharing.py": "add_kv_sharing_layers_to_kv_cache_groups (kvspec.planning decides)",
            "tests/v1/test_kv_cache_spec_registry.py": (
                "specs, managers, the registry with role managers, get_kv_cache_spec_kind (kvspec's facade)"
            ),
            "tests/v1/core/test_single_type_kv_cache_manager.py": (
                "BlockPool, KVCacheBlock, the managers (vLLM 0.34-style: Vllm034BlockPool, Vllm034StyleManager)"
            ),
            "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py": (
                "BlockPool (Vllm034BlockPool: partial prompt-tail entries), BlockHashListWithBlockSize"
            ),
            "tests/v1/core/test_kv_cache_planning.py": (
                "grouping, EAGLE groups, block counts, null block, auto-fit, memory checks "
                "(kvspec.integrations.vllm_planning_034; tensor placement stays vLLM's KVCacheConfigBuilder)"
            ),
        },
        helper_files=(
            "tests/v1/core/utils.py",
            "tests/v1/kv_connector/unit/utils.py",
            "tests/v1/core/prefix_cache/__init__.py",
            "tests/v1/spec_decode/utils.py",
            # test_prompt_block_hash_vectors.py's golden hashes
            "rust/src/engine-core-client/src/tests/prompt_block_hash_vectors.json",
        ),
        packages=(
            "tests",
            "tests/v1",
            "tests/v1/core",
            "tests/v1/core/prefix_cache",
            "tests/v1/spec_decode",
            "tests/v1/kv_connector",
            "tests/v1/kv_connector/unit",
        ),
    ),
}


def pip_index_url() -> str:
    """The package index pip itself uses here: ``PIP_INDEX_URL``, else pip's configuration
    (``pip config get``), else pip's built-in default. No index address is written in this repository."""
    configured = os.environ.get("PIP_INDEX_URL", "").split()
    if configured:
        return configured[0]
    for key in ("install.index-url", "download.index-url", "global.index-url"):
        found = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", key], capture_output=True, text=True, check=False
        )
        if found.returncode == 0 and found.stdout.strip():
            return found.stdout.strip()
    from pip._internal.models.index import PyPI  # pip's default index, as pip resolves it

    return str(PyPI.simple_url)


class _Links(html.parser.HTMLParser):
    """Anchors of a PEP 503 (HTML) simple-index page: (href, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((self._href, data.strip()))
            self._href = None


def find_sdist(index: str, sdist: str) -> tuple[str, str]:
    """(download URL, sha256) of the sdist on ``index``'s project page (PEP 691 JSON, or PEP 503 HTML)."""
    page = urllib.parse.urljoin(index.rstrip("/") + "/", "vllm/")
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    with urllib.request.urlopen(
        urllib.request.Request(page, headers={"Accept": accept}), timeout=120
    ) as resp:
        body = resp.read()
        kind = resp.headers.get("Content-Type", "")
    if "json" in kind:
        entry = next((f for f in json.loads(body)["files"] if f["filename"] == sdist), None)
        if entry is not None:
            return urllib.parse.urljoin(page, entry["url"]), str(entry["hashes"]["sha256"])
    else:
        parser = _Links()
        parser.feed(body.decode())
        for href, text in parser.links:
            link = urllib.parse.urljoin(page, href)
            fragment = urllib.parse.urlparse(link).fragment
            if text == sdist and fragment.startswith("sha256="):
                return link.split("#", 1)[0], fragment.removeprefix("sha256=")
    sys.exit(f"{sdist} (with a sha256) is not on {page}")


def fetch_sdist(cache: Path, sdist: str) -> Path:
    """The sdist archive, downloaded once and verified against the index's sha256."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / sdist
    digest_file = cache / (sdist + ".sha256")
    if target.exists() and digest_file.exists():
        if hashlib.sha256(target.read_bytes()).hexdigest() == digest_file.read_text().strip():
            return target
    index = pip_index_url()
    url, sha256 = find_sdist(index, sdist)
    tmp = target.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=600) as resp, tmp.open("wb") as out:
        shutil.copyfileobj(resp, out)
    got = hashlib.sha256(tmp.read_bytes()).hexdigest()
    if got != sha256:
        tmp.unlink()
        sys.exit(f"{sdist}: sha256 {got} differs from the index's {sha256}")
    tmp.replace(target)
    digest_file.write_text(got)
    return target


def unpack(archive: Path, work: Path, release: Release) -> None:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    wanted = {f"vllm-{release.version}/{name}" for name in release.test_files + release.helper_files}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.name in wanted:
                member.name = member.name.split("/", 1)[1]
                tar.extract(member, work, filter="data")
    for package in release.packages:
        (work / package / "__init__.py").touch()
    # The work dir is pytest's rootdir (node ids "tests/v1/..."), not kvspec's pyproject above it.
    (work / "pytest.ini").write_text("[pytest]\n")


def write_hf_cache(hub: Path) -> None:
    """A Hugging Face hub cache with one snapshot per model: its config.json, and for the multimodal models
    (whose scheduler tests make vLLM build their processor) the processor files of ``hf_processors/``."""
    revision = "0" * 40
    # Written afresh: a file left by an earlier run would hide one missing from hf_configs / hf_processors.
    shutil.rmtree(hub, ignore_errors=True)
    for config in sorted((HERE / "hf_configs").glob("*.json")):
        repo = hub / f"models--{config.stem}"
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True, exist_ok=True)
        shutil.copy(config, snapshot / "config.json")
        processor = HERE / "hf_processors" / config.stem
        for file in sorted(processor.glob("*.json")):
            if file.name == "stand_in_tokenizer.json":
                tokenizer = stand_in_tokenizer(**json.loads(file.read_text()))
                (snapshot / "tokenizer.json").write_text(json.dumps(tokenizer))
            else:
                shutil.copy(file, snapshot / file.name)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)


def stand_in_tokenizer(*, special_tokens: dict[str, str], unk_token: str) -> dict[str, object]:
    """A word-level ``tokenizer.json`` holding a model's special tokens at their ids, and placeholder words
    ``<tok_N>`` at every id below the highest one (the real vocabulary files are not on the package index).
    vLLM's tests build prompts from token ids; what vLLM's multimodal processing asks of the tokenizer is the
    placeholder tokens (``<image>``, ``<|image_pad|>``) at the ids the model's config names."""
    special = {int(token_id): text for token_id, text in special_tokens.items()}
    vocab = {f"<tok_{i}>": i for i in range(max(special) + 1) if i not in special}
    vocab.update({text: token_id for token_id, text in special.items()})
    added = [
        {"id": token_id, "content": text, "single_word": False, "lstrip": False, "rstrip": False}
        | {"normalized": False, "special": True}
        for token_id, text in sorted(special.items())
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": unk_token},
    }


def start_pytest(
    work: Path, hub: Path, mode: str, extra: list[str], release: Release
) -> subprocess.Popen[bytes]:
    """pytest over the files in ``mode`` ("stock" or "kvspec"), in its own copy of the tests (``work``: the
    two runs go side by side, one per core), its output to ``work/pytest.log``."""
    shutil.copy(
        HERE / ("shim_conftest.py" if mode == "kvspec" else "stock_conftest.py"), work / "conftest.py"
    )
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_CACHE=str(hub),
        HF_HOME=str(work / "hf-home"),
        VLLM_LOGGING_LEVEL="ERROR",
        KVSPEC_SUITE_ROOT=str(ROOT),
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-rs",
        "--tb=line",
        f"--junitxml={work / 'report.xml'}",
    ]
    log = (work / "pytest.log").open("wb")
    return subprocess.Popen(
        [*cmd, *release.test_files, *extra], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT
    )


def finish_pytest(proc: subprocess.Popen[bytes], work: Path, mode: str, release: Release) -> dict[str, str]:
    """Wait for a run, print its output, and return the outcome of every test by node id."""
    proc.wait()
    print(f"\n=== vLLM {release.version}'s tests on {mode} ===", flush=True)
    sys.stdout.write((work / "pytest.log").read_text(errors="replace"))
    return parse_report(work / "report.xml", release)


def parse_report(report: Path, release: Release) -> dict[str, str]:
    """node id -> passed | failed | skipped | xfailed, from a junit XML report."""
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        parts = classname.split(".")
        # classname is the module's dotted path, then the class for tests defined in a class
        split = next(
            (i for i in range(len(parts), 0, -1) if "/".join(parts[:i]) + ".py" in release.test_files), None
        )
        if split is None:
            continue
        nodeid = "::".join(["/".join(parts[:split]) + ".py", *parts[split:], name])
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
        outcomes[nodeid] = outcome
    return outcomes


def summarize(results: dict[str, dict[str, str]], release: Release) -> int:
    """Print the per-file table; return how many tests pass on stock vLLM but fail on kvspec unlisted."""
    modes = list(results)
    print(
        f"\nvLLM {release.version}'s tests per file: passed / failed / skipped (+ xfailed: known kvspec gaps)"
    )
    print(
        f"{'file':<66}"
        + "".join(f"{m:>24}" for m in modes)
        + ("   kvspec of stock's passes" if len(modes) == 2 else "")
    )
    regressions: list[str] = []
    for file in release.test_files:
        row = f"{file:<66}"
        for mode in modes:
            c = Counter(o for t, o in results[mode].items() if t.startswith(file + "::"))
            row += f"{c['passed']:>9} /{c['failed']:>4} /{c['skipped']:>4} (+{c['xfailed']})"
        if len(modes) == 2:
            stock_passes = [
                t for t, o in results["stock"].items() if t.startswith(file + "::") and o == "passed"
            ]
            both = [t for t in stock_passes if results["kvspec"].get(t) == "passed"]
            share = f"{len(both)} / {len(stock_passes)}" if stock_passes else "-"
            row += f"   {share:>12}"
            regressions += [t for t in stock_passes if results["kvspec"].get(t) == "failed"]
        if file not in release.routed:
            row += "   (not routed: vLLM's own code ran)"
        print(row)
    for test in regressions:
        print(f"UNEXPECTED: passes on stock vLLM, fails on kvspec and is in no list: {test}")
    return len(regressions)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mode", choices=("both", "stock", "kvspec"), default="both")
    parser.add_argument(
        "--release", choices=sorted(RELEASES), default=None, help="default: the installed vLLM"
    )
    args, extra = parser.parse_known_args()
    version = args.release or _installed_vllm_version()
    if version not in RELEASES:
        sys.exit(f"vLLM {version} is installed; this runner knows the tests of {', '.join(sorted(RELEASES))}")
    release = RELEASES[version]
    cache = ROOT / ".nox" / "vllm-sdist"
    work = ROOT / ".nox" / f"vllm-suite-{release.version}"
    archive = fetch_sdist(cache, release.sdist)
    modes = ("stock", "kvspec") if args.mode == "both" else (args.mode,)
    for mode in modes:
        unpack(archive, work / mode, release)
    write_hf_cache(work / "hub")
    running = {mode: start_pytest(work / mode, work / "hub", mode, extra, release) for mode in modes}
    results = {mode: finish_pytest(proc, work / mode, mode, release) for mode, proc in running.items()}
    regressions = summarize(results, release)
    # Every test of these files passes on stock vLLM in the nox environments: one that fails there means
    # the environment lacks something (a dependency, a hub file), and would hide a kvspec result.
    stock_failures = sorted(t for t, o in results.get("stock", {}).items() if o == "failed")
    for test in stock_failures:
        print(f"FAILS ON STOCK vLLM (the environment lacks something; see the stock log above): {test}")
    if regressions or stock_failures:
        sys.exit(1)


def _installed_vllm_version() -> str:
    from importlib.metadata import version

    return version("vllm")


if __name__ == "__main__":
    main()
