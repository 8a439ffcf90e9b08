"""Transfer times between the GPU and a tier, and byte sizes as users write them.

A :class:`TransferModel` states a link's bandwidth and per-transfer latency in each direction. The timed
replay charges loads inside the step that admits the request (vLLM's synchronous load: the request's
prefill waits for its blocks), and stores as overlapping the step's compute: a step lasts at least as long
as the stores of the blocks it computed. The defaults are illustrative orders of magnitude, not a
calibration: a host tier over PCIe 5.0 x16 (32 GB/s each way, 10 us per transfer) and a pool over RDMA
(25 GB/s, 50 us). Pass your own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from kvspec.errors import TierConfigError

_UNITS: Final = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int) -> int:
    """``"256GiB"``, ``"3TiB"``, ``"1.5TB"``, ``"0"`` or an int -> bytes. A ``TierConfigError`` names a
    size it cannot read."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise TierConfigError(f"A size in bytes cannot be negative, got {text}.")
        return text
    found = _SIZE.match(str(text))
    unit = _UNITS.get(found.group(2).lower()) if found else None
    if found is None or unit is None:
        raise TierConfigError(
            f"Cannot read {text!r} as a size: write a number and one of B, KB, MB, GB, TB, KiB, MiB, GiB, "
            "TiB (e.g. 256GiB)."
        )
    return int(float(found.group(1)) * unit)


@dataclass(frozen=True, kw_only=True, slots=True)
class TransferModel:
    """A link between the GPU and a tier: gigabytes (10**9 bytes) per second and microseconds per
    transfer, per direction (load: tier -> GPU; store: GPU -> tier)."""

    load_gb_per_s: float = 32.0
    store_gb_per_s: float = 32.0
    load_latency_us: float = 10.0
    store_latency_us: float = 10.0

    def __post_init__(self) -> None:
        for name in ("load_gb_per_s", "store_gb_per_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise TierConfigError(f"TransferModel.{name} must be a positive number, got {value!r}.")
        for name in ("load_latency_us", "store_latency_us"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise TierConfigError(f"TransferModel.{name} must be a number >= 0, got {value!r}.")

    def load_ms(self, num_bytes: int) -> float:
        """Milliseconds to load ``num_bytes`` in one transfer (0 for none)."""
        if num_bytes <= 0:
            return 0.0
        return self.load_latency_us / 1000.0 + num_bytes / (self.load_gb_per_s * 1e6)

    def store_ms(self, num_bytes: int) -> float:
        """Milliseconds to store ``num_bytes`` in one transfer (0 for none)."""
        if num_bytes <= 0:
            return 0.0
        return self.store_latency_us / 1000.0 + num_bytes / (self.store_gb_per_s * 1e6)


#: The defaults of a host tier and of a shared pool.
HOST_LINK: Final = TransferModel()
POOL_LINK: Final = TransferModel(
    load_gb_per_s=25.0, store_gb_per_s=25.0, load_latency_us=50.0, store_latency_us=50.0
)


__all__ = ["HOST_LINK", "POOL_LINK", "TransferModel", "parse_bytes"]
