"""Transfer times between the GPU and a tier.

A :class:`TransferModel` states a link's bandwidth and per-transfer latency in each direction. The timed
replay charges loads inside the step that admits the request (vLLM's synchronous load: the request's
prefill waits for its blocks), and stores as overlapping the step's compute: a step lasts at least as long
as the stores of the blocks it computed. The defaults are illustrative orders of magnitude, not a
calibration: a host tier over PCIe 5.0 x16 (32 GB/s each way, 10 us per transfer) and a pool over RDMA
(25 GB/s, 50 us). Pass your own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kvspec.errors import TierConfigError


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


def parse_link(text: str, default: TransferModel) -> TransferModel:
    """``"default"`` -> ``default``; ``"GBPS"`` or ``"GBPS,US"`` -> a link of that bandwidth (both
    directions) and latency per transfer (microseconds; else ``default``'s). A ``TierConfigError`` names
    what it cannot read."""
    if text.strip() == "default":
        return default
    parts = [p.strip() for p in text.split(",")]
    try:
        if not 1 <= len(parts) <= 2:
            raise ValueError
        gbps = float(parts[0])
        latency = float(parts[1]) if len(parts) == 2 else default.load_latency_us
    except ValueError:
        raise TierConfigError(
            f"Cannot read the link {text!r}: give GB/s, or GB/s,latency-in-us (e.g. 32,10), or default."
        ) from None
    return TransferModel(
        load_gb_per_s=gbps, store_gb_per_s=gbps, load_latency_us=latency, store_latency_us=latency
    )


__all__ = ["HOST_LINK", "POOL_LINK", "TransferModel", "parse_link"]
