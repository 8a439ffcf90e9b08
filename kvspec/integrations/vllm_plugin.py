"""kvspec as a vLLM plugin: ``vllm serve`` (or any vLLM engine) on kvspec's KV cache, switched on by one variable.

vLLM calls every ``vllm.general_plugins`` entry point once in each of its processes (the API server, the
engine core, the workers) before its Scheduler is built; kvspec's entry point is :func:`register`. Being
installed changes nothing: unless ``KVSPEC_VLLM`` switches it on, ``register`` returns at once and vLLM runs
its own manager. Switched on, it

- reads the settings below from the environment and refuses wrong ones at engine start, in one line
  (a :class:`~kvspec.errors.VllmPluginSettingsError`);
- installs kvspec's adapter for the installed vLLM release (``kvspec.integrations.vllm_kv_cache_manager``:
  0.23, 0.32 or 0.34's interface), with the eviction policy and the default retention;
- makes vLLM's request validation check ``vllm_xargs={"kv_retention_seconds": S}`` (the OpenAI API's
  per-request retention), so a bad value is a 400 naming the field, not an engine failure;
- logs one line, where the adapter is built, saying that kvspec manages the KV cache, under which release
  profile and which policy.

Settings (environment variables; :data:`SETTINGS` is this table as data, docs/SERVE.md shows it):

=================================  ========  ===========================================================
``KVSPEC_VLLM``                    off       ``1``/``true``/``yes``/``on``: kvspec manages the KV cache
``KVSPEC_VLLM_EVICTION``           ``lru``   the eviction policy (``kvspec.eviction``: lru, lfu, slru,
                                             retention, hybrid, or a plugin's registered name)
``KVSPEC_VLLM_RETENTION_SECONDS``  none      the retention of requests that name none (``retention``)
``KVSPEC_VLLM_STRICT``             off       ``1``: refuse a vLLM release kvspec was not checked against
``KVSPEC_VLLM_IMPORTS``            none      modules to import first (comma-separated): plugins that
                                             register specs or eviction policies
=================================  ========  ===========================================================

Importing this module imports neither vLLM nor the adapter; ``register`` does, when switched on.
"""

from __future__ import annotations

import importlib
import logging
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvspec.contracts.release import PROFILES
from kvspec.errors import KVSpecError, VllmPluginSettingsError
from kvspec.integrations.vllm_retention import RETENTION_XARG, parse_retention_seconds

#: The vLLM releases kvspec's adapters were checked against, block for block (docs/SERVE.md).
CHECKED_VLLM_RELEASES: Final = tuple(
    p.vllm_version for p in sorted(PROFILES.values(), key=lambda p: p.release)
)

#: The built-in eviction policies that ignore a request's retention (only ``retention`` weighs it).
_POLICIES_WITHOUT_RETENTION: Final = frozenset({"lru", "lfu", "slru", "hybrid"})

_ON: Final = frozenset({"1", "true", "yes", "on"})
_OFF: Final = frozenset({"", "0", "false", "no", "off"})


@dataclass(frozen=True, kw_only=True)
class PluginSetting:
    """One environment variable the plugin reads: its name, its default (as written) and what it does."""

    variable: str
    default: str
    meaning: str


#: Every variable the plugin reads, in the order the README's table lists them.
SETTINGS: Final = (
    PluginSetting(
        variable="KVSPEC_VLLM",
        default="off",
        meaning="`1`, `true`, `yes` or `on`: kvspec manages the KV cache; unset, `0`, `false`, `no` or `off`: "
        "stock vLLM",
    ),
    PluginSetting(
        variable="KVSPEC_VLLM_EVICTION",
        default="lru",
        meaning="the eviction policy: `lru` (vLLM's order), `lfu`, `slru`, `retention` (priorities and "
        "retention times), `hybrid`, or a name a plugin registered",
    ),
    PluginSetting(
        variable="KVSPEC_VLLM_RETENTION_SECONDS",
        default="none",
        meaning="the retention of a request that names none (seconds >= 0; needs `retention`)",
    ),
    PluginSetting(
        variable="KVSPEC_VLLM_STRICT",
        default="off",
        meaning="`1`: refuse to start on a vLLM release kvspec was not checked against (0.23.0, 0.32.0, "
        "0.34.0); off: use the nearest release's profile",
    ),
    PluginSetting(
        variable="KVSPEC_VLLM_IMPORTS",
        default="none",
        meaning="comma-separated modules imported first: plugins that register specs or eviction policies",
    ),
)


