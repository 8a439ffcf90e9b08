"""The offload-tier options ``kvspec simulate --timed`` and ``kvspec fleet`` share (issue 38), and the
:class:`~kvspec.tiers.settings.TierSettings` they make."""

from __future__ import annotations

import argparse
from typing import Any

from kvspec.cli.args import comma_list, parse_bytes
from kvspec.cli.args import positive_int as _positive

#: The tier options: (flag, dest).
TIER_OPTIONS = (
    ("--host-memory", "host_memory"),
    ("--shared-pool", "shared_pool"),
    ("--host-policy", "host_policy"),
    ("--store-threshold", "store_threshold"),
    ("--offload", "offload"),
    ("--host-link", "host_link"),
    ("--pool-link", "pool_link"),
)


def _size(text: str) -> int:
    """A size, or 0 (none)."""
    return 0 if text.strip() in ("0", "none") else parse_bytes(text)


def _sizes(text: str) -> list[int]:
    return [_size(item) for item in comma_list(text, "0,64GiB,256GiB")]


def _families(text: str) -> tuple[str, ...]:
    from kvspec.tiers.connector import FAMILIES

    names = tuple(comma_list(text, "attention,mamba"))
    unknown = [n for n in names if n not in FAMILIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--offload {text!r}: name one or more of {', '.join(FAMILIES)} (comma-separated)"
        )
    return names


def add_tier_options(p: argparse.ArgumentParser, *, sweep: bool) -> None:
    """The tier options; with ``sweep`` (the fleet), ``--host-memory`` and ``--shared-pool`` take
    comma-separated lists (one fleet per size)."""
    group = p.add_argument_group(
        "offload tiers",
        "KV blocks below the GPU cache, as vLLM 0.34's CPU offloading and Mooncake Store keep them: hits "
        "they give are loaded (their transfer time charged), not computed" + ("" if sweep else " (--timed)"),
    )
    size_type = _sizes if sweep else _size
    group.add_argument(
        "--host-memory",
        type=size_type,
        default=None,
        metavar="BYTES" + ("[,...]" if sweep else ""),
        help="host memory per instance for offloaded KV blocks (e.g. 256GiB; 0: none)",
    )
    group.add_argument(
        "--shared-pool",
        type=size_type,
        default=None,
        metavar="BYTES" + ("[,...]" if sweep else ""),
        help="a pool every instance shares (Mooncake Store: approximate LRU, high-water mark 0.9), e.g. 3TiB",
    )
    group.add_argument(
        "--host-policy", choices=("lru", "arc"), default=None, help="the host tier's eviction (default lru)"
    )
    group.add_argument(
        "--store-threshold",
        type=_positive,
        default=None,
        help="store a block in host memory only once this many requests offered it (vLLM's; default 1)",
    )
    group.add_argument(
        "--offload",
        type=_families,
        default=None,
        metavar="FAMILY[,...]",
        help="group families offloaded: full, window, state (default all; a family left out gets no tier hit)",
    )
    group.add_argument(
        "--host-link",
        default=None,
        metavar="GBPS[,US]",
        help="host <-> GPU bandwidth (GB/s) and latency per transfer (us); default 32,10",
    )
    group.add_argument(
        "--pool-link",
        default=None,
        metavar="GBPS[,US]",
        help="pool <-> GPU bandwidth and latency; default 25,50",
    )


def given_tier_options(args: argparse.Namespace) -> list[str]:
    """The tier flags given on the command line."""
    return [flag for flag, dest in TIER_OPTIONS if getattr(args, dest, None) is not None]


def check_tier_options(args: argparse.Namespace) -> None:
    """Refuse a tier option that cannot apply (``OptionError`` naming it and what it needs): any of them
    without host memory or a pool, the host tier's own without host memory, ``--pool-link`` without a
    pool. Sizes may be one value or a fleet's list; 0 is none."""
    from kvspec.errors import OptionError

    def any_size(value: int | list[int] | None) -> bool:
        return any(value) if isinstance(value, list) else bool(value)

    host, pool = any_size(args.host_memory), any_size(args.shared_pool)
    given = given_tier_options(args)
    if given and not (host or pool):
        raise OptionError(
            f"{given[0]} sets up offload tiers: add --host-memory and/or --shared-pool (a size > 0)"
        )
    for flag, dest in (
        ("--host-policy", "host_policy"),
        ("--store-threshold", "store_threshold"),
        ("--host-link", "host_link"),
    ):
        if getattr(args, dest) is not None and not host:
            raise OptionError(f"{flag} sets the host tier: add --host-memory (a size > 0)")
    if args.pool_link is not None and not pool:
        raise OptionError("--pool-link sets the shared pool's link: add --shared-pool (a size > 0)")


def tier_settings(args: argparse.Namespace) -> Any:
    """The :class:`~kvspec.tiers.settings.TierSettings` of one run (single sizes), or None when no tier
    memory is given. Bad values raise ``TierConfigError``."""
    from kvspec.tiers.settings import tier_settings as settings_of

    return settings_of(
        host_bytes=args.host_memory or 0,
        pool_bytes=args.shared_pool or 0,
        host_policy=args.host_policy,
        store_threshold=args.store_threshold,
        offload=args.offload,
        host_link=args.host_link or "default",
        pool_link=args.pool_link or "default",
    )


__all__ = ["TIER_OPTIONS", "add_tier_options", "check_tier_options", "given_tier_options", "tier_settings"]
