"""Write kvspec/models/vllm_architectures.py: every text-generation architecture vLLM serves, with what its
model code caches, read from vLLM's source distribution (never imported: kvspec keeps the table as data).

    python -m scripts.vllm_architectures [--version 0.34.0] [--out kvspec/models/vllm_architectures.py]

Runs in ``nox -s vllm_architectures``. The sdist is fetched once through pip's own index configuration and
checked against the index's sha256 (tests/vllm_suite/run_suite.py's fetcher; cached under .nox/vllm-sdist).
For each entry of the registry's ``_TEXT_GENERATION_MODELS`` it reads the model's module (and the vLLM model
modules that module imports, for what a class inherits) and records:

- the state its layers keep, from the ``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator`` methods
  its code calls (``mamba1``, ``mamba2``, ``short_conv``, ``gated_delta_net``, ``linear_attention``,
  ``kda``);
- attention that is not a plain per-token K/V cache: a compressed latent (``mla``: the code reads
  ``kv_lora_rank``), a sparse-attention indexer cache (``sparse_indexer``), chunked local attention
  (``chunked_local``);
- ``sliding_window``: the code reads per-layer sliding windows (which layers, its config says).

These are markers found in the code, not a plan: kvspec uses them to refuse, with the reason, what it
cannot plan, and never to plan a state or latent model as a dense decoder (``--assume-dense``).
"""

from __future__ import annotations

import argparse
import ast
import re
import tarfile
from pathlib import Path

from tests.vllm_suite.run_suite import fetch_sdist

STATE = re.compile(r"MambaState(?:Shape|Dtype)Calculator\.(\w+?)_state_(?:shape|dtype)\b")
IMPORTED = re.compile(r"from vllm\.model_executor\.models\.(\w+) import (\([^)]*\)|[^\n]+)")
#: An imported name that brings model code (a class to inherit layers or a cache rule from), not a helper.
MODEL_CODE = re.compile(r"ForCausalLM|DecoderLayer|Attention|Model\b|Mixer|DeltaNet|MLP\b|MoE")
MARKERS = (
    ("mla", re.compile(r"\bkv_lora_rank\b")),
    ("sparse_indexer", re.compile(r"[Ii]ndexer\b|index_topk")),
    ("chunked_local", re.compile(r"\battention_chunk_size\b")),
    ("sliding_window", re.compile(r"\bsliding_window\b")),
)
STATES = ("mamba1", "mamba2", "short_conv", "gated_delta_net", "linear_attention", "kda")


def _sources(tar: tarfile.TarFile, root: str) -> dict[str, str]:
    """Every Python file of vLLM's model code in the archive, by its path under ``vllm/``."""
    out: dict[str, str] = {}
    for member in tar.getmembers():
        name = member.name.removeprefix(root)
        if (
            member.isfile()
            and name.endswith(".py")
            and name.startswith(("model_executor/models/", "models/"))
        ):
            extracted = tar.extractfile(member)
            if extracted is not None:
                out[name] = extracted.read().decode("utf-8", "replace")
    return out


def _module_text(module: str, sources: dict[str, str]) -> str:
    if module.startswith("vllm."):
        prefix = module.removeprefix("vllm.").replace(".", "/")
        files = [
            text for path, text in sources.items() if path == prefix + ".py" or path.startswith(prefix + "/")
        ]
    else:
        files = [sources.get(f"model_executor/models/{module}.py", "")]
    text = "\n".join(files)
    imported = {m for m, names in IMPORTED.findall(text) if m != module and MODEL_CODE.search(names)}
    return "\n".join([text, *(sources.get(f"model_executor/models/{m}.py", "") for m in sorted(imported))])


def classify(text: str) -> tuple[str, ...]:
    """The cache markers of one model's code (sorted, states first)."""
    called = set(STATE.findall(text))
    found = [s for s in STATES if s in called]
    found += [name for name, pattern in MARKERS if pattern.search(text)]
    return tuple(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--version", default="0.34.0")
    parser.add_argument("--out", default="kvspec/models/vllm_architectures.py")
    parser.add_argument("--cache", default=".nox/vllm-sdist")
    args = parser.parse_args(argv)
    archive = fetch_sdist(Path(args.cache), f"vllm-{args.version}.tar.gz")
    root = f"vllm-{args.version}/vllm/"
    with tarfile.open(archive) as tar:
        sources = _sources(tar, root)
    tree = ast.parse(sources["model_executor/models/registry.py"])
    table: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "_TEXT_GENERATION_MODELS":
                table = ast.literal_eval(node.value)
    if not table:
        raise SystemExit("vLLM's registry has no _TEXT_GENERATION_MODELS table")
    rows = []
    for arch in sorted(table):
        module, _ = table[arch]
        markers = classify(_module_text(module, sources))
        quoted = ", ".join(f'"{m}"' for m in markers) + ("," if len(markers) == 1 else "")
        rows.append(f'    "{arch}": ("{module}", ({quoted})),')
    Path(args.out).write_text(
        f'"""vLLM {args.version}\'s text-generation architectures and what their model code caches.\n\n'
        "Generated by ``python -m scripts.vllm_architectures`` (``nox -s vllm_architectures``) from vLLM's source\n"
        "distribution; do not edit. Each entry: the architecture (a config's ``architectures``) -> (vLLM's model\n"
        "module, the cache markers its code shows: see scripts/vllm_architectures.py).\n"
        '"""\n\n'
        "from __future__ import annotations\n\n"
        f'VLLM_RELEASE = "{args.version}"\n\n'
        "ARCHITECTURES: dict[str, tuple[str, tuple[str, ...]]] = {\n" + "\n".join(rows) + "\n}\n"
    )
    print(f"{len(rows)} architectures written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