@dataclass(frozen=True, kw_only=True)
class VllmPluginSettings:
    """The plugin's settings, read from the environment by :meth:`from_environ` (see :data:`SETTINGS`).

    ``default_retention_seconds``: seconds (None: requests without their own retention have none)."""

    enabled: bool = False
    eviction_policy: str = "lru"
    default_retention_seconds: float | None = None
    strict_release: bool = False
    imports: tuple[str, ...] = ()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> VllmPluginSettings:
        """The settings ``environ`` (default ``os.environ``) gives; a ``VllmPluginSettingsError`` naming the
        variable, the value and what it accepts otherwise. Switched off, the other variables are not read."""
        env = os.environ if environ is None else environ
        enabled = _switch(env, "KVSPEC_VLLM")
        if not enabled:
            return cls()
        policy = env.get("KVSPEC_VLLM_EVICTION", "").strip() or "lru"
        retention_text = env.get("KVSPEC_VLLM_RETENTION_SECONDS", "").strip()
        retention: float | None = None
        if retention_text and retention_text.lower() != "none":
            try:
                retention = parse_retention_seconds(float(retention_text))
            except ValueError:
                raise VllmPluginSettingsError(
                    f"KVSPEC_VLLM_RETENTION_SECONDS={retention_text!r}: expected a number of seconds >= 0."
                ) from None
        imports = tuple(
            name.strip() for name in env.get("KVSPEC_VLLM_IMPORTS", "").split(",") if name.strip()
        )
        settings = cls(
            enabled=True,
            eviction_policy=policy,
            default_retention_seconds=retention,
            strict_release=_switch(env, "KVSPEC_VLLM_STRICT"),
            imports=imports,
        )
        if retention is not None and policy in _POLICIES_WITHOUT_RETENTION:
            raise VllmPluginSettingsError(
                f"KVSPEC_VLLM_RETENTION_SECONDS={retention_text!r} has no effect under "
                f"KVSPEC_VLLM_EVICTION={policy!r}: set KVSPEC_VLLM_EVICTION=retention."
            )
        return settings

    def check(self, vllm_version: str | None) -> None:
        """Refuse, in one line, what would fail later: an import that fails, an unknown policy, a release not
        checked while ``strict_release`` (``vllm_version`` None: no release to check)."""
        from kvspec.eviction import resolve_eviction_policy

        for module in self.imports:
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise VllmPluginSettingsError(
                    f"KVSPEC_VLLM_IMPORTS: importing {module!r} failed ({type(exc).__name__}: {exc})."
                ) from exc
        try:
            resolve_eviction_policy(self.eviction_policy)
        except KVSpecError as exc:
            raise VllmPluginSettingsError(f"KVSPEC_VLLM_EVICTION={self.eviction_policy!r}: {exc}") from None
        if self.strict_release and vllm_version is not None and vllm_version not in CHECKED_VLLM_RELEASES:
            raise VllmPluginSettingsError(
                f"KVSPEC_VLLM_STRICT=1: vLLM {vllm_version} is not a release kvspec was checked against "
                f"({', '.join(CHECKED_VLLM_RELEASES)}); install one of those, or unset KVSPEC_VLLM_STRICT to "
                "run it under the nearest release's profile."
            )

    def check_request_args(self, extra_args: Mapping[str, Any] | None) -> None:
        """Refuse a request's ``vllm_xargs`` retention kvspec cannot honour: not a number of seconds >= 0, or
        under a built-in policy that ignores retention. Raises ``ValueError`` whose text names the field."""
        if not extra_args or RETENTION_XARG not in extra_args:
            return
        parse_retention_seconds(extra_args[RETENTION_XARG])
        if self.eviction_policy in _POLICIES_WITHOUT_RETENTION:
            raise ValueError(
                f"{RETENTION_XARG} needs the server's eviction policy to be 'retention' "
                f"(KVSPEC_VLLM_EVICTION); this server evicts by {self.eviction_policy!r}, which ignores it"
            )


