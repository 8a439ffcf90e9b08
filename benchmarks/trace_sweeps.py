"""Hit rate per eviction policy against KV memory on the Mooncake traces (docs/TRACES.md's tables and plots).

Runs ``kvspec simulate MODEL --trace FILE --sweep 5 --policy ... --json --plot`` for each trace and model
(one process each, one after the other) into ``--out`` (JSON and PNG per run), then prints the markdown
tables: per model and cache size, each policy's token hit rate, and which policy wins by how much.
``--from-json DIR`` formats runs made before (same file names) without running anything.

    python -m benchmarks.trace_sweeps --out /tmp/sweeps [--only conversation:gemma-3-27b,...]
        [--limit-conversation N] [--retention-interval dense]

Each run is one process; runs named by ``--only`` (TRACE:MODEL) let two cores share the work.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

TRACES = {
    "synthetic": "mooncake_synthetic_trace.jsonl",
    "conversation": "mooncake_conversation_trace.jsonl",
}
MODELS = {
    "llama-3.1-8b": "Llama 3.1 8B (full attention)",
    "gemma-3-27b": "Gemma 3 27B (5 sliding window : 1 full)",
    "jamba-1.5-mini": "Jamba 1.5 Mini (Mamba + full, 'align')",
}
POLICIES = "lru,lfu,slru,hybrid"


def run(
    out: Path,
    traces_dir: Path,
    limit_conversation: int | None,
    policies: str,
    only: set[str] | None = None,
    retention: str | None = None,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for trace, file in TRACES.items():
        for model in MODELS:
            if only is not None and f"{trace}:{model}" not in only:
                continue
            stem = out / f"{trace}_{model}"
            argv = [
                sys.executable,
                "-c",
                "import sys; from kvspec.cli import main; sys.exit(main())",
                "simulate",
                model,
                "--trace",
                str(traces_dir / file),
                "--sweep",
                "5",
                # The sweeps in docs/TRACES.md ran at 16-token blocks (the replay's default until
                # 2026-12-07); the commands now default to vLLM 0.34's 64.
                "--block-size",
                "16",
                "--policy",
                policies,
                "--json",
                "--plot",
                f"{stem}.png",
            ]
            if trace == "conversation" and limit_conversation:
                argv += ["--limit", str(limit_conversation)]
            if retention is not None:
                argv += ["--retention-interval", retention]
            with open(f"{stem}.json", "w") as sink:
                subprocess.run(argv, stdout=sink, check=True)
            print(f"done {trace} {model}", file=sys.stderr)


def tables(out: Path) -> str:
    lines: list[str] = []
    for trace in TRACES:
        for model, label in MODELS.items():
            path = out / f"{trace}_{model}.json"
            if not path.exists() or not path.stat().st_size:
                continue  # not run (yet)
            report: dict[str, Any] = json.loads(path.read_text())
            rows = report["sweep"]
            policies = list(dict.fromkeys(r["policy"] for r in rows))
            sizes = list(dict.fromkeys(r["num_blocks"] for r in rows))
            by = {(r["policy"], r["num_blocks"]): r for r in rows}
            retention = report.get("prefix_cache_retention_interval", "dense")
            caching = (
                "dense window and state caching (vLLM 0.23)"
                if retention == "dense"
                else f"retention interval {retention} (vLLM 0.34's plan)"
            )
            requests = rows[0]["requests"]
            lines.append(f"\n#### {trace} trace ({requests:,} requests), {label}, {caching}\n")
            lines.append(
                "| blocks | KV GiB | "
                + " | ".join(f"{p} tokens (blocks)" for p in policies)
                + " | best vs LRU |"
            )
            lines.append("|" + "---:|" * (len(policies) + 3))
            for size in sizes:
                cells = [
                    f"{by[(p, size)]['token_hit_rate']:.4f} ({by[(p, size)]['block_hit_rate']:.4f})"
                    for p in policies
                ]
                lru = by[("lru", size)]["token_hit_rate"] if ("lru", size) in by else None
                best = max(policies, key=lambda p: by[(p, size)]["token_hit_rate"])
                rate = by[(best, size)]["token_hit_rate"]
                if lru is None or rate <= lru:
                    verdict = "LRU (or a tie)"
                else:
                    verdict = (
                        f"{best} +{rate - lru:.4f} ({(rate / lru - 1) * 100 if lru else float('inf'):.1f}%)"
                    )
                gib = by[(policies[0], size)]["kv_cache_gib"]
                lines.append(f"| {size:,} | {gib:,} | " + " | ".join(cells) + f" | {verdict} |")
            seconds = {p: sum(by[(p, s)]["wall_seconds"] for s in sizes) for p in policies}
            lines.append(
                "\nReplay seconds (all five sizes): " + ", ".join(f"{p} {t:.0f}" for p, t in seconds.items())
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("trace-sweeps"))
    parser.add_argument(
        "--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces"
    )
    parser.add_argument(
        "--limit-conversation", type=int, default=0, help="replay the conversation trace's first N (0: all)"
    )
    parser.add_argument("--only", default=None, help="TRACE:MODEL runs, comma-separated (default: every one)")
    parser.add_argument(
        "--retention-interval", default=None, help="passed to kvspec simulate (default: vLLM 0.34's plan, 0)"
    )
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--from-json", type=Path, default=None, help="format the runs in DIR, run nothing")
    args = parser.parse_args(argv)
    if args.from_json is None:
        only = None if args.only is None else {name.strip() for name in args.only.split(",")}
        run(args.out, args.traces, args.limit_conversation, args.policies, only, args.retention_interval)
    print(tables(args.from_json or args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
