"""The coordinator's per-step helpers (admission, allocation, caching, freeing), compiled with :mod:`._core`.

They are module functions over :class:`~._state.CoordinatorState`, not methods: KVCacheCoordinator is a
Python subclass of the compiled core, and a method call on its instance from compiled code goes through
Python (attribute lookup, argument parsing, boxing); a function call on it is a direct C call.

Atomicity: admission checks capacity before it changes anything, so a refusal leaves ref counts, the free
queue and the cache map as they were. Units: tokens, blocks.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import NamedTuple, SupportsIndex

from kvspec.blocks.pool import KVCacheBlock
from kvspec.blocks.request import Request
from kvspec.blocks.request_view import RequestView
from kvspec.coordinator._state import CoordinatorState, KVCacheBlocks
from kvspec.errors import KVSpecTypeError, SchedulingError


class AdmissionCounts(NamedTuple):
    """``allocate_slots``'s counts on the admission path, each checked (``as_count``)."""

    new_tokens: int
    new_computed: int
    lookahead: int
    external: int
    encoder: int
    reserved: int
    in_flight: int
    watermark: int


def as_count(name: str, value: SupportsIndex) -> int:
    """``value`` (tokens or blocks) as an int >= 0: any integer with ``__index__`` (Python, numpy, a 0-d
    integer tensor). A bool, a float or a negative number is a SchedulingError naming allocate_slots'
    argument ``name``."""
    if type(value) is int:  # not isinstance: bool is an int, and a compiled build unboxes True to 1
        if value >= 0:
            return value
    elif not isinstance(value, bool):
        try:
            count = operator.index(value)
        except TypeError:
            count = -1
        if count >= 0:
            return count
    raise SchedulingError(f"allocate_slots: {name} must be an int >= 0, got {value!r}.")


def find_prefix_hit(
    core: CoordinatorState, request: RequestView, max_length: int
) -> tuple[KVCacheBlocks, int, int]:
    """``CoordinatorState.lookup_prefix``."""
    if not core.enable_caching or request.skip_reading_prefix_cache or not core.specs:
        return core._empty, 0, 0
    blocks, num_hit_tokens, uncached = core.hit_search.find_with_uncached(request.block_hashes, max_length)
    return KVCacheBlocks(blocks), num_hit_tokens, uncached


def note_prefix_hit(core: CoordinatorState, request: RequestView, num_hit_tokens: int) -> None:
    """``CoordinatorState.record_prefix_hit``."""
    if (
        core.prefix_cache_stats is None
        or not core.enable_caching
        or request.skip_reading_prefix_cache
        or not core.specs
    ):
        return
    core.prefix_cache_stats.record(request.num_tokens, num_hit_tokens, request.num_preemptions > 0)


def allocate_running(
    core: CoordinatorState,
    request: RequestView,
    request_id: str,
    new_tokens: int,
    lookahead: int,
    reserved: int,
    delay_cache_blocks: bool,
) -> KVCacheBlocks | None:
    """A running request's step: no hit, no external or encoder tokens, nothing in flight; the block
    counts inline (a call with eight arguments costs the pure build a tenth of the step)."""
    max_len = core.max_model_len
    if isinstance(request, Request):  # a native read in the compiled build (see allocate_slots)
        total = request.num_computed_tokens
    else:
        total = request.num_computed_tokens
    if total > max_len:
        total = max_len
    main = total + new_tokens
    need = main + lookahead
    if need > max_len:
        need = max_len
    _note_prefill_end(core, request, request_id)
    _remove_skipped(core, request, request_id, total, 0)
    num_blocks = 0
    base = core._base_decoder_list
    if base is not None:
        for base_manager in base:
            num_blocks += base_manager.get_num_blocks_to_allocate(request_id, need, (), total, main)
    else:
        for manager in core._decoder_managers:
            num_blocks += manager.get_num_blocks_to_allocate(request_id, need, (), total, main)
    if num_blocks > core.block_pool.free_block_queue.num_free_blocks - reserved:
        return None
    return _allocate_and_cache(core, request, request_id, num_blocks, need, main, 0, delay_cache_blocks)


