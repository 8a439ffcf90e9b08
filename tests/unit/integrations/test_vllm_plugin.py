"""The vLLM plugin (kvspec.integrations.vllm_plugin) without vLLM: settings from the environment, the switch,
the door checks, and what ``register`` installs, against a stand-in of the vLLM modules it touches.

The plugin inside vLLM's real server is tests/vllm_serve (``nox -s vllm_serve``)."""

from __future__ import annotations

import math
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from kvspec.blocks.hashing import BlockHasher
from kvspec.blocks.pool import block_use
from kvspec.errors import KVSpecError, VllmPluginSettingsError
from kvspec.integrations import vllm_kv_cache_manager as adapters
from kvspec.integrations.vllm_plugin import (
    CHECKED_VLLM_RELEASES,
    SETTINGS,
    VllmPluginSettings,
    active_settings,
    register,
)
from kvspec.integrations.vllm_request_view import VllmRequestView
from kvspec.integrations.vllm_retention import RETENTION_XARG, parse_retention_seconds

# -- settings ---------------------------------------------------------------------------------------


def test_off_unless_switched_on() -> None:
    for env in (
        {},
        {"KVSPEC_VLLM": ""},
        {"KVSPEC_VLLM": "0"},
        {"KVSPEC_VLLM": "false"},
        {"KVSPEC_VLLM": "Off"},
    ):
        assert VllmPluginSettings.from_environ(env) == VllmPluginSettings(), env
        assert not VllmPluginSettings.from_environ(env).enabled
    # Switched off, the other variables are not read: a wrong one does not stop stock vLLM.
    off = VllmPluginSettings.from_environ(
        {"KVSPEC_VLLM_EVICTION": "nope", "KVSPEC_VLLM_RETENTION_SECONDS": "x"}
    )
    assert not off.enabled
    assert active_settings({}) is None


