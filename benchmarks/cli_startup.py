"""How long `kvspec --help` takes, against a bare Python start in the same run (median of N runs).

python -m benchmarks.cli_startup [--runs 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _median_seconds(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    kvspec = shutil.which("kvspec") or str(Path(sys.executable).parent / "kvspec")
    bare = _median_seconds([sys.executable, "-c", "pass"], args.runs)
    rows = [("python -c pass (baseline)", bare)]
    for cmd in (["--help"], ["plan", "--help"], ["simulate", "--help"]):
        rows.append((f"kvspec {' '.join(cmd)}", _median_seconds([kvspec, *cmd], args.runs)))
    rows.append(
        ("python -c 'import torch'", _median_seconds([sys.executable, "-c", "import torch"], args.runs))
    )
    print("| command | median s | / baseline |\n|---|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.3f} | {seconds / bare:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