def _switch(env: Mapping[str, str], variable: str) -> bool:
    value = env.get(variable, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise VllmPluginSettingsError(
        f"{variable}={env.get(variable)!r}: expected 1, true, yes or on (or 0, false, no, off, unset)."
    )


def _logger() -> logging.Logger:
    # Under vLLM's logger so that VLLM_LOGGING_LEVEL and its handlers apply.
    return logging.getLogger("vllm.kvspec")


def register(environ: Mapping[str, str] | None = None) -> VllmPluginSettings:
    """vLLM's ``vllm.general_plugins`` entry point: install kvspec's adapter when ``KVSPEC_VLLM`` says so.

    Returns the settings read. Switched off it touches nothing (vLLM is not even imported). Switched on,
    wrong settings raise a ``VllmPluginSettingsError`` here, at engine start (vLLM does not catch a plugin's
    error), before any request runs. Safe to call more than once in a process."""
    settings = VllmPluginSettings.from_environ(environ)
    if not settings.enabled:
        ignored = ignored_settings(environ)
        if ignored:
            # A setting that does nothing would otherwise read as applied (once per process: Python's
            # default warning filter shows a warning once per place).
            warnings.warn(
                f"{', '.join(ignored)} set but KVSPEC_VLLM is off: vLLM runs its own KV cache manager and "
                f"kvspec reads none of them; set KVSPEC_VLLM=1, or unset {'them' if len(ignored) > 1 else 'it'}.",
                KVSpecSettingsWarning,
                stacklevel=2,
            )
        return settings
    vllm_version = str(importlib.import_module("vllm").__version__)
    settings.check(vllm_version)
    from kvspec.integrations import vllm_kv_cache_manager as adapters

    adapters.install(
        eviction_policy=None if settings.eviction_policy == "lru" else settings.eviction_policy,
        default_retention_seconds=settings.default_retention_seconds,
        announce=_announce,
    )
    _check_request_args_in_vllm(settings)
    return settings


class KVSpecSettingsWarning(UserWarning):
    """A ``KVSPEC_VLLM_*`` setting that does nothing because ``KVSPEC_VLLM`` is off."""


def ignored_settings(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The plugin's variables set (non-empty) in ``environ`` that do nothing because ``KVSPEC_VLLM`` is
    off; empty when it is on."""
    env = os.environ if environ is None else environ
    if _switch(env, "KVSPEC_VLLM"):
        return ()
    return tuple(s.variable for s in SETTINGS[1:] if env.get(s.variable, "").strip())


def _announce(manager: Any) -> None:
    _logger().info("%s", manager.describe())


def _check_request_args_in_vllm(settings: VllmPluginSettings) -> None:
    """Make vLLM's ``SamplingParams`` validation (run where the API server builds a request) refuse a bad
    retention with vLLM's own validation error, which its server answers with a 400 naming the field."""
    sampling = importlib.import_module("vllm.sampling_params").SamplingParams
    exceptions = importlib.import_module("vllm.exceptions")
    original = sampling._verify_args
    original = getattr(original, "__kvspec_original__", original)

    def _verify_args(self: Any) -> None:
        original(self)
        try:
            settings.check_request_args(self.extra_args)
        except ValueError as exc:
            raise exceptions.VLLMValidationError(
                str(exc), parameter=f"vllm_xargs.{RETENTION_XARG}", value=self.extra_args.get(RETENTION_XARG)
            ) from None

    setattr(_verify_args, "__kvspec_original__", original)  # noqa: B010 (a function's own attribute)
    sampling._verify_args = _verify_args


def active_settings(environ: Mapping[str, str] | None = None) -> VllmPluginSettings | None:
    """The settings a vLLM started in this environment would run kvspec with (None: switched off); for
    ``kvspec inspect``. Raises what ``register`` would raise for wrong settings (without vLLM's release check)."""
    settings = VllmPluginSettings.from_environ(environ)
    if not settings.enabled:
        return None
    settings.check(None)
    return settings


__all__ = [
    "CHECKED_VLLM_RELEASES",
    "KVSpecSettingsWarning",
    "ignored_settings",
    "SETTINGS",
    "PluginSetting",
    "VllmPluginSettings",
    "active_settings",
    "register",
]
