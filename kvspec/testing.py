"""The plugin conformance kit: run it in a plugin's own test suite.

``check_plugin(spec, manager_cls)`` registers the pair in a scratch registry (beside the built-ins), checks
every value the spec returns, plans a layout (the spec alone, and beside full attention), and drives a
coordinator through admission, a prefix hit, decode, an unrelated request, preemption, a refused
allocation and free, checking after every step:

- the pool's invariants and that every block's ref count equals its holders (``check_invariants``);
- every value a manager method returns (types, ranges, blocks from this pool);
- behaviour, not only bookkeeping: the block holding a request's last computed token is still held
  (a skipped-token count off by one frees it), a prefix hit's blocks carry the request's own block
  hashes, ``get_num_common_prefix_blocks`` never counts a block some running request does not hold,
  a refused allocation changes nothing, and finishing every request returns every block.

``check_eviction_policy(factory)`` does the same for an eviction policy (``kvspec.blocks.eviction``): seeded
random requests with shared prefixes over two groups, forced eviction, and the policy's promises checked
after every step.

``plugin_state_machine(spec, manager_cls)`` returns a hypothesis ``RuleBasedStateMachine`` that makes the
same checks after random steps (hypothesis is needed only for it).

Every failure raises :class:`kvspec.errors.PluginContractError` (or the registration error at the door)
naming the method, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvspec.blocks.events import BlockStored
from kvspec.blocks.eviction import (
    BatchEvictionPolicy,
    BlockUse,
    EvictionPolicy,
    EvictionPolicyFactory,
    watches_block_use,
)
from kvspec.blocks.hashing import BlockHashListWithBlockSize, make_block_hash_with_group_id
from kvspec.blocks.pool import BlockPool, KVCacheBlock
from kvspec.blocks.request import Request
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import KVCacheManager
from kvspec.contracts.release import ReleaseProfile
from kvspec.contracts.spec import KVCacheSpec, SchedulerLimits
from kvspec.contracts.traits import SpecTraits, block_tokens_of, event_kind, traits_of
from kvspec.coordinator import KVCacheBlocks, KVCacheCoordinator
from kvspec.device.kv_cache import allocate_kv_caches, page_views_of
from kvspec.errors import InvariantError, KVSpecError, PluginContractError
from kvspec.eviction.registry import check_eviction_policy_factory, probe_context
from kvspec.planning import generate_scheduler_kv_cache_config, get_kv_cache_config
from kvspec.planning.config import KVCacheConfig, KVCacheGroupSpec
from kvspec.registry.builtins import default_registry, register_builtins
from kvspec.registry.core import AnyRegistry, Registry
from kvspec.specs.attention import FullAttentionSpec, SlidingWindowSpec

__all__ = [
    "ConformanceReport",
    "CoordinatorChecker",
    "check_plugin",
    "check_spec_values",
    "plugin_state_machine",
]


@dataclass(kw_only=True, slots=True)
class ConformanceReport:
    """What ``check_plugin`` checked (each entry passed), and what it skipped and why."""

    spec_class: str
    manager_class: str
    checks: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.spec_class} run by {self.manager_class}: {len(self.checks)} checks passed"]
        lines += [f"  ok   {c}" for c in self.checks]
        lines += [f"  skip {s}" for s in self.skipped]
        return "\n".join(lines)


def _fail(what: str) -> PluginContractError:
    return PluginContractError(what)


def _require_count(value: object, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"{what} must be an int, got {type(value).__name__} {value!r}.")
    if value < minimum:
        raise _fail(f"{what} must be >= {minimum}, got {value}.")
    return value


# -- spec values ------------------------------------------------------------------------------------


def check_spec_values(spec: KVCacheSpec, limits: SchedulerLimits | None = None) -> list[str]:
    """Check every value ``spec`` returns; return the names of the checks that passed."""
    name = type(spec).__name__
    done: list[str] = []
    bs = _require_count(spec.block_size, f"{name}.block_size", 1)
    page = _require_count(spec.page_size_bytes, f"{name}.page_size_bytes", 1)
    done.append("block_size and page_size_bytes are positive ints")
    try:
        hash(spec)
    except TypeError as exc:
        raise _fail(f"{name} instances are not hashable ({exc}); specs are dict keys when grouping.") from exc
    try:
        setattr(spec, "block_size", bs)  # noqa: B010
    except (dataclasses.FrozenInstanceError, AttributeError, TypeError):
        pass
    else:
        raise _fail(f"{name} instances can be modified (spec.block_size = ...); specs must be immutable.")
    done.append("hashable and immutable")
    limits = limits or SchedulerLimits(max_model_len=8 * bs, max_num_batched_tokens=4 * bs)
    previous = -1
    for length in (1, bs, 4 * bs, limits.max_model_len):
        trial = dataclasses.replace(limits, max_model_len=length, max_num_batched_tokens=min(length, 4 * bs))
        need = _require_count(
            spec.max_memory_usage_bytes(trial), f"{name}.max_memory_usage_bytes(max_model_len={length})"
        )
        if need < previous:
            raise _fail(
                f"{name}.max_memory_usage_bytes shrinks as max_model_len grows ({previous} -> {need} bytes at "
                f"{length} tokens); planning's binary search for the longest model length needs it monotone."
            )
        previous = need
    done.append("max_memory_usage_bytes is a non-negative int, monotone in max_model_len")
    bigger = spec.copy_with_new_block_size(2 * bs)
    if type(bigger) is not type(spec) or bigger.block_size != 2 * bs:
        raise _fail(
            f"{name}.copy_with_new_block_size({2 * bs}) returned {type(bigger).__name__} with block_size="
            f"{getattr(bigger, 'block_size', None)!r}; expected a {name} with block_size={2 * bs}."
        )
    if spec.copy_with_new_block_size(bs) != spec:
        raise _fail(f"{name}.copy_with_new_block_size({bs}) (its own block size) does not equal the spec.")
    _require_count(bigger.page_size_bytes, f"{name}.copy_with_new_block_size(...).page_size_bytes", 1)
    done.append("copy_with_new_block_size keeps the class and sets the block size")
    for specs in ([spec], [spec, spec]):
        merged = type(spec).merge(specs)
        if type(merged) is not type(spec) or merged.block_size != bs or merged.page_size_bytes != page:
            raise _fail(
                f"{name}.merge({len(specs)} equal specs) returned {merged!r}; expected a {name} with the same "
                "block size and page size."
            )
        if merged != spec:
            # Equal specs merge into an equal spec: a merge that drops or resets a field changes the layer.
            raise _fail(
                f"{name}.merge({len(specs)} equal specs) returned {merged!r}, which differs from {spec!r}."
            )
    done.append("merge of equal specs gives an equal spec")
    as_list = spec.is_uniform_with_collection([spec, spec])
    if as_list is not True:
        raise _fail(f"{name}.is_uniform_with_collection([spec, spec]) returned {as_list!r}; expected True.")
    try:
        as_dict = spec.is_uniform_with_collection({"a": spec, "b": spec})
    except Exception as exc:
        raise _fail(
            f"{name}.is_uniform_with_collection raised {type(exc).__name__} for vLLM's layer -> spec dict; "
            "accept a Mapping too (kvspec.as_spec_list)."
        ) from exc
    if as_dict is not as_list:
        raise _fail(
            f"{name}.is_uniform_with_collection answers {as_dict!r} for a dict and {as_list!r} for a list of the "
            "same specs; accept vLLM's dict[str, spec] (kvspec.as_spec_list)."
        )
    done.append("is_uniform_with_collection gives one answer for a list and for vLLM's dict")
    traits = traits_of(spec)
    views, _ = page_views_of(spec)
    done.append(
        f"traits declared ({'kv_cache_traits' if hasattr(spec, 'kv_cache_traits') else 'defaults'}), "
        f"{len(views)} device view(s) inside the page"
    )
    if traits.admission_lookback_tokens is not None:
        cap = traits.admission_cap_blocks(bs, limits.batched_tokens, limits.max_model_len)
        _require_count(cap, f"{name} admission cap", 1)
    return done


# -- behaviour checks on a running coordinator ------------------------------------------------------


class CoordinatorChecker:
    """Checks a coordinator after every step; ``running`` maps request ids to their Request."""

    def __init__(self, coord: KVCacheCoordinator) -> None:
        self.coord = coord
        self.pool = coord.block_pool

    def _own_block(self, block: object, where: str) -> KVCacheBlock:
        if not isinstance(block, KVCacheBlock):
            raise _fail(f"{where} holds {type(block).__name__} {block!r}, not a KVCacheBlock.")
        if (
            not (0 <= block.block_id < self.pool.num_gpu_blocks)
            or self.pool.blocks[block.block_id] is not block
        ):
            raise _fail(
                f"{where} holds block {block.block_id}, which is not a block of this coordinator's pool."
            )
        return block

    def check_blocks(self, blocks: KVCacheBlocks | None, where: str) -> None:
        if blocks is None:
            return
        if len(blocks.blocks) != self.coord.num_groups:
            raise _fail(f"{where} returned {len(blocks.blocks)} groups, expected {self.coord.num_groups}.")
        for gid, group in enumerate(blocks.blocks):
            for block in group:
                self._own_block(block, f"{where} group {gid}")

    def predicted_blocks(
        self,
        request: RequestView,
        num_new_tokens: int,
        *,
        num_hit_tokens: int | None = None,
        computed: KVCacheBlocks | None = None,
        num_encoder_tokens: int = 0,
    ) -> int:
        """What the managers say the next allocate_slots takes (each value validated): a running request's
        step, or with ``num_hit_tokens`` its admission after a hit of ``computed`` blocks. Token targets
        follow the coordinator's rule: an encoder-sized group counts ``num_encoder_tokens`` (none on a
        running step), every other group the request's tokens. Asked before allocate_slots so that a bad
        value is named here, not met inside a compiled coordinator (whose unboxing of a manager's answer
        raises a bare TypeError)."""
        coord = self.coord
        done = request.num_computed_tokens if num_hit_tokens is None else num_hit_tokens
        total = min(done, coord.max_model_len)
        main = total + num_new_tokens
        need = min(main, coord.max_model_len)
        hits = computed.blocks if computed is not None else tuple(() for _ in coord.managers)
        out = 0
        for gid, manager in enumerate(coord.managers):
            if coord.traits[gid].allocate_per_encoder_input:
                if not num_encoder_tokens:
                    continue
                n = manager.get_num_blocks_to_allocate(
                    request.request_id, num_encoder_tokens, (), 0, num_encoder_tokens
                )
            else:
                n = manager.get_num_blocks_to_allocate(request.request_id, need, hits[gid], total, main)
            out += _require_count(n, f"{type(manager).__name__}.get_num_blocks_to_allocate (group {gid})")
        return out

    def check_encoder_groups_unchanged(
        self, request: RequestView, new_blocks: KVCacheBlocks, held_at_admission: Sequence[int], where: str
    ) -> None:
        """An encoder-sized group gets its blocks when the request is admitted and none after: a running
        step hands it no block and its holding stays what admission gave it."""
        coord = self.coord
        for gid, manager in enumerate(coord.managers):
            if not coord.traits[gid].allocate_per_encoder_input:
                continue
            if new_blocks.blocks[gid]:
                raise _fail(
                    f"{where}: encoder-sized group {gid} ({type(manager).__name__}) got "
                    f"{len(new_blocks.blocks[gid])} new block(s) on a running step; it is sized by the "
                    "encoder input once, at admission."
                )
            held = len(manager.get_blocks(request.request_id))
            if held != held_at_admission[gid]:
                raise _fail(
                    f"{where}: encoder-sized group {gid} holds {held} blocks of {request.request_id!r}, "
                    f"{held_at_admission[gid]} at admission."
                )

    def check_hit(self, request: RequestView, computed: KVCacheBlocks, num_hit_tokens: int) -> None:
        coord = self.coord
        _require_count(num_hit_tokens, "get_computed_blocks hit tokens")
        self.check_blocks(computed, "get_computed_blocks")
        if not coord.enable_caching:
            if num_hit_tokens or any(computed.blocks):
                raise _fail("a prefix hit with prefix caching disabled.")
            return
        if num_hit_tokens >= max(request.num_tokens, 1):
            raise _fail(
                f"a hit of {num_hit_tokens} tokens covers the whole {request.num_tokens}-token prompt."
            )
        for gid, group in enumerate(computed.blocks):
            if not coord.traits[gid].prefix_cacheable:
                if group:
                    raise _fail(f"group {gid} is not prefix-cacheable but got {len(group)} hit block(s).")
                continue
            if not group and num_hit_tokens == 0:
                continue
            block_tokens = coord.group_block_sizes[gid]
            # A manager may report a hit ending inside its last block (HitResult.num_tokens).
            if -(num_hit_tokens // -block_tokens) != len(group):
                raise _fail(
                    f"group {gid}'s hit has {len(group)} blocks of {block_tokens} tokens for a "
                    f"{num_hit_tokens}-token hit."
                )
            # Every block the next token reads must be a cached block: a null block may stand only where
            # the manager says attention never reads again (its skipped tokens at the hit's length).
            skipped_hook = getattr(coord.managers[gid], "get_num_skipped_tokens", None)
            skipped = skipped_hook(num_hit_tokens) if callable(skipped_hook) else 0
            first_read = _require_count(skipped, f"group {gid} get_num_skipped_tokens") // block_tokens
            for i in range(first_read, len(group)):
                if group[i].is_null:
                    raise _fail(
                        f"group {gid}'s {len(group)}-block hit holds the null block at position {i}, which the "
                        f"next token reads (only the first {first_read} block(s) are skipped at {num_hit_tokens} "
                        "tokens): a prefix hit must be cached blocks where attention reads."
                    )
            view = BlockHashListWithBlockSize(
                request.block_hashes,
                coord.hash_block_size,
                block_tokens,
                coord.block_pool.coarse_hash_is_last_fine,
            )
            for i, block in enumerate(group):
                if block.is_null:
                    continue
                if block.block_hash != make_block_hash_with_group_id(view[i], gid):
                    raise _fail(
                        f"group {gid}'s hit puts block {block.block_id} at position {i}, but it is not cached "
                        "under this request's hash for that position (find_longest_cache_hit matched the "
                        "wrong block)."
                    )

    def after_step(self, running: Mapping[str, RequestView]) -> None:
        coord = self.coord
        try:
            coord.check_invariants()
        except KVSpecError as exc:
            raise _fail(f"pool or ref counts inconsistent after a step: {exc}") from exc
        live: dict[str, list[list[KVCacheBlock]]] = {}
        for gid, manager in enumerate(coord.managers):
            mname = type(manager).__name__
            for block in manager.iter_held_blocks():
                self._own_block(block, f"{mname}.iter_held_blocks()")
            ids = manager.take_new_block_ids()
            if not isinstance(ids, list):
                raise _fail(f"{mname}.take_new_block_ids() returned {type(ids).__name__}, not a list.")
            for block_id in ids:
                _require_count(block_id, f"{mname}.take_new_block_ids() id")
                if block_id >= self.pool.num_gpu_blocks:
                    raise _fail(f"{mname}.take_new_block_ids() reported block {block_id}, outside the pool.")
            for rid, request in running.items():
                blocks = manager.get_blocks(rid)
                for block in blocks:
                    self._own_block(block, f"{mname}.get_blocks({rid!r})")
                live.setdefault(rid, []).append(list(blocks))
                self._check_last_token_held(gid, manager, request, blocks)
        for gid, manager in enumerate(coord.managers):
            for rid in running:
                got = _require_count(
                    manager.get_num_common_prefix_blocks(rid),
                    f"{type(manager).__name__}.get_num_common_prefix_blocks({rid!r})",
                )
                truth = _common_prefix(rid, [blocks[gid] for blocks in live.values()], live[rid][gid])
                if got > truth:
                    raise _fail(
                        f"{type(manager).__name__}.get_num_common_prefix_blocks({rid!r}) = {got} (group {gid}), but "
                        f"only {truth} leading block(s) are held by every one of the {len(running)} running "
                        "requests; cascade attention would read another request's KV."
                    )

    def _check_last_token_held(
        self, gid: int, manager: KVCacheManager, request: RequestView, blocks: Sequence[KVCacheBlock]
    ) -> None:
        """The block holding the last computed token is still held (the next token reads its KV, or the
        state after it), unless the spec declares chunked attention (a new chunk reads nothing before it)
        or a window of one token. Call it after allocate_slots and before the step's tokens are counted as
        computed: that is when a too-eager free would let the model read a block another request reuses."""
        traits = self.coord.traits[gid]
        if traits.allocate_per_encoder_input or traits.attention_chunk_size is not None:
            return
        if traits.sliding_window is not None and traits.sliding_window < 2:
            return
        n = min(request.num_computed_tokens, self.coord.max_model_len)
        if n <= 0 or not blocks:
            return
        bs = self.coord.group_block_sizes[gid]
        index = (n - 1) // bs
        if index < len(blocks) and blocks[index].is_null:
            raise _fail(
                f"{type(manager).__name__} (group {gid}) freed block {index} of request "
                f"{request.request_id!r}, which holds its last computed token (position {n - 1}); the next "
                "step reads it. Is get_num_skipped_tokens off by one?"
            )


def _common_prefix(rid: str, all_lists: Sequence[Sequence[KVCacheBlock]], own: Sequence[KVCacheBlock]) -> int:
    """Leading positions where every request that holds blocks holds this request's (non-null) block."""
    holders = [blocks for blocks in all_lists if blocks]
    count = 0
    for i, block in enumerate(own):
        if block.is_null or any(i >= len(b) or b[i] is not block for b in holders):
            break
        count += 1
    return count


