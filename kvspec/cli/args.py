"""Argument types shared by the ``kvspec`` sub-commands (sizes with units, positive counts)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvspec import errors as _errors

if TYPE_CHECKING:
    from kvspec.errors import InsufficientKVCacheMemoryError

#: What a command refuses before any work because of what was typed (options and their values, model,
#: plugins, paths, device, policies, tiers, routers, the fleet's cluster): exit 2 in every command, as
#: argparse's own refusals. Any other KVSpecError (a trace it cannot read, a cache too small) exits 1.
USAGE_ERRORS: tuple[type[Exception], ...] = (
    _errors.DeviceError,
    _errors.FleetConfigError,
    _errors.ModelConfigError,
    _errors.OptionError,
    _errors.OptionValueError,
    _errors.PlotPathError,
    _errors.PluginError,
    _errors.SchedulingError,
    _errors.UnknownEvictionPolicyError,
    _errors.UnknownModelFamilyError,
    _errors.UnknownRouterError,
    _errors.UnknownTierError,
)


def refuse(exc: Exception, message: str | None = None) -> int:
    """Say why a command stops (one line on stderr: ``message``, else the error's own, then the error's notes
    such as the sweep point it came from) and return its exit code: 2 for :data:`USAGE_ERRORS`, 1 for
    anything else."""
    notes = "".join(f" ({note})" for note in getattr(exc, "__notes__", ()))
    print(f"kvspec: error: {message or exc}{notes}", file=sys.stderr)
    return 2 if isinstance(exc, USAGE_ERRORS) else 1


_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_UNIT_NAMES = "units: B, KB, MB, GB, TB (powers of 10), KiB, MiB, GiB, TiB (powers of 2)"
_SIZE = re.compile(r"^\s*(-?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
#: The largest size accepted (1 EiB): anything larger is a typo, and floats past it lose whole bytes.
MAX_BYTES = 1 << 60


def parse_bytes(text: str) -> int:
    """'80GiB' -> 85899345920; accepts B, KB/MB/GB/TB (powers of 10) and KiB/MiB/GiB/TiB (powers of 2). A
    number without a unit is refused (the units named)."""
    match = _SIZE.match(text)
    if not match or match[2].lower() not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}; use e.g. 80GiB, 512MiB or 1e9B ({_UNIT_NAMES})"
        )
    if not match[2]:
        # A bare number is ambiguous (64 meant as GiB plans 64 bytes): the unit is required.
        raise argparse.ArgumentTypeError(
            f"size {text!r} has no unit; write e.g. {match[1]}GiB ({_UNIT_NAMES})"
        )
    value = float(match[1]) * _UNITS[match[2].lower()]
    if not value < MAX_BYTES:  # also catches inf (1e400) and nan
        raise argparse.ArgumentTypeError(f"size {text!r} is larger than 1 EiB; use e.g. 80GiB")
    if int(value) < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    return int(value)


def comma_list(text: str, example: str = "4,8") -> list[str]:
    """The comma-separated items of an option's value, stripped: one item or several, none empty (``4,``
    and ``4,,8`` are refused: a stray comma is a typo, not a list)."""
    items = [part.strip() for part in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(f"{text!r} names nothing; give one value or several, e.g. {example}")
    if not all(items):
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty item; separate values by single commas, e.g. {example}"
        )
    return items


def bounded_int(limit: int, what: str) -> Callable[[str], int]:
    """argparse type: an int in [1, limit]; past the limit the message says why (bounded work)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"{what} must be at most {limit:,}, got {value:,}")
        return value

    return parse


