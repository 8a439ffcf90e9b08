"""The plugin conformance kit: :func:`check_plugin` (a scripted run) and :func:`plugin_state_machine`
(random steps under hypothesis)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch

from kvspec.blocks.events import BlockStored
from kvspec.blocks.request import Request
from kvspec.contracts.manager import KVCacheManager
from kvspec.contracts.release import ReleaseProfile
from kvspec.contracts.spec import KVCacheSpec, SchedulerLimits
from kvspec.contracts.traits import SpecTraits, block_tokens_of, event_kind, traits_of
from kvspec.coordinator import KVCacheCoordinator
from kvspec.device.kv_cache import allocate_kv_caches
from kvspec.errors import KVSpecError
from kvspec.planning import generate_scheduler_kv_cache_config, get_kv_cache_config
from kvspec.planning.config import KVCacheConfig
from kvspec.registry.builtins import default_registry, register_builtins
from kvspec.registry.core import AnyRegistry, Registry
from kvspec.specs.attention import FullAttentionSpec
from kvspec.testing.checker import (
    ConformanceReport,
    CoordinatorChecker,
    _fail,
    _require_count,
    check_spec_values,
)

__all__ = ["check_plugin", "plugin_state_machine"]


def _companion_full_attention(spec: KVCacheSpec) -> FullAttentionSpec | None:
    """A full-attention layer whose block holds as many tokens as the plugin's (its block size, or its
    compressed domain's tokens per block) and exactly its page (padded), or None."""
    bs, page = block_tokens_of(spec), spec.page_size_bytes
    if page < 2 * bs:
        return None
    return FullAttentionSpec(
        block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.int8, page_size_padded=page
    )


class _Driver:
    """Drives one coordinator the way a scheduler does (admissions, steps, frees), with every
    :class:`CoordinatorChecker` check at each step. ``check_plugin``'s scenario and ``plugin_state_machine``
    both run through it, so they check the same things."""

    def __init__(
        self,
        config: KVCacheConfig,
        limits: SchedulerLimits,
        registry: AnyRegistry,
        caching: bool,
        label: str,
        profile: ReleaseProfile | None = None,
    ) -> None:
        self.coord = KVCacheCoordinator(
            generate_scheduler_kv_cache_config([config]),
            limits,
            enable_caching=caching,
            enable_kv_cache_events=True,
            log_stats=True,
            registry=registry,
            profile=profile,
        )
        self.checker = CoordinatorChecker(self.coord)
        self.label = label
        self.running: dict[str, Request] = {}
        self.hasher = self.coord.make_block_hasher(seed="kvspec.testing")
        #: Encoder tokens each admission brings (two scheduler blocks when a group is encoder-sized).
        self.encoder = (
            2 * self.coord.scheduler_block_size
            if any(t.allocate_per_encoder_input for t in self.coord.traits)
            else 0
        )
        self.rng = random.Random(0)
        self._held_at_admission: dict[str, list[int]] = {}

    def request(self, rid: str, tokens: list[int]) -> Request:
        return Request(rid, tokens, block_hasher=self.hasher)

    def admit(self, request: Request, num_new_tokens: int | None = None) -> int | None:
        """Admit ``request`` after its prefix hit with ``num_new_tokens`` (default: the rest of its
        prompt); the hit tokens, or None when allocate_slots refused (the pool unchanged)."""
        coord = self.coord
        computed, hit = coord.get_computed_blocks(request)
        self.checker.check_hit(request, computed, hit)
        rest = request.num_tokens - hit
        num_new = rest if num_new_tokens is None else min(num_new_tokens, rest)
        self.checker.predicted_blocks(
            request, num_new, num_hit_tokens=hit, computed=computed, num_encoder_tokens=self.encoder
        )
        free_before = coord.num_free_blocks
        new = coord.allocate_slots(request, num_new, hit, computed, num_encoder_tokens=self.encoder)
        if new is None:
            if coord.num_free_blocks > free_before:
                raise _fail(f"[{self.label}] a refused admission freed blocks")
            return None
        self.checker.check_blocks(new, "allocate_slots")
        self._held_at_admission[request.request_id] = [
            len(m.get_blocks(request.request_id)) for m in coord.managers
        ]
        # Checked before the step's tokens count as computed: the model is about to read the hit's last
        # token (its KV, or the state after it), so that block must still be held.
        request.num_computed_tokens = hit
        self.running[request.request_id] = request
        self.checker.after_step(self.running)
        request.num_computed_tokens = hit + num_new
        self.checker.after_step(self.running)
        return hit

    def step(self, request: Request, num_new_tokens: int) -> bool:
        """One step of a running request; False when allocate_slots refused it (the caller preempts)."""
        self.checker.predicted_blocks(request, num_new_tokens)
        new = self.coord.allocate_slots(request, num_new_tokens)
        if new is None:
            return False
        self.checker.check_blocks(new, "allocate_slots (step)")
        self.checker.check_encoder_groups_unchanged(
            request, new, self._held_at_admission[request.request_id], f"[{self.label}] step"
        )
        # The step about to run reads the last computed token's block: check before advancing.
        self.checker.after_step(self.running)
        request.num_computed_tokens += num_new_tokens
        self.checker.after_step(self.running)
        return True

    def preempt(self, request: Request) -> None:
        self.coord.free(request)
        del self.running[request.request_id]
        self._held_at_admission.pop(request.request_id, None)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.checker.after_step(self.running)

    def finish(self, request: Request) -> None:
        self.coord.free(request)
        del self.running[request.request_id]
        self._held_at_admission.pop(request.request_id, None)
        for manager in self.coord.managers:
            if manager.get_blocks(request.request_id):
                raise _fail(
                    f"{type(manager).__name__} still holds blocks of {request.request_id!r} after free()."
                )
        self.checker.after_step(self.running)

    def check_no_leak(self) -> None:
        """With no request running, every block is free or held by a manager for its lifetime."""
        coord = self.coord
        reserved = sum(1 for m in coord.managers for _ in m.iter_held_blocks())
        leaked = coord.block_pool.num_gpu_blocks - 1 - reserved - coord.num_free_blocks
        if leaked:
            raise _fail(
                f"[{self.label}] with no request running, {leaked} block(s) are neither free nor held by a "
                "manager (leaked)."
            )