# -- the scenario -----------------------------------------------------------------------------------


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

    def __init__(
        self,
        config: KVCacheConfig,
        limits: SchedulerLimits,
        registry: AnyRegistry,
        caching: bool,
        report: ConformanceReport,
        label: str,
        profile: ReleaseProfile | None = None,
    ) -> None:
        super().__init__(config, limits, registry, caching, label, profile)
        self.report = report

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

    def run(self, traits: SpecTraits) -> None:
        coord, report, label = self.coord, self.report, self.label
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
            config = get_kv_cache_config(layers, 0, limits, num_blocks_override=num_blocks, registry=scratch)
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
            _Scenario(config, limits, scratch, caching, report, tag, profile).run(traits)
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
            config = get_kv_cache_config(layers, 0, limits, num_blocks_override=num_blocks, registry=registry)
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


# -- eviction policies -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class EvictionReport:
    """What :func:`check_eviction_policy` drove: the block ids of every allocation in order (equal for two
    policies that evict alike), blocks evicted with cached content, and prefix-hit tokens."""

    allocations: tuple[tuple[int, ...], ...]
    evictions: int
    hit_tokens: int


class _ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _eviction_scenario(
    factory: EvictionPolicyFactory | None,
    seed: int,
    steps: int,
    num_blocks: int,
    profile: ReleaseProfile | None,
    asks: bool = True,
) -> EvictionReport:
    """One seeded run: requests over a few shared prefixes (full attention beside a sliding window, so two
    groups share the pool), with priorities and retentions, admitted with their prefix hit, freed in random
    order, plus bursts that take blocks straight from the pool; checked after every step."""
    rng = random.Random(seed)
    clock = _ManualClock()
    specs = (
        FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float16),
        SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float16, sliding_window=8),
    )
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=(),
        kv_cache_groups=tuple(
            KVCacheGroupSpec(layer_names=(f"layer_{i}",), kv_cache_spec=spec) for i, spec in enumerate(specs)
        ),
    )
    coord = KVCacheCoordinator(
        config,
        SchedulerLimits(max_model_len=256),
        eviction_policy=factory,
        eviction_clock=clock,
        profile=profile,
    )
    pool = coord.block_pool
    policy = pool.eviction_policy
    hasher = coord.make_block_hasher(seed="kvspec-eviction-kit")
    prefixes = [[rng.randrange(1000) for _ in range(rng.choice((8, 12, 16, 24)))] for _ in range(5)]
    live: list[Request] = []
    allocations: list[tuple[int, ...]] = []
    evictions = hit_tokens = 0
    for step in range(steps):
        clock.now += rng.random()
        action = rng.random()
        if live and (action < 0.35 or len(live) >= 3):
            request = live.pop(rng.randrange(len(live)))
            coord.free(request)
        elif action < 0.9:
            tokens = list(rng.choice(prefixes)) + [rng.randrange(1000) for _ in range(rng.randrange(1, 14))]
            request = Request(
                f"r{step}",
                tokens,
                block_hasher=hasher,
                priority=rng.randrange(3) if asks else 0,
                retention_seconds=rng.choice((None, None, 2.0, 30.0)) if asks else None,
            )
            computed, hit = coord.get_computed_blocks(request)
            hashed_before = {b.block_id for b in pool.blocks if b.block_hash is not None}
            blocks = coord.allocate_slots(request, len(tokens) - hit, hit, computed)
            if blocks is None:
                continue
            request.num_computed_tokens = len(tokens)
            live.append(request)
            hit_tokens += hit
            new_ids = tuple(i for group in blocks.get_block_ids() for i in group)
            allocations.append(new_ids)
            evictions += len(hashed_before & set(new_ids))
        else:
            # A burst straight from the pool: the blocks handed out must be the reuse-first list, then the
            # policy's victims in the order evictable_blocks() gave just before.
            queue = pool.free_block_queue
            first = [
                b for b in queue.get_all_free_blocks() if b.prev_free_block is not None
            ]  # the linked list part
            unhashed = sum(1 for b in queue.get_all_free_blocks() if b.block_hash is None)
            take = min(queue.num_free_blocks, unhashed + rng.randrange(1, 4))
            if take == 0:
                continue
            expected = first + (policy.evictable_blocks() if policy is not None else [])
            taken = pool.get_new_blocks(take)
            if policy is not None and [b.block_id for b in taken] != [b.block_id for b in expected[:take]]:
                raise _fail(
                    f"eviction policy {type(policy).__name__}: the pool took blocks "
                    f"{[b.block_id for b in taken]} but evictable_blocks() promised "
                    f"{[b.block_id for b in expected[:take]]} (after the {len(first)} blocks to reuse first)"
                )
            allocations.append(tuple(b.block_id for b in taken))
            pool.free_blocks(taken)
        try:
            coord.check_invariants()
        except InvariantError as exc:
            raise _fail(
                f"eviction policy {type(policy).__name__}: the pool's invariants broke at step {step}: {exc} "
                "(does the policy hold exactly the free blocks it was given, minus those removed?)"
            ) from exc
        if policy is not None:
            _check_policy_state(policy, pool)
    for request in live:
        coord.free(request)
    coord.check_invariants()
    if pool.get_num_free_blocks() != num_blocks - 1:
        raise _fail(f"finishing every request left {num_blocks - 1 - pool.get_num_free_blocks()} blocks held")
    return EvictionReport(allocations=tuple(allocations), evictions=evictions, hit_tokens=hit_tokens)


