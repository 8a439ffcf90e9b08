"""Runs ``kvspec`` command lines in one process under a memory limit and reports how each ended (for
test_bad_input_property.py): ``python -m tests.unit.cli.bad_input_worker LIMIT_BYTES < cases.json``.

Reads a JSON list of argv lists; prints one JSON object per case: the exit code, the seconds it took,
whether anything escaped ``main`` (an exception that is not SystemExit: a traceback), and the tail of stderr.
The data segment is capped at LIMIT_BYTES more than the process holds after importing kvspec and torch, so a
command that grows with its input fails with MemoryError (reported) instead of taking the machine."""

from __future__ import annotations

import contextlib
import io
import json
import resource
import sys
import time
import traceback


def _data_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    import torch  # noqa: F401  (before the cap: the import maps what every command needs)

    import kvspec.cli.simulate
    import kvspec.engine.replay  # noqa: F401
    from kvspec.cli.main import main as kvspec_main

    limit = int(sys.argv[1])
    cap = _data_bytes() + limit
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    cases = json.load(sys.stdin)
    for argv in cases:
        out, err = io.StringIO(), io.StringIO()
        escaped = ""
        start = time.monotonic()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = kvspec_main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            except BaseException:
                code = -1
                escaped = traceback.format_exc()
        seconds = time.monotonic() - start
        text = err.getvalue()
        print(
            json.dumps(
                {
                    "argv": argv,
                    "code": code,
                    "seconds": round(seconds, 3),
                    "escaped": escaped[-2000:],
                    "traceback_printed": "Traceback" in text or "Traceback" in out.getvalue(),
                    "said_why": "error:" in text or "Does not fit" in out.getvalue(),
                    "stderr": text[-300:],
                    "stdout": out.getvalue()[-500:],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