class _Scenario(_Driver):
    """check_plugin's fixed scenario (admit, hit, decode, preempt, refuse, finish, reset, events)."""

    def admit_whole(self, request: Request) -> int:
        hit = self.admit(request)
        if hit is None:
            raise _fail(
                f"[{self.label}] allocate_slots refused request {request.request_id!r} with "
                f"{self.coord.num_free_blocks} free blocks; the kit sizes the pool so it fits."
            )
        return hit

    def decode(self, request: Request, steps: int) -> None:
        for _ in range(steps):
            self.coord.new_step_starts()
            request.append_output_token_ids(self.rng.randrange(1, 50))
            if not self.step(request, 1):
                raise _fail(f"[{self.label}] a one-token decode step was refused with free blocks left.")

    def run(self, traits: SpecTraits, report: ConformanceReport) -> None:
        coord, label = self.coord, self.label
        bs = coord.scheduler_block_size
        shared = [1 + (i % 97) for i in range(3 * bs)]
        # 1. a prompt of exactly three scheduler blocks, then decode
        r1 = self.request("r1", list(shared))
        self.admit_whole(r1)
        self.decode(r1, 3)
        report.checks.append(f"[{label}] admit a 3-block prompt and decode 3 tokens")
        # 2. a request sharing r1's prompt: a prefix hit
        r2 = self.request("r2", [*shared, *range(200, 200 + bs // 2 + 1)])
        self.coord.new_step_starts()
        hit = self.admit_whole(r2)
        if (
            coord.enable_caching
            and traits.prefix_cacheable
            and traits.prefix_hits_left_closed
            and coord.num_groups == 1
            and hit < bs
        ):
            raise _fail(
                f"[{label}] a request sharing a cached 3-block prompt got a {hit}-token hit; the spec declares "
                "left-closed (full-attention) hits, so at least one block should hit."
            )
        report.checks.append(
            f"[{label}] prefix hit of {hit} tokens, every hit block under the request's own hash"
        )
        # 3. an unrelated request: nothing is common to all three
        r3 = self.request("r3", [300 + (i % 50) for i in range(2 * bs + 3)])
        self.coord.new_step_starts()
        self.admit_whole(r3)
        self.decode(r2, 2)
        report.checks.append(f"[{label}] three running requests, common-prefix counts bounded by the truth")
        # 4. preempt r2 and re-admit it
        self.preempt(r2)
        self.coord.new_step_starts()
        self.admit_whole(r2)
        report.checks.append(f"[{label}] preemption and re-admission")
        # 5. a refused allocation changes nothing
        r4 = self.request("r4", [400 + (i % 50) for i in range(2 * bs)])
        free_before = coord.num_free_blocks
        enc = self.encoder
        refused = coord.allocate_slots(r4, r4.num_tokens, num_encoder_tokens=enc, reserved_blocks=free_before)
        if refused is not None and any(refused.blocks):
            raise _fail(f"[{label}] allocate_slots handed out blocks it was told were reserved.")
        if refused is None:
            if coord.num_free_blocks != free_before or any(m.get_blocks("r4") for m in coord.managers):
                raise _fail(f"[{label}] a refused allocate_slots changed the pool (free blocks or holdings).")
            self.checker.after_step(self.running)
            report.checks.append(f"[{label}] a refused allocation leaves the pool as it was")
        else:
            self.running["r4"] = r4
        # 6. finish everything: every block comes back
        for request in list(self.running.values()):
            self.finish(request)
        self.check_no_leak()
        report.checks.append(f"[{label}] every block returns to the pool when all requests finish")
        if not coord.reset_prefix_cache():
            raise _fail(f"[{label}] reset_prefix_cache() refused with no request running.")
        # 7. events carry the group's declared kind
        for event in coord.take_events():
            if isinstance(event, BlockStored) and event.group_idx is not None:
                meta = coord._event_metadata[event.group_idx]
                if event.kv_cache_spec_kind != meta.kind:
                    raise _fail(f"[{label}] a BlockStored event reports kind {event.kv_cache_spec_kind!r}.")
        kinds = sorted({m.kind for m in coord._event_metadata})
        report.checks.append(f"[{label}] KV events carry kinds {kinds}")


def _scratch_registry(
    spec: KVCacheSpec,
    manager_cls: type[KVCacheManager],
    base: type[KVCacheSpec] | None,
    source: AnyRegistry | None,
    name: str,
) -> Registry[Any, Any]:
    """The built-ins, the source registry's other registrations, and the pair under test: the caller's
    registry is never changed. A conflicting registration of the same class is a failure."""
    scratch: Registry[Any, Any] = Registry(name=name)
    register_builtins(scratch)
    for entry in (default_registry if source is None else source).registrations():
        if entry.source != "builtin":
            scratch.register(
                entry.spec_cls,
                entry.manager_cls,
                entry.uniform_type_base_spec,
                capabilities=entry.capabilities,
                manager_for=entry.manager_for,
            )
    existing = scratch.lookup(type(spec))
    if existing is not None and existing.spec_cls is type(spec):
        chosen = existing.manager_for_spec(spec)  # the registration may choose per instance
        if chosen is not manager_cls:
            raise _fail(
                f"{type(spec).__name__} is registered with {chosen.__name__} for this instance, not "
                f"{manager_cls.__name__}; check the pair the registry will run."
            )
        return scratch
    scratch.register(type(spec), manager_cls, base)
    return scratch


def _kit_limits(spec: KVCacheSpec, *, blocks_per_request: int) -> SchedulerLimits:
    """Limits sized in the spec's own blocks: a request of ``blocks_per_request`` blocks, half per step."""
    bs = block_tokens_of(spec)
    return SchedulerLimits(
        max_model_len=blocks_per_request * bs,
        max_num_batched_tokens=blocks_per_request // 2 * bs,
        max_num_encoder_input_tokens=2 * bs,
        mamba_cache_mode=getattr(spec, "mamba_cache_mode", "none"),
    )


def check_plugin(
    spec: KVCacheSpec,
    manager_cls: type[KVCacheManager],
    *,
    uniform_type_base_spec: type[KVCacheSpec] | None = None,
    registry: AnyRegistry | None = None,
    num_blocks: int = 64,
    profile: ReleaseProfile | None = None,
) -> ConformanceReport:
    """Check a spec/manager pair end to end (see the module docstring); raise on the first failure.

    The pair is registered in a scratch registry that starts from ``registry`` (default: the default
    registry), so the caller's registry is never changed. ``profile``: the vLLM release whose behaviour the
    coordinators reproduce (default ``DEFAULT_PROFILE``; a spec only one release runs, such as Mamba "all",
    needs that release's). Returns what was checked.
    """
    scratch = _scratch_registry(spec, manager_cls, uniform_type_base_spec, registry, "conformance")
    report = ConformanceReport(spec_class=type(spec).__qualname__, manager_class=manager_cls.__qualname__)
    report.checks.append("registration: class members, signatures, frozen and hashable")
    report.checks += check_spec_values(spec)
    traits = traits_of(spec)
    limits = _kit_limits(spec, blocks_per_request=16)
    layouts: dict[str, dict[str, KVCacheSpec]] = {"alone": {"plugin.0": spec, "plugin.1": spec}}
    companion = _companion_full_attention(spec)
    if companion is None:
        report.skipped.append("beside full attention: the spec's page is smaller than 2 bytes per token")
    else:
        layouts["beside full attention"] = {"full.0": companion, "plugin.0": spec, "plugin.1": spec}
    for label, layers in layouts.items():
        try:
            config = get_kv_cache_config(
                layers, 0, limits, num_blocks_override=num_blocks, registry=scratch, profile=profile
            )
        except KVSpecError as exc:
            raise _fail(f"[{label}] planning {type(spec).__name__} failed: {exc}") from exc
        _check_config(config, layers, label)
        report.checks.append(
            f"[{label}] planned {len(config.kv_cache_groups)} group(s), {config.num_blocks} blocks, "
            f"{len(config.kv_cache_tensors)} tensor(s)"
        )
        caches = allocate_kv_caches(config, "cpu")
        for layer in layers:
            cache = caches[layer]
            for view in cache if isinstance(cache, tuple) else (cache,):
                if view.shape[0] != config.num_blocks:
                    raise _fail(f"[{label}] layer {layer}'s device view has {view.shape[0]} blocks.")
        report.checks.append(f"[{label}] device views of every layer, block-major")
        modes = [True, False] if traits.supports_prefix_caching else [False]
        for caching in modes:
            tag = f"{label}, caching {'on' if caching else 'off'}"
            _Scenario(config, limits, scratch, caching, tag, profile).run(traits, report)
    registration = scratch.lookup(type(spec))
    identifier = registration.capabilities.identifier if registration and registration.capabilities else None
    report.checks.append(f"event kind {event_kind(traits, identifier)!r}")
    return report


def _check_config(config: KVCacheConfig, layers: Mapping[str, KVCacheSpec], label: str) -> None:
    _require_count(config.num_blocks, f"[{label}] planned num_blocks", 1)
    for tensor in config.kv_cache_tensors:
        _require_count(tensor.size, f"[{label}] KVCacheTensor.size")
    assigned = {n for g in config.kv_cache_groups for n in g.layer_names}
    if assigned != set(layers):
        raise _fail(f"[{label}] planning assigned layers {sorted(assigned)}, expected {sorted(layers)}.")


# -- hypothesis -------------------------------------------------------------------------------------


def plugin_state_machine(
    spec: KVCacheSpec,
    manager_cls: type[KVCacheManager],
    *,
    uniform_type_base_spec: type[KVCacheSpec] | None = None,
    beside_full_attention: bool = True,
    profile: ReleaseProfile | None = None,
) -> type[Any]:
    """A hypothesis ``RuleBasedStateMachine`` class driving a coordinator of ``spec`` (and, by default, a
    full-attention layer beside it) through random admissions, steps, preemptions, frees and resets,
    with every :class:`CoordinatorChecker` check after each step. Use ``Machine.TestCase`` in a test."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

    registry = _scratch_registry(spec, manager_cls, uniform_type_base_spec, None, "conformance-machine")
    bs = block_tokens_of(spec)
    limits = _kit_limits(spec, blocks_per_request=8)
    layers: dict[str, KVCacheSpec] = {"plugin.0": spec}
    companion = _companion_full_attention(spec) if beside_full_attention else None
    if companion is not None:
        layers["full.0"] = companion
    prefixes = [[1000 + 100 * p + i for i in range(3 * bs)] for p in range(3)]
    caching_allowed = traits_of(spec).supports_prefix_caching

    class PluginMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.waiting: dict[str, Request] = {}
            self.next_id = 0
            self.rng = random.Random(0)

        @initialize(
            num_blocks=st.integers(20, 48), chunk=st.sampled_from([bs, 2 * bs, 3 * bs]), caching=st.booleans()
        )
        def setup(self, num_blocks: int, chunk: int, caching: bool) -> None:
            config = get_kv_cache_config(
                layers, 0, limits, num_blocks_override=num_blocks, registry=registry, profile=profile
            )
            self.driver = _Driver(
                config, limits, registry, caching and caching_allowed, "state machine", profile
            )
            self.coord = self.driver.coord
            self.chunk = chunk

        @rule(prefix=st.integers(-1, 2), prefix_len=st.integers(0, 3 * bs), suffix_len=st.integers(1, 4 * bs))
        def add_request(self, prefix: int, prefix_len: int, suffix_len: int) -> None:
            head = prefixes[prefix][:prefix_len] if prefix >= 0 else []
            tokens = head + [self.rng.randrange(50) for _ in range(suffix_len)]
            rid = str(self.next_id)
            self.next_id += 1
            self.waiting[rid] = self.driver.request(rid, tokens)

        @precondition(lambda self: bool(self.waiting))
        @rule(data=st.data())
        def admit(self, data: st.DataObject) -> None:
            rid = data.draw(st.sampled_from(sorted(self.waiting)))
            if self.driver.admit(self.waiting[rid], self.chunk) is not None:
                del self.waiting[rid]

        @precondition(lambda self: bool(self.driver.running))
        @rule(data=st.data())
        def step(self, data: st.DataObject) -> None:
            running = self.driver.running
            rid = data.draw(st.sampled_from(sorted(running)))
            request = running[rid]
            if request.num_computed_tokens >= request.num_tokens:
                request.append_output_token_ids(self.rng.randrange(50))
            if request.num_tokens >= limits.max_model_len:
                self.driver.finish(request)
                return
            num_new = min(self.chunk, request.num_tokens - request.num_computed_tokens)
            if not self.driver.step(request, num_new):
                self.driver.preempt(request)
                self.waiting[rid] = request

        @precondition(lambda self: bool(self.driver.running))
        @rule(data=st.data())
        def finish(self, data: st.DataObject) -> None:
            running = self.driver.running
            self.driver.finish(running[data.draw(st.sampled_from(sorted(running)))])

        @rule()
        def new_step(self) -> None:
            self.coord.new_step_starts()

        @rule()
        def reset(self) -> None:
            if self.coord.reset_prefix_cache() is bool(self.driver.running):
                raise _fail("reset_prefix_cache() answered wrongly for the number of running requests")

        @invariant()
        def consistent(self) -> None:
            if not hasattr(self, "driver"):
                return
            self.driver.checker.after_step(self.driver.running)
            if not self.driver.running:
                self.driver.check_no_leak()

    PluginMachine.__name__ = f"{type(spec).__name__}Machine"
    return PluginMachine