def test_on_with_each_setting() -> None:
    for word in ("1", "true", "YES", " on "):
        assert VllmPluginSettings.from_environ({"KVSPEC_VLLM": word}).enabled, word
    settings = VllmPluginSettings.from_environ(
        {
            "KVSPEC_VLLM": "1",
            "KVSPEC_VLLM_EVICTION": "retention",
            "KVSPEC_VLLM_RETENTION_SECONDS": "600",
            "KVSPEC_VLLM_STRICT": "1",
            "KVSPEC_VLLM_IMPORTS": "json, math,,",
        }
    )
    assert settings == VllmPluginSettings(
        enabled=True,
        eviction_policy="retention",
        default_retention_seconds=600.0,
        strict_release=True,
        imports=("json", "math"),
    )
    defaults = VllmPluginSettings.from_environ({"KVSPEC_VLLM": "1"})
    assert (defaults.eviction_policy, defaults.default_retention_seconds, defaults.strict_release) == (
        "lru",
        None,
        False,
    )


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"KVSPEC_VLLM": "maybe"}, "KVSPEC_VLLM='maybe'"),
        ({"KVSPEC_VLLM": "1", "KVSPEC_VLLM_STRICT": "2"}, "KVSPEC_VLLM_STRICT='2'"),
        ({"KVSPEC_VLLM": "1", "KVSPEC_VLLM_RETENTION_SECONDS": "-5"}, "KVSPEC_VLLM_RETENTION_SECONDS='-5'"),
        ({"KVSPEC_VLLM": "1", "KVSPEC_VLLM_RETENTION_SECONDS": "ten"}, "KVSPEC_VLLM_RETENTION_SECONDS='ten'"),
        ({"KVSPEC_VLLM": "1", "KVSPEC_VLLM_RETENTION_SECONDS": "inf"}, "KVSPEC_VLLM_RETENTION_SECONDS='inf'"),
        # A default retention under a policy that ignores it would be silently dropped.
        ({"KVSPEC_VLLM": "1", "KVSPEC_VLLM_RETENTION_SECONDS": "60"}, "KVSPEC_VLLM_EVICTION=retention"),
        (
            {"KVSPEC_VLLM": "1", "KVSPEC_VLLM_EVICTION": "lfu", "KVSPEC_VLLM_RETENTION_SECONDS": "60"},
            "under KVSPEC_VLLM_EVICTION='lfu'",
        ),
    ],
)
def test_wrong_settings_are_one_line_naming_the_variable(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(VllmPluginSettingsError) as failure:
        VllmPluginSettings.from_environ(env)
    message = str(failure.value)
    assert fragment in message, message
    assert "\n" not in message
    assert issubclass(VllmPluginSettingsError, KVSpecError) and issubclass(
        VllmPluginSettingsError, ValueError
    )


def test_check_refuses_unknown_policy_failed_import_and_unchecked_release() -> None:
    with pytest.raises(
        VllmPluginSettingsError, match=r"KVSPEC_VLLM_EVICTION='nope': Unknown eviction policy"
    ):
        VllmPluginSettings(enabled=True, eviction_policy="nope").check("0.32.0")
    with pytest.raises(
        VllmPluginSettingsError, match=r"KVSPEC_VLLM_IMPORTS: importing 'no_such_kvspec_plugin'"
    ):
        VllmPluginSettings(enabled=True, imports=("no_such_kvspec_plugin",)).check("0.32.0")
    strict = VllmPluginSettings(enabled=True, strict_release=True)
    with pytest.raises(VllmPluginSettingsError, match=r"vLLM 0\.33\.1 is not a release kvspec was checked"):
        strict.check("0.33.1")
    for release in CHECKED_VLLM_RELEASES:
        strict.check(release)
    VllmPluginSettings(enabled=True).check("0.33.1")  # not strict: the nearest release's profile
    VllmPluginSettings(enabled=True, eviction_policy="lfu").check(None)
    with pytest.raises(VllmPluginSettingsError):
        active_settings({"KVSPEC_VLLM": "1", "KVSPEC_VLLM_EVICTION": "nope"})


def test_settings_table_lists_every_variable_read() -> None:
    import inspect

    from kvspec.integrations import vllm_plugin

    source = inspect.getsource(vllm_plugin.VllmPluginSettings.from_environ)
    read = {
        name
        for name in (
            "KVSPEC_VLLM_EVICTION",
            "KVSPEC_VLLM_RETENTION_SECONDS",
            "KVSPEC_VLLM_STRICT",
            "KVSPEC_VLLM_IMPORTS",
        )
        if name in source
    }
    assert {s.variable for s in SETTINGS} == {"KVSPEC_VLLM", *read}
    assert len(read) == 4
    with open("docs/SERVE.md", encoding="utf-8") as serve:
        text = serve.read()
    for setting in SETTINGS:
        assert f"`{setting.variable}`" in text, f"docs/SERVE.md's settings table lacks {setting.variable}"


# -- a request's retention ------------------------------------------------------------------------


def test_parse_retention() -> None:
    assert parse_retention_seconds(600) == 600.0
    assert parse_retention_seconds(0) == 0.0
    assert parse_retention_seconds(2.5) == 2.5
    for bad in (-1, -0.5, math.inf, math.nan, True, "600", None, [600]):
        with pytest.raises(ValueError, match=RETENTION_XARG):
            parse_retention_seconds(bad)


def test_request_args_checked_against_the_policy() -> None:
    retention = VllmPluginSettings(enabled=True, eviction_policy="retention")
    retention.check_request_args(None)
    retention.check_request_args({})
    retention.check_request_args({"other": 1})
    retention.check_request_args({RETENTION_XARG: 600})
    with pytest.raises(ValueError, match="finite number of seconds >= 0, got -1"):
        retention.check_request_args({RETENTION_XARG: -1})
    for policy in ("lru", "lfu", "slru", "hybrid"):
        with pytest.raises(ValueError, match=f"evicts by '{policy}', which ignores it"):
            VllmPluginSettings(enabled=True, eviction_policy=policy).check_request_args({RETENTION_XARG: 600})
    # A plugin's policy may weigh retention: not refused.
    VllmPluginSettings(enabled=True, eviction_policy="acme.pins").check_request_args({RETENTION_XARG: 600})


class _Params:
    def __init__(self, extra_args: dict[str, Any] | None) -> None:
        self.extra_args = extra_args


class _Request:
    def __init__(self, extra_args: dict[str, Any] | None, priority: int = 0) -> None:
        self.request_id = "r"
        self.sampling_params = _Params(extra_args)
        self.priority = priority


def test_the_view_reads_retention_and_priority_into_block_use() -> None:
    hasher = BlockHasher(16)
    own = VllmRequestView(_Request({RETENTION_XARG: 600}, priority=3), hasher, 30.0)
    assert own.retention_seconds == 600.0
    use = block_use(own)
    assert (use.retention_seconds, use.priority) == (600.0, 3)
    assert VllmRequestView(_Request(None), hasher, 30.0).retention_seconds == 30.0
    assert VllmRequestView(_Request({"x": 1}), hasher).retention_seconds is None
    # A bad value that slipped past the server counts as the default, never fails a step.
    assert VllmRequestView(_Request({RETENTION_XARG: "soon"}), hasher, 5.0).retention_seconds == 5.0
    pooling = _Request(None)
    pooling.sampling_params = None  # type: ignore[assignment]
    assert VllmRequestView(pooling, hasher, 7.0).retention_seconds == 7.0


# -- register ---------------------------------------------------------------------------------------


class _ValidationError(ValueError):
    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value


class _SamplingParams:
    verified = 0

    def __init__(self, extra_args: dict[str, Any] | None = None) -> None:
        self.extra_args = extra_args
        self._verify_args()

    def _verify_args(self) -> None:
        type(self).verified += 1


class _StockManager:
    pass


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, types.ModuleType]]:
    """Stand-ins for the vLLM modules the plugin touches (version 0.32.0)."""
    modules: dict[str, types.ModuleType] = {}
    for name in (
        "vllm",
        "vllm.v1",
        "vllm.v1.core",
        "vllm.v1.core.sched",
        "vllm.v1.core.sched.scheduler",
        "vllm.v1.core.kv_cache_manager",
        "vllm.sampling_params",
        "vllm.exceptions",
    ):
        modules[name] = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, modules[name])
    modules["vllm"].__version__ = "0.32.0"  # type: ignore[attr-defined]
    modules["vllm.v1.core.sched.scheduler"].KVCacheManager = _StockManager  # type: ignore[attr-defined]
    modules["vllm.v1.core.kv_cache_manager"].KVCacheManager = _StockManager  # type: ignore[attr-defined]
    params = type("SamplingParams", (_SamplingParams,), {})
    modules["vllm.sampling_params"].SamplingParams = params  # type: ignore[attr-defined]
    modules["vllm.exceptions"].VLLMValidationError = _ValidationError  # type: ignore[attr-defined]
    yield modules
    adapters.uninstall()