def _check_policy_state(policy: EvictionPolicy, pool: BlockPool) -> None:
    held = policy.evictable_blocks()
    name = type(policy).__name__
    ids_held = [b.block_id for b in held]
    if len(set(ids_held)) != len(ids_held):
        raise _fail(f"eviction policy {name}: evictable_blocks() lists a block twice: {ids_held}")
    if len(held) != len(policy):
        raise _fail(
            f"eviction policy {name}: len() is {len(policy)} but evictable_blocks() lists {len(held)}"
        )
    expected = {b.block_id for b in pool.free_block_queue.get_all_free_blocks() if b.prev_free_block is None}
    if set(ids_held) != expected:
        raise _fail(
            f"eviction policy {name}: holds {sorted(ids_held)} but the free blocks with cached content given "
            f"to it are {sorted(expected)}"
        )
    for block in held:
        if block.ref_cnt != 0:
            raise _fail(f"eviction policy {name}: lists block {block.block_id}, which a request holds")


class _PerBlockCalls:
    """A policy seen through its per-block methods only (its batch methods and ``watches_block_use``
    hidden, so the pool makes every call), for the kit to run a policy both ways."""

    __slots__ = ("_policy",)

    def __init__(self, policy: EvictionPolicy) -> None:
        self._policy = policy

    def add(self, block: KVCacheBlock) -> None:
        self._policy.add(block)

    def remove(self, block: KVCacheBlock) -> None:
        self._policy.remove(block)

    def pop_victim(self) -> KVCacheBlock:
        return self._policy.pop_victim()

    def __len__(self) -> int:
        return len(self._policy)

    def evictable_blocks(self) -> list[KVCacheBlock]:
        return self._policy.evictable_blocks()

    def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        self._policy.on_cached(blocks, use)

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        self._policy.on_hit(blocks, use)