def positive_int(text: str) -> int:
    """argparse type: an int > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def block_size(text: str) -> int:
    """argparse type for ``--block-size`` in every command: tokens per block, a positive multiple of 16 (what
    vLLM's attention kernels take), at most 1 << 20."""
    value = bounded_int(1 << 20, "--block-size")(text)
    if value % 16:
        raise argparse.ArgumentTypeError(
            f"{value} is not a multiple of 16 tokens (vLLM's attention kernels take blocks of a multiple of 16)"
        )
    return value


def event_release(text: str) -> str:
    """argparse type: a vLLM release (``major.minor``) whose KV event wire format to use. Imports the release
    profiles only when an option is given, so ``--help`` stays light."""
    from kvspec.contracts.release import EVENT_RELEASES

    if text not in EVENT_RELEASES:
        raise argparse.ArgumentTypeError(
            f"expected a vLLM release ({', '.join(EVENT_RELEASES)}), got {text!r}"
        )
    return text


#: File types --plot can write (matplotlib's raster and vector formats kvspec documents).
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_path(path: str | None) -> None:
    """Refuse a --plot path before any work: a known suffix, an existing, writable folder, and matplotlib
    installed (PlotPathError)."""
    if path is None:
        return
    from kvspec.errors import PlotPathError

    if Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise PlotPathError(f"--plot {path!r}: use a file ending in {', '.join(PLOT_SUFFIXES)}.")
    check_output_path("--plot", path)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotPathError("--plot needs matplotlib: pip install 'kvspec[cli]'") from None


def check_output_path(option: str, path: str | None) -> None:
    """Refuse an output file (``--out``, ``--plot``) before any work: its folder exists and is writable,
    it is not a folder, and it can be opened for appending (PlotPathError naming ``option``). An existing
    file is left as it was; a new one is not left behind."""
    if path is None:
        return
    import os

    from kvspec.errors import PlotPathError

    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise PlotPathError(f"{option} {path!r} is a folder; name a file.")
    if not folder.is_dir():
        raise PlotPathError(f"{option} {path!r}: folder {str(folder)!r} does not exist.")
    if not os.access(folder, os.W_OK):
        raise PlotPathError(f"{option} {path!r}: folder {str(folder)!r} is not writable.")
    # os.access answers for root and for some file systems "writable" where a write then fails: open the
    # file the way the command will (leaving nothing behind if it did not exist), so a run of minutes never
    # ends in a traceback.
    existed = target.exists()
    try:
        with target.open("ab"):
            pass
    except OSError as exc:
        raise PlotPathError(f"{option} {path!r} cannot be written: {exc.strerror or exc}.") from None
    if not existed:
        target.unlink(missing_ok=True)


def human_bytes(num: float) -> str:
    """1536 -> '1.50 KiB' (binary units; whole bytes below 1 KiB)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num) < 1024 or unit == "TiB":
            return f"{num:.2f} {unit}" if unit != "B" else f"{int(num)} B"
        num /= 1024
    return f"{num:.2f} TiB"


def capacity_message(exc: InsufficientKVCacheMemoryError, flag: str, memory: int | None = None) -> str:
    """Why a budget does not hold one max-length request, in the command's own options (``flag``: the
    option that sets the budget; ``memory``: its value, to say what the pool holds back)."""
    held = ""
    if memory is not None and memory > exc.available_bytes >= 0:
        held = f" ({human_bytes(memory - exc.available_bytes)} of {human_bytes(memory)} held back for the null block the pool keeps)"
    fit = (
        f"pass --max-model-len {exc.estimated_max_model_len:,} (the longest that fits) or raise {flag}"
        if exc.estimated_max_model_len > 0
        else f"not even one token fits: raise {flag}"
    )
    return (
        f"one request of max_model_len {exc.max_model_len:,} tokens needs {human_bytes(exc.needed_bytes)} of KV "
        f"cache, but {flag} leaves {human_bytes(max(exc.available_bytes, 0))} for blocks{held}; {fit}."
    )


#: The options a kvspec layout file settles itself (it lists each layer's spec as one TP rank holds it).
LAYOUT_FILE_SETTLES = ("--dtype", "--kv-cache-dtype", "--block-size", "--tp")


def check_layout_options(layout: Any, given: Mapping[str, bool]) -> None:
    """Refuse (OptionError) an option that cannot apply to the model's layout (a ``ModelLayout``); ``given``
    maps each option of the command to whether the user gave it."""
    from kvspec.errors import OptionError

    if layout.model_type == "kvspec_layout":
        for flag in LAYOUT_FILE_SETTLES:
            if given.get(flag):
                raise OptionError(
                    f"{flag} does not apply to a layout file: it lists each layer's spec as one TP rank holds it"
                )
    if given.get("--assume-dense") and not layout.assumed_dense:
        planned = f"the {layout.family} family" if layout.family else "its layout file"
        raise OptionError(
            f"--assume-dense applies to a config.json of a model_type kvspec does not know; {layout.name} is "
            f"planned by {planned}"
        )