def test_a_setting_without_kvspec_vllm_is_warned_about(fake_vllm: dict[str, types.ModuleType]) -> None:
    """Issue 51: KVSPEC_VLLM_EVICTION set without KVSPEC_VLLM said nothing; it does nothing."""
    from kvspec.integrations.vllm_plugin import KVSpecSettingsWarning, ignored_settings

    env = {"KVSPEC_VLLM_EVICTION": "lfu", "KVSPEC_VLLM_STRICT": "1", "KVSPEC_VLLM_IMPORTS": " "}
    assert ignored_settings(env) == ("KVSPEC_VLLM_EVICTION", "KVSPEC_VLLM_STRICT")
    with pytest.warns(
        KVSpecSettingsWarning, match=r"KVSPEC_VLLM_EVICTION, KVSPEC_VLLM_STRICT set but KVSPEC_VLLM is off"
    ):
        assert not register(env).enabled
    assert not adapters.installed()
    assert ignored_settings({**env, "KVSPEC_VLLM": "1"}) == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        register({})  # nothing set: no warning


def test_register_switched_off_touches_nothing(fake_vllm: dict[str, types.ModuleType]) -> None:
    settings = register({})
    assert not settings.enabled
    assert not adapters.installed()
    assert fake_vllm["vllm.v1.core.sched.scheduler"].KVCacheManager is _StockManager
    params = fake_vllm["vllm.sampling_params"].SamplingParams
    params({RETENTION_XARG: -1})  # stock vLLM ignores the key


def test_register_switched_on_installs_the_release_adapter(fake_vllm: dict[str, types.ModuleType]) -> None:
    register({"KVSPEC_VLLM": "1", "KVSPEC_VLLM_EVICTION": "retention", "KVSPEC_VLLM_RETENTION_SECONDS": "30"})
    assert adapters.installed()
    for name in ("vllm.v1.core.sched.scheduler", "vllm.v1.core.kv_cache_manager"):
        installed = fake_vllm[name].KVCacheManager
        assert installed is not _StockManager
        assert issubclass(installed, adapters.Vllm032KVCacheManager), installed.__mro__
    params = fake_vllm["vllm.sampling_params"].SamplingParams
    before = params.verified
    params({RETENTION_XARG: 600})
    assert params.verified == before + 1  # vLLM's own checks still run
    with pytest.raises(_ValidationError) as failure:
        params({RETENTION_XARG: -1})
    assert failure.value.parameter == f"vllm_xargs.{RETENTION_XARG}"
    assert failure.value.value == -1
    # Registered twice in one process (vLLM loads plugins once per process; a test may call it again): the
    # check is not stacked.
    register({"KVSPEC_VLLM": "1", "KVSPEC_VLLM_EVICTION": "lru"})
    with pytest.raises(_ValidationError, match="evicts by 'lru'"):
        params({RETENTION_XARG: 600})


def test_register_refuses_wrong_settings_before_installing(fake_vllm: dict[str, types.ModuleType]) -> None:
    with pytest.raises(VllmPluginSettingsError, match="KVSPEC_VLLM_EVICTION='nope'"):
        register({"KVSPEC_VLLM": "1", "KVSPEC_VLLM_EVICTION": "nope"})
    assert not adapters.installed()
    fake_vllm["vllm"].__version__ = "0.35.0"  # type: ignore[attr-defined]
    with pytest.raises(VllmPluginSettingsError, match=r"vLLM 0\.35\.0 is not a release"):
        register({"KVSPEC_VLLM": "1", "KVSPEC_VLLM_STRICT": "1"})
    assert not adapters.installed()


def test_the_entry_point_is_declared() -> None:
    import tomllib

    with open("pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    target = project["entry-points"]["vllm.general_plugins"]["kvspec"]
    module, _, function = target.partition(":")
    assert (module, function) == ("kvspec.integrations.vllm_plugin", "register")
    assert set(project["optional-dependencies"]["vllm"]) >= {"pyzmq>=25", "msgspec>=0.18"}


def test_the_start_line_names_the_release_adapter_not_its_binding() -> None:
    """The engine's log names the adapter of its release (vllm-serve caught 0.32's named as 0.23's after the
    adapters moved to one module each)."""
    for cls in adapters.ADAPTERS.values():
        bound: Any = type(f"Bound{cls.__name__}", (cls,), {})  # what install() makes
        assert bound._release_adapter_name(object.__new__(bound)) == cls.__name__