def admit(
    core: CoordinatorState,
    request: RequestView,
    request_id: str,
    counts: AdmissionCounts,
    new_computed_blocks: KVCacheBlocks | None,
    full_sequence_must_fit: bool,
    delay_cache_blocks: bool,
    skip_zeroing_group_ids: tuple[int, ...],
) -> KVCacheBlocks | None:
    """A request's admission (its prefix hit, external and encoder tokens attached), or a call with any
    of the rarer counts: every check before anything changes."""
    new_tokens, new_computed, external = counts.new_tokens, counts.new_computed, counts.external
    encoder, watermark = counts.encoder, counts.watermark
    owner = core._admitted.get(request_id)
    if owner is not None and owner is not request:
        if core.check_admissions:
            raise SchedulingError(
                f"Request id {request_id!r} is in use by a live request (another Request object): free "
                "that one first, or give this one its own id."
            )
        core._admitted[request_id] = request  # the engine's new object for the same request
    attach = owner is None or new_computed_blocks is not None
    if owner is None and core.check_admissions:
        _check_admission(core, request, new_computed, new_computed_blocks)
    if attach and core.enable_caching and owner is None:
        _check_hasher(core, request)
    if new_computed_blocks is not None:
        _check_blocks_are_ours(core, new_computed_blocks)
    if new_tokens == 0 and external == 0 and new_computed == 0:
        # A step may schedule no token of its own and still adopt computed ones: an external load,
        # or a prefix hit whose first chunk ends inside the range the engine replays.
        raise SchedulingError(
            "num_new_tokens must be greater than 0 when there are no computed tokens to adopt "
            "(a prefix hit or external tokens)."
        )
    computed = core._empty.blocks if new_computed_blocks is None else new_computed_blocks.blocks
    # The token targets, computed once for every group (see count_new_blocks for encoder groups).
    max_len = core.max_model_len
    local = request.num_computed_tokens + new_computed
    total = local + external
    if total > max_len:
        total = max_len
    main = total + new_tokens
    need = main + counts.lookahead
    if need > max_len:
        need = max_len
    _note_prefill_end(core, request, request_id)
    if full_sequence_must_fit:
        whole = min(request.num_tokens, max_len)
        free = core.block_pool.free_block_queue.num_free_blocks
        needed = count_new_blocks(core, request_id, whole, whole, computed, total, encoder, True, local)
        if needed + watermark > free:
            return None
    _remove_skipped(core, request, request_id, total, counts.in_flight)
    if attach or encoder:
        num_blocks = count_new_blocks(core, request_id, need, main, computed, total, encoder, False, local)
    else:
        num_blocks = 0
        for manager in core._decoder_managers:
            num_blocks += manager.get_num_blocks_to_allocate(request_id, need, (), total, main)
    if num_blocks + watermark > core.block_pool.free_block_queue.num_free_blocks - counts.reserved:
        return None
    if attach:
        _attach(core, request, request_id, computed, local, external, new_computed, skip_zeroing_group_ids)
    return _allocate_and_cache(core, request, request_id, num_blocks, need, main, encoder, delay_cache_blocks)


def _note_prefill_end(core: CoordinatorState, request: RequestView, request_id: str) -> None:
    """Tell the managers that reserve by it where the request's prefill ends (before they count)."""
    if core._prefill_end_managers:
        # Where the scheduler's prefill ends: `num_tokens - 1` covers a request resuming its output.
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        for noting in core._prefill_end_managers:
            noting.note_prefill_end(request_id, prefill_end)


def _remove_skipped(
    core: CoordinatorState, request: RequestView, request_id: str, total: int, in_flight: int
) -> None:
    """Free the blocks that fell out of a window, behind the processed tokens (before counting)."""
    if core._skipping_managers:
        prompt = request.num_prompt_tokens
        processed = total - in_flight if total > in_flight else 0
        for manager in core._skipping_managers:
            manager.remove_skipped_blocks(request_id, processed, prompt)


def _attach(
    core: CoordinatorState,
    request: RequestView,
    request_id: str,
    computed: tuple[Sequence[KVCacheBlock], ...],
    local: int,
    external: int,
    new_computed: int,
    skip_zeroing_group_ids: tuple[int, ...],
) -> None:
    """Take the prefix hit's blocks and blocks for external tokens in every group; the request is
    admitted from here on."""
    if (
        external
        and (core._two_phase_external or (skip_zeroing_group_ids and core._every_decoder_attaches_external))
        and request_id not in core._admitted
    ):
        # Every group's hit blocks are taken before any group allocates for external tokens, or
        # that allocation could evict a later group's hit and hand one block out twice.
        for gid, attacher in core._external_attachers:
            attacher.add_local_computed_blocks(request_id, computed[gid], local, external)
        for gid, attacher in core._external_attachers:
            attacher.allocate_external_computed_blocks(
                request_id, local, external, gid not in skip_zeroing_group_ids
            )
    else:
        for gid, manager in core._decoder_groups:
            manager.allocate_new_computed_blocks(request_id, computed[gid], local, external)
    for _, manager in core._encoder_groups:
        manager.allocate_new_computed_blocks(request_id, (), 0, 0)
    core._admitted[request_id] = request
    if core.block_pool.eviction_policy is not None and new_computed:
        for group_blocks in computed:
            core.block_pool.note_hit(request, group_blocks)


