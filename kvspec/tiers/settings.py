"""What tiers an engine runs with, as one value: :class:`TierSettings` (httpx-style settings object).

Sizes are bytes of memory (``parse_bytes`` reads "256GiB"); the engine turns them into blocks of the
model's largest group block (all layers of a group, vLLM's uniform offload chunk). ``offload`` names the
group families whose blocks go to the tiers (:data:`kvspec.tiers.connector.FAMILIES`); a model with a group
of a family left out gets no tier hits (the choice is stated, and reported).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvspec.errors import TierConfigError
from kvspec.tiers.connector import FAMILIES
from kvspec.tiers.transfer import HOST_LINK, POOL_LINK, TransferModel, parse_link


@dataclass(frozen=True, kw_only=True, slots=True)
class TierSettings:
    """``host_bytes``: host memory per instance (0: no host tier), run by the registered tier ``host_tier``
    with ``host_options`` (the built-in ``host``: ``policy`` "lru" | "arc", ``store_threshold``);
    ``pool_bytes``: a pool shared by every instance (0: none; one instance alone shares it with nobody), run
    by ``pool_tier`` with ``pool_options``; ``offload``: the families offloaded; the links' transfer models."""

    host_bytes: int = 0
    host_tier: str = "host"
    host_options: Mapping[str, str | float] = field(default_factory=dict)
    pool_bytes: int = 0
    pool_tier: str = "mooncake"
    pool_options: Mapping[str, str | float] = field(default_factory=dict)
    offload: tuple[str, ...] = FAMILIES
    host_link: TransferModel = HOST_LINK
    pool_link: TransferModel = POOL_LINK

    def __post_init__(self) -> None:
        for name in ("host_bytes", "pool_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise TierConfigError(f"TierSettings.{name} must be a byte count >= 0, got {value!r}.")
        unknown = [f for f in self.offload if f not in FAMILIES]
        if unknown or not self.offload:
            raise TierConfigError(
                f"TierSettings.offload must name one or more of {', '.join(FAMILIES)}, got {self.offload!r}."
            )

    @property
    def enabled(self) -> bool:
        return self.host_bytes > 0 or self.pool_bytes > 0


def tier_settings(
    *,
    host_bytes: int,
    pool_bytes: int,
    host_policy: str | None = None,
    store_threshold: int | None = None,
    offload: tuple[str, ...] | None = None,
    host_link: str = "default",
    pool_link: str = "default",
) -> TierSettings | None:
    """The settings the command line and a sweep point state: sizes in bytes (None without either), the
    built-in host tier's ``policy`` and ``store_threshold`` where given, the families (None: all), and the
    links as ``parse_link`` reads them. Bad values raise ``TierConfigError``."""
    if not host_bytes and not pool_bytes:
        return None
    options: dict[str, str | float] = {}
    if host_policy is not None:
        options["policy"] = host_policy
    if store_threshold is not None:
        options["store_threshold"] = store_threshold
    return TierSettings(
        host_bytes=host_bytes,
        host_options=options,
        pool_bytes=pool_bytes,
        offload=FAMILIES if offload is None else tuple(offload),
        host_link=parse_link(host_link, HOST_LINK),
        pool_link=parse_link(pool_link, POOL_LINK),
    )


__all__ = ["TierSettings", "tier_settings"]
