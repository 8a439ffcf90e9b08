"""The model-family table of docs/MODELS.md, made from the real configs under tests/fixtures/configs.

``python -m tests.unit.models.family_table`` rewrites the table in docs/MODELS.md (between its markers);
test_family_table.py fails when the file and the configs disagree. The figures are kvspec's; that they
equal vLLM 0.34.0's own functions on the same configs is tests/vllm/test_model_families_vs_vllm.py
(``nox -s vllm034``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from kvspec import MambaSpec
from kvspec.contracts.traits import block_tokens_of
from kvspec.models import build_model_layout
from kvspec.models.family import model_families

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
DOC = ROOT / "docs" / "MODELS.md"
BEGIN = "<!-- family table: python -m tests.unit.models.family_table -->"
END = "<!-- end of family table -->"
BLOCK = 64  # vLLM 0.34's default block size

_KIND_NAMES = {
    "FullAttentionSpec": "full",
    "SlidingWindowSpec": "sliding",
    "ChunkedLocalAttentionSpec": "chunked",
    "MLAAttentionSpec": "MLA",
    "CrossAttentionSpec": "cross",
}
_STATE_NAMES = {
    "mamba1": "Mamba1",
    "mamba2": "Mamba2",
    "gdn_attn": "GDN",
    "linear": "lightning",
    "short_conv": "short conv",
}


def table() -> str:
    """The markdown table, one row per config."""
    rows = [
        "| config (tests/fixtures/configs) | family | keys read | layers per kind | attention bytes/token "
        "| state per layer (shapes, dtypes) | state bytes (padded page) | attention block @64 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_name = {f.name: f for f in model_families()}
    for path in sorted(CONFIGS.glob("*.json")):
        raw = json.loads(path.read_text())
        text = raw.get("text_config", raw)
        layout = build_model_layout(str(path), block_size=BLOCK)
        family = by_name[layout.family]
        keys = [k for k in family.keys if k in raw or k in text]
        specs = list(layout.layer_specs.values())
        counts: Counter[str] = Counter()
        for spec in specs:
            if isinstance(spec, MambaSpec):
                counts[_STATE_NAMES.get(spec.mamba_type, spec.mamba_type)] += 1
            else:
                counts[_KIND_NAMES.get(type(spec).__name__, type(spec).__name__)] += 1
        layers = text.get("num_hidden_layers", raw.get("num_hidden_layers"))
        attention = [s for s in specs if not isinstance(s, MambaSpec)]
        per_token = {s.page_size_bytes // block_tokens_of(s) for s in attention}
        states = [s for s in specs if isinstance(s, MambaSpec)]
        if states:
            state = states[0]
            shapes = " + ".join(
                f"{'x'.join(map(str, shape))} {str(dtype).removeprefix('torch.')}"
                for shape, dtype in zip(state.shapes, state.dtypes, strict=True)
            )
            state_bytes = f"{state.unpadded_page_size_bytes:,} ({state.page_size_bytes:,})"
        else:
            shapes, state_bytes = "-", "-"
        kinds = ", ".join(f"{n} {k}" for k, n in counts.most_common())
        blocks = {s.block_size for s in attention}
        rows.append(
            f"| {path.stem} | {family.name} | {', '.join(f'`{k}`' for k in keys)} | {kinds} (of {layers} layers) "
            f"| {', '.join(f'{b:,}' for b in sorted(per_token))} | {shapes} | {state_bytes} "
            f"| {', '.join(str(b) for b in sorted(blocks))} |"
        )
    return "\n".join(rows) + "\n"


def document_with_table(document: str) -> str:
    head, rest = document.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}{END}{tail}"


def main() -> None:
    DOC.write_text(document_with_table(DOC.read_text()))


if __name__ == "__main__":
    main()