def _allocate_and_cache(
    core: CoordinatorState,
    request: RequestView,
    request_id: str,
    num_blocks: int,
    need: int,
    main: int,
    encoder: int,
    delay_cache_blocks: bool,
) -> KVCacheBlocks:
    """Take the ``num_blocks`` counted (they fit) and publish the blocks the request completed."""
    if not num_blocks:
        result = core._empty
    elif not core._encoder_groups:
        base_all = core._base_all
        if base_all is not None:
            result = KVCacheBlocks(tuple([m.allocate_new_blocks(request_id, need, main) for m in base_all]))
        else:
            result = KVCacheBlocks(
                tuple([manager.allocate_new_blocks(request_id, need, main) for manager in core.managers])
            )
    else:
        cross = core._is_cross
        result = KVCacheBlocks(
            tuple(
                [
                    (manager.allocate_new_blocks(request_id, encoder, encoder) if encoder else [])
                    if cross[gid]
                    else manager.allocate_new_blocks(request_id, need, main)
                    for gid, manager in enumerate(core.managers)
                ]
            )
        )
    if core.enable_caching and not delay_cache_blocks:
        if isinstance(request, Request):  # a native read in the compiled build (see allocate_slots)
            num_tokens = len(request.all_token_ids)
        else:
            num_tokens = len(request.all_token_ids)
        if main < num_tokens:
            num_tokens = main
        scheduler_block = core.scheduler_block_size
        # Most decode steps complete no block: skip the call (cache_blocks would return at once).
        if (
            core._eagle_group_ids
            or core._cache_every_call
            or core._cached_tokens.get(request_id, -1) < num_tokens // scheduler_block * scheduler_block
        ):
            cache_computed_blocks(core, request, num_tokens)
    return result


def _check_admission(
    core: CoordinatorState, request: RequestView, new_computed: int, new_computed_blocks: KVCacheBlocks | None
) -> None:
    """A request's first allocation: its prompt fits max_model_len, and the computed tokens it claims are
    backed by hit blocks in every per-token decoder group (what ``get_computed_blocks`` returned: a block
    per hit block, null blocks standing for those a window dropped). Once per request,
    never on the per-step path."""
    if request.num_prompt_tokens > core.max_model_len:
        raise SchedulingError(
            f"Request {request.request_id!r} has a prompt of {request.num_prompt_tokens:,} tokens, over "
            f"max_model_len {core.max_model_len:,}; an engine refuses it before it reaches the cache."
        )
    if not new_computed:
        return
    blocks = () if new_computed_blocks is None else new_computed_blocks.blocks
    for gid, _ in core._decoder_groups:
        traits = core.traits[gid]
        if traits.fixed_state_per_request or not traits.prefix_cacheable:
            continue  # a state or ring group's hit is one state; a never-cached group has no hit
        held = len(blocks[gid]) * core.group_block_sizes[gid] if gid < len(blocks) else 0
        if held < new_computed:
            raise SchedulingError(
                f"Request {request.request_id!r} claims {new_computed:,} computed tokens, but group {gid}'s "
                f"hit blocks hold {held:,}; pass the blocks and token count get_computed_blocks returned."
            )


def _check_hasher(core: CoordinatorState, request: RequestView) -> None:
    """A request is hashed with this coordinator's block size (with prefix caching, hashes are read)."""
    hasher = request.block_hasher
    if hasher is None or hasher.block_size != core.hash_block_size:
        got = "no block_hasher" if hasher is None else f"a block_hasher of {hasher.block_size} tokens"
        raise SchedulingError(
            f"Request {request.request_id!r} has {got}, but this coordinator hashes blocks of "
            f"{core.hash_block_size} tokens; build it with block_hasher=coordinator.make_block_hasher()."
        )


def _check_blocks_are_ours(core: CoordinatorState, new_computed_blocks: KVCacheBlocks) -> None:
    """Blocks handed back to allocate_slots come from this pool. One block per group is tested: a hit
    list is one coordinator's or another's, and any block of another pool fails the identity test."""
    groups = new_computed_blocks.blocks
    if len(groups) != len(core.specs):
        raise SchedulingError(
            f"new_computed_blocks has {len(groups)} groups; this coordinator has {len(core.specs)}."
        )
    blocks = core.block_pool.blocks
    for group in groups:
        if group:
            block = group[-1]
            if not (0 <= block.block_id < len(blocks)) or blocks[block.block_id] is not block:
                raise SchedulingError(
                    f"new_computed_blocks holds block {block.block_id}, which is not a block of this "
                    "coordinator's pool; pass what this coordinator's get_computed_blocks returned."
                )


