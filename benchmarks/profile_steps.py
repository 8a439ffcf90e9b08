"""Where kvspec's per-step time goes: the W1/W2 scheduler loop of ``vs_vllm`` (kvspec alone) under pyinstrument.

Run: ``python -m benchmarks.profile_steps [--model full32|hybrid48] [--quick] [--top N]`` with pyinstrument
installed (``pip install pyinstrument``). Prints the functions with the most self time (sampled, so the
figures are shares of the run, not exact counts). In the compiled build the compiled modules are invisible
to a Python profiler: their time is charged to the Python frame that called them, which is itself a
finding (what is left in Python).
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("KVSPEC_TYPECHECK", "api")


def self_times(frame: Any, out: dict[tuple[str, str], float]) -> None:
    """Self time per (function, file:line) over the frame tree (pyinstrument's Frame objects). Time in
    built-ins ("len", "dict.get") and pyinstrument's "[self]" nodes is charged to the nearest Python
    caller, so a kvspec function's figure includes the built-ins it calls."""
    stack = [frame]
    while stack:
        node = stack.pop()
        owner = node
        while owner.parent is not None and (
            str(owner.function).startswith("[") or str(owner.file_path_short).startswith("<")
        ):
            owner = owner.parent
        key = (str(owner.function), f"{owner.file_path_short}:{owner.line_no}")
        out[key] += float(node.total_self_time)
        stack.extend(node.children)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", choices=["full32", "hybrid48"], default="full32")
    parser.add_argument("--quick", action="store_true", help="64 requests instead of 256")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    from pyinstrument import Profiler

    import kvspec
    from benchmarks.vs_vllm import KvspecAdapter, drive, make_prompts

    blocks = 8192 if args.model == "full32" else 32768
    prompts = make_prompts(64 if args.quick else 256, 2048, 1024)
    adapter = KvspecAdapter()
    drive(adapter, args.model, blocks, prompts)  # warm-up: imports, first-use caches
    profiler = Profiler(interval=0.0002)
    profiler.start()
    result = drive(adapter, args.model, blocks, prompts)
    profiler.stop()
    session = profiler.last_session
    assert session is not None
    root = session.root_frame()
    assert root is not None
    times: dict[tuple[str, str], float] = defaultdict(float)
    self_times(root, times)
    ours = {key: t for key, t in times.items() if key[1].startswith("kvspec")}
    total = sum(ours.values())
    print(
        f"kvspec {kvspec.__version__} ({kvspec.__build__} build), {args.model}: {len(result.step_times)} "
        f"steps; {total * 1e3:.1f} ms sampled in kvspec's Python frames (the driver left out; "
        "profiling slows calls, so read shares, not times)"
    )
    print("\n| self time | share of kvspec | function | where |\n|---|---|---|---|")
    for (function, where), seconds in sorted(ours.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {seconds * 1e3:.1f} ms | {seconds / total:.1%} | {function} | {where} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