def check_eviction_policy(
    factory: EvictionPolicyFactory,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    steps: int = 300,
    num_blocks: int = 40,
    profile: ReleaseProfile | None = None,
) -> EvictionReport:
    """The conformance kit for an eviction policy: drive a coordinator with ``factory``'s policy through
    seeded random requests (shared prefixes, prefix hits, priorities, retentions, frees in random order,
    bursts that force eviction) and check after every step the pool's invariants, that the policy holds
    exactly the free blocks with cached content (no held block, none twice, ``len`` agreeing), that the
    blocks the pool takes follow ``evictable_blocks()``'s order, that every block comes back at the end,
    and that a second run of the same seed gives the same block ids (determinism). Raises
    ``PluginContractError`` naming what failed; returns the first seed's report."""
    checked = check_eviction_policy_factory(getattr(factory, "__name__", "policy"), factory)
    name = getattr(factory, "__name__", factory)
    reports = []
    for seed in seeds:
        first = _eviction_scenario(checked, seed, steps, num_blocks, profile)
        again = _eviction_scenario(checked, seed, steps, num_blocks, profile)
        if first != again:
            raise _fail(
                f"eviction policy from {name!r} is not deterministic: seed {seed} gave different block ids on "
                "a second run"
            )
        probe = checked(probe_context(num_blocks))
        if isinstance(probe, BatchEvictionPolicy) or not watches_block_use(probe):
            # The pool calls a batch policy's add_blocks / pop_victims; they must act as add / pop_victim.
            # It skips on_cached / on_hit of a policy that says it ignores them; they must change nothing.
            # The adapter shows the pool neither, so both claims are checked by one run.
            per_block = _eviction_scenario(
                lambda context: _PerBlockCalls(checked(context)), seed, steps, num_blocks, profile
            )
            if per_block != first:
                raise _fail(
                    f"eviction policy from {name!r}: seed {seed} gave other block ids through add / "
                    "pop_victim one block at a time with every on_cached / on_hit call: its add_blocks / "
                    "pop_victims do not act as the per-block calls, or it says watches_block_use = False "
                    "and the calls change its order"
                )
        reports.append(first)
    if not any(r.evictions for r in reports):
        raise _fail("the scenario evicted nothing; give fewer num_blocks")
    return reports[0]


def eviction_scenario(
    factory: EvictionPolicyFactory | None,
    *,
    seed: int = 0,
    steps: int = 300,
    num_blocks: int = 40,
    profile: ReleaseProfile | None = None,
    asks: bool = True,
) -> EvictionReport:
    """The kit's seeded scenario run once (None: the pool's own LRU), to compare two policies' block ids;
    ``asks`` False: every request at priority 0 without retention."""
    return _eviction_scenario(factory, seed, steps, num_blocks, profile, asks)