def count_new_blocks(
    coord: CoordinatorState,
    request_id: str,
    num_tokens: int,
    num_tokens_main_model: int,
    computed: tuple[Sequence[KVCacheBlock], ...],
    total_computed: int,
    num_encoder_tokens: int,
    apply_admission_cap: bool,
    num_local_computed: int = 0,
) -> int:
    """Free-queue blocks allocate_slots would take: decoder groups up to ``num_tokens`` (with the hit blocks
    ``computed`` attached), encoder-sized groups up to ``num_encoder_tokens`` with no hit (nothing when it
    is 0: the encoder input was allocated at admission)."""
    total = 0
    partial = coord.partial_hash_hits and num_local_computed > 0
    sizes = coord.group_block_sizes
    for gid, manager in coord._decoder_groups:
        total += manager.get_num_blocks_to_allocate(
            request_id, num_tokens, computed[gid], total_computed, num_tokens_main_model, apply_admission_cap
        )
        if partial and computed[gid] and num_local_computed % sizes[gid]:
            total += 1  # the hit ends inside this group's block: its private copy (copy on write)
    if num_encoder_tokens:
        for _, manager in coord._encoder_groups:
            total += manager.get_num_blocks_to_allocate(
                request_id, num_encoder_tokens, (), 0, num_encoder_tokens, apply_admission_cap
            )
    return total


def cache_computed_blocks(coord: CoordinatorState, request: RequestView, num_computed_tokens: int) -> None:
    """Publish the request's full blocks up to ``num_computed_tokens`` (aligned for hybrids)."""
    if not coord.enable_caching:
        return
    if coord._publish_only_hashed and not coord.partial_hash_hits:
        # A block's hash may come later (lookahead hashes wait for the tokens after it): publish what is hashed.
        # (With sub-block hits each manager bounds its full blocks by the hashes instead: a state keyed inside
        # a block must see the tokens really computed.)
        hashed = len(request.block_hashes) * coord.hash_block_size
        if hashed < num_computed_tokens:
            num_computed_tokens = hashed
    scheduler_block = coord.scheduler_block_size
    # The last tokens a multi-module MTP drafter may re-prefill are not final: not published yet.
    reprefillable = coord.num_reprefillable_tokens
    single = len(coord.specs) == 1
    if reprefillable and single:
        num_computed_tokens = (
            num_computed_tokens - reprefillable if num_computed_tokens > reprefillable else 0
        )
    # Sub-block hits publish every computed token: a hit may end on any hash-block boundary.
    aligned = (
        num_computed_tokens
        if coord.partial_hash_hits
        else num_computed_tokens // scheduler_block * scheduler_block
    )
    if not coord._eagle_group_ids:
        # Nothing new to publish until another scheduler block is complete (the common decode step).
        if coord._cached_tokens.get(request.request_id, -1) >= aligned and not coord._cache_every_call:
            return
        coord._cached_tokens[request.request_id] = aligned
    groups = coord._caching_groups
    if single:
        base = coord._single_caching_base
        if base is not None:
            base.cache_blocks(request, num_computed_tokens)
        elif groups:
            groups[0][1].cache_blocks(request, num_computed_tokens)
        return
    finalized = num_computed_tokens - reprefillable if num_computed_tokens > reprefillable else 0
    finalized_aligned = (
        finalized if coord.partial_hash_hits else finalized // scheduler_block * scheduler_block
    )
    tails = coord._tail_groups
    for gid, manager in groups:
        n = aligned
        if gid in coord._eagle_group_ids and aligned > 0:
            # An EAGLE hit matches one block past the aligned boundary and drops it: that block is cached.
            n = min(
                finalized,
                finalized_aligned + coord.group_block_sizes[gid],
            )
        manager.cache_blocks(request, n)
        if tails and gid in tails:
            tails[gid](request, n)


def not_a_request(method: str, request: object) -> KVSpecTypeError:
    return KVSpecTypeError(
        f"{method} takes the Request (a kvspec Request or an engine's RequestView), got "
        f"{type(request).__name__} {request!r:.60}; pass the object, not its id."
    )


def free_request(coord: CoordinatorState, request_id: str) -> None:
    coord._admitted.pop(request_id, None)
    coord._cached_tokens.pop(request_id, None)
    base = coord._base_all
    if base is not None:
        for base_manager in base:
            base_manager.free(request_id)
        return
    for manager in coord.managers:
        manager.free(request_id)
