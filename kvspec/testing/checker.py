"""What the plugin kit checks after every step: the values a spec returns (:func:`check_spec_values`) and
a coordinator's state against its requests (:class:`CoordinatorChecker`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvspec.blocks.hashing import BlockHashListWithBlockSize, make_block_hash_with_group_id
from kvspec.blocks.pool import KVCacheBlock
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.manager import KVCacheManager
from kvspec.contracts.spec import KVCacheSpec, SchedulerLimits
from kvspec.contracts.traits import traits_of
from kvspec.coordinator import KVCacheBlocks, KVCacheCoordinator
from kvspec.device.kv_cache import page_views_of
from kvspec.errors import KVSpecError, PluginContractError

__all__ = ["ConformanceReport", "CoordinatorChecker", "check_spec_values"]


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
