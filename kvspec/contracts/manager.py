"""What a manager implements, and the parameter objects it receives: the narrow, documented manager API.

A manager is built from one :class:`ManagerContext`; a hit search receives one :class:`HitQuery` and answers
one :class:`HitResult`. The hooks a plugin manager usually overrides are documented in
``kvspec.managers.base``; the registry checks every member's signature against :class:`KVCacheManager`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar, runtime_checkable

from kvspec.blocks.pool import BlockPool, KVCacheBlock
from kvspec.blocks.request_view import RequestView
from kvspec.contracts.release import DEFAULT_PROFILE, ReleaseProfile
from kvspec.contracts.spec import KVCacheSpec
from kvspec.contracts.traits import SpecTraits, traits_of


@dataclass(frozen=True, kw_only=True, slots=True)
class ManagerContext:
    """Everything a manager is built from (one KV cache group); passed as the constructor's only argument.

    Units: ``scheduler_block_size`` and ``block_size`` in tokens; ``max_admission_blocks_per_request`` in
    blocks (None: no cap). ``block_size`` is the tokens one block holds (the spec's block size, or its
    declared ``SpecTraits.tokens_per_block``) times the context-parallel size. ``max_model_len`` and
    ``max_num_batched_tokens`` (tokens; None outside a coordinator) are the scheduler's limits, for
    managers that size their own caps.
    ``prefix_cache_retention_interval`` (tokens; None: dense) makes windowed managers cache sparsely: the
    window's tail once per interval, plus the tail at the latest boundary a replay of the prompt can hit
    (0: only that one).
    """

    kv_cache_spec: KVCacheSpec
    traits: SpecTraits
    block_pool: BlockPool
    kv_cache_group_id: int
    scheduler_block_size: int
    enable_caching: bool = True
    dcp_world_size: int = 1
    pcp_world_size: int = 1
    max_admission_blocks_per_request: int | None = None
    use_eagle: bool = False
    #: Some group of the model drafts with EAGLE (this one or another): vLLM 0.34 then retains a
    #: prompt's replay boundary one scheduler block lower in every group (``replay_boundaries``).
    model_uses_eagle: bool = False
    prefix_cache_retention_interval: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    #: The vLLM release whose behaviour the manager reproduces (``kvspec.contracts.release``).
    profile: ReleaseProfile = DEFAULT_PROFILE
    #: Whether the manager reports its new block ids for zeroing (``take_new_block_ids``); None: the spec's
    #: ``zero_new_blocks`` trait. An engine whose zeroing policy is its own sets it (vLLM 0.34: every
    #: attention group when the model needs zeroing, none otherwise).
    zero_new_blocks: bool | None = None
    #: Sub-block prefix hits are on (vLLM 0.34's partial hash hits; see ``KVCacheCoordinator``'s
    #: ``allow_partial_hash_hits``): hits may end on any hash-block boundary, a hit ending inside one of this
    #: group's blocks is copied on write, and hits align to ``hash_block_size`` tokens instead of the
    #: scheduler block.
    partial_hash_hits: bool = False
    #: With sub-block hits and EAGLE: a state group also keys its state at the request's shared-prefix
    #: junction inside the prompt (vLLM 0.34's opt-in ``enable_mamba_shared_prefix_checkpoint``), where the
    #: engine ends a chunk, so that a sibling request resumes there rather than a block lower.
    shared_prefix_checkpoints: bool = False

    @property
    def block_size(self) -> int:
        tokens = self.traits.block_tokens(self.kv_cache_spec.block_size)
        return tokens * self.dcp_world_size * self.pcp_world_size

    @classmethod
    def for_spec(
        cls,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        *,
        kv_cache_group_id: int = 0,
        scheduler_block_size: int | None = None,
        enable_caching: bool = True,
        max_admission_blocks_per_request: int | None = None,
        use_eagle: bool = False,
    ) -> ManagerContext:
        """A context for one manager outside a coordinator (tests, tools): traits from the spec, the
        scheduler block defaulting to the spec's block size."""
        return cls(
            kv_cache_spec=kv_cache_spec,
            traits=traits_of(kv_cache_spec),
            block_pool=block_pool,
            kv_cache_group_id=kv_cache_group_id,
            scheduler_block_size=kv_cache_spec.block_size
            if scheduler_block_size is None
            else scheduler_block_size,
            enable_caching=enable_caching,
            max_admission_blocks_per_request=max_admission_blocks_per_request,
            use_eagle=use_eagle,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class BoundaryState:
    """A block holding a request's state exactly at ``num_tokens`` tokens, committed by a caching call: what a
    KV connector offloads under the prefix hash that ends there (vLLM 0.34's boundary-state offloads).

    ``block_id`` is exact: a state group's block table is not append-only (interior positions are null,
    speculative slots move), so a connector must never find the block by its position. The offer holds only
    until the request's blocks are freed; a connector that reads it later pins the block first.
    """

    request_id: str
    kv_cache_group_id: int
    block_id: int
    num_tokens: int


class HitQuery(NamedTuple):
    """One prefix-cache hit search over ``kv_cache_group_ids`` (groups with equal specs, searched together).

    Immutable; build it by keyword. (A NamedTuple rather than a frozen dataclass: one is built per
    request admission, and a tuple is built in half the time.)

    ``block_hashes`` are at the spec's block size; ``max_length`` (tokens) bounds the hit;
    ``alignment_tokens``: a hit must end on a multiple of it (the scheduler block in hybrids);
    ``use_eagle``: the last matched block is dropped (EAGLE recomputes it).
    ``fine_block_hashes``: with sub-block hits on (``ManagerContext.partial_hash_hits``) and a manager whose
    class sets ``supports_sub_block_hits``, the request's hashes at the pool's hash block
    (``alignment_tokens`` tokens each, smaller than the block): the hit may then end inside its last block
    at any multiple of ``alignment_tokens`` (reported in ``HitResult.num_tokens``), and EAGLE drops one hash
    block instead of a block. None otherwise.
    """

    block_hashes: Sequence[bytes]
    max_length: int
    kv_cache_group_ids: tuple[int, ...]
    block_pool: BlockPool
    kv_cache_spec: KVCacheSpec
    traits: SpecTraits
    use_eagle: bool
    alignment_tokens: int
    dcp_world_size: int = 1
    pcp_world_size: int = 1
    fine_block_hashes: Sequence[bytes] | None = None

    @property
    def block_tokens(self) -> int:
        """Tokens per block of the searched groups: the spec's block size as its traits count it (a
        compressed spec stores fewer), before any context-parallel scaling."""
        return self.traits.block_tokens(self.kv_cache_spec.block_size)


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockCopy:
    """A block copy the engine runs before the next forward pass: the content of block ``src_block_id``
    into block ``dst_block_id`` (vLLM 0.34's ``KVCacheBlockCopy``). A sub-block prefix hit shares a block
    the request must write into: the request gets a private copy (copy on write), or, for a running
    request that keeps writing its own block, the cache entry moves to the copy."""

    kv_cache_group_id: int
    src_block_id: int
    dst_block_id: int


class HitResult(NamedTuple):
    """A hit: one block list per queried group id (same order), all of one length; positions a spec
    never reads again hold the pool's null block. The hit is ``num_tokens`` tokens when the manager reports
    it (in the spec's logical tokens; at most ``num_blocks`` x the tokens a block holds), else
    ``num_blocks`` x the tokens a block holds."""

    blocks: tuple[list[KVCacheBlock], ...]
    num_tokens: int | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks[0]) if self.blocks else 0


@runtime_checkable
class KVCacheManager(Protocol):
    """Runs one KV cache group of one spec type (vLLM's SingleTypeKVCacheManager).

    Constructed as ``manager_cls(context)`` with a :class:`ManagerContext`. Most plugins subclass
    ``kvspec.managers.SingleTypeKVCacheManager`` and override only its hooks (``setup``,
    ``find_longest_cache_hit``, ``get_num_skipped_tokens``, ``reachable_block_mask``,
    ``get_num_common_prefix_blocks``); a from-scratch manager implements every member below (required),
    and the hooks of each capability it declares in ``manager_capabilities`` (optional; see
    :data:`MANAGER_CAPABILITIES`). This protocol and those are everything a coordinator calls.

    Invariants: every block it hands out comes from the shared ``BlockPool``; a block is referenced once per
    request that holds it (``iter_held_blocks`` yields each reference); ``free`` returns every block of a
    request to the pool. Units: ``num_tokens`` arguments are tokens, ``get_num_*`` return blocks.
    """

    def __init__(self, context: ManagerContext) -> None: ...

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """Blocks that allocating up to ``num_tokens`` would take out of the free queue (>= 0)."""
        ...

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Attach prefix-cache hits (and blocks for externally computed tokens) to a new request."""
        ...

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        """Append fresh blocks so the request can hold ``num_tokens`` tokens; return the new ones."""
        ...

    def cache_blocks(self, request: RequestView, num_tokens: int) -> None:
        """Publish the request's full blocks up to ``num_tokens`` in the prefix cache."""
        ...

    def free(self, request_id: str) -> None:
        """Release every block of the request (tail blocks become the first to be evicted)."""
        ...

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        """Forget the request as ``free`` does but hand its blocks (in allocation order, leading null blocks
        left out) to the caller instead of the pool; the caller releases them later, tail first, with
        ``BlockPool.free_blocks(reversed(blocks))`` (an engine whose in-flight step may still write them)."""
        ...

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, /, num_prompt_tokens: int | None = None
    ) -> None:
        """Free blocks that attention will never read again (outside the window, finished chunks).
        ``num_prompt_tokens`` (tokens; None where the caller does not know it) is for managers that free a
        gap after the prompt rather than a head (vLLM 0.34's R-SWA)."""
        ...

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """Leading blocks of the request that every request holding blocks shares (cascade attention)."""
        ...

    def get_blocks(self, request_id: str) -> Sequence[KVCacheBlock]:
        """The request's blocks in order (null blocks stand for skipped positions)."""
        ...

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> HitResult:
        """The longest prefix hit for ``query``, one block list per group id."""
        ...

    def new_step_starts(self) -> None:
        """Called once at the start of every scheduler step."""
        ...

    def iter_held_blocks(self) -> Iterator[KVCacheBlock]:
        """Every non-null block this manager holds a reference on, once per reference."""
        ...

    def take_new_block_ids(self) -> list[int]:
        """Ids of blocks allocated since the last call (for zeroing); clears the list."""
        ...


MgrT = TypeVar("MgrT", bound=KVCacheManager)


# -- capabilities: the optional hooks a manager declares ---------------------------------------------------

#: Capability names (``manager_capabilities``). Each names the hooks of one protocol below.
EXTERNAL_BLOCKS = "external_computed_blocks"
PROMPT_TAIL = "prompt_tail_entries"
CACHING_CADENCE = "caching_cadence"
PREFILL_END = "prefill_end"
BLOCK_COPIES = "block_copies"
SUB_BLOCK_HITS = "sub_block_hits"
BOUNDARY_STATES = "boundary_states"
RETENTION = "retention"
NEW_BLOCK_RECORDS = "new_block_records"


class AttachesExternalBlocks(Protocol):
    """``external_computed_blocks``: the two halves of ``allocate_new_computed_blocks`` (vLLM 0.34's manager
    interface): in a hybrid the coordinator takes every group's hit blocks before any group allocates blocks
    for a connector's external tokens (which could otherwise evict another group's hit), and a per-group
    zeroing choice (``skip_zeroing_group_ids``) needs the second half."""

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None: ...

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None: ...


class CachesPromptTails(Protocol):
    """``prompt_tail_entries``: register the prompt's last hash-block boundary inside a block as a partial
    prefix-cache entry (vLLM 0.34's pool; called for left-closed groups whose block is larger than the hash
    block)."""

    def cache_prompt_tail(self, request: RequestView, num_tokens: int) -> None: ...


class CachingCadence(Protocol):
    """``caching_cadence``: ``caches_on_every_call`` True makes the coordinator call ``cache_blocks`` on
    every allocation, not only when a scheduler block completes (vLLM 0.32's Mamba "align")."""

    @property
    def caches_on_every_call(self) -> bool: ...


class NeedsPrefillEnd(Protocol):
    """``prefill_end``: told where a request's prefill ends before its blocks are counted, when
    ``wants_prefill_end`` (vLLM 0.34's Mamba prefill checkpoints)."""

    wants_prefill_end: bool

    def note_prefill_end(self, request_id: str, prefill_end: int) -> None: ...


class CopiesBlocks(Protocol):
    """``block_copies`` (and ``sub_block_hits``, which needs them): the copies on write a sub-block hit
    queues, drained by the coordinator for the engine, and a finishing request's state keyed inside its
    own block. ``sub_block_hits`` further says ``find_longest_cache_hit`` honours
    ``HitQuery.fine_block_hashes`` (the hit may end inside its last block)."""

    def take_block_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]: ...

    def finalize_partial_tail(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int
    ) -> BoundaryState | None: ...


class OffersBoundaryStates(Protocol):
    """``boundary_states``: the state blocks committed at exact token boundaries, for a KV connector."""

    def take_boundary_states(self) -> list[BoundaryState]: ...


class RetentionAware(Protocol):
    """``retention``: follows a change of the prefix-cache retention interval from the next call on."""

    def set_prefix_cache_retention_interval(self, interval: int | None) -> None: ...


class RecordsNewBlocks(Protocol):
    """``new_block_records``: the request's blocks from a position on reported for zeroing again (a failed
    KV load left them unwritten), by a manager whose ``tracks_new_block_ids``."""

    @property
    def tracks_new_block_ids(self) -> bool: ...

    def record_new_block_ids(self, request_id: str, first_block: int) -> None: ...


#: Every capability a manager may declare, and the protocol whose members it then must have.
MANAGER_CAPABILITIES: dict[str, type] = {
    EXTERNAL_BLOCKS: AttachesExternalBlocks,
    PROMPT_TAIL: CachesPromptTails,
    CACHING_CADENCE: CachingCadence,
    PREFILL_END: NeedsPrefillEnd,
    BLOCK_COPIES: CopiesBlocks,
    SUB_BLOCK_HITS: CopiesBlocks,
    BOUNDARY_STATES: OffersBoundaryStates,
    RETENTION: RetentionAware,
    NEW_BLOCK_RECORDS: RecordsNewBlocks,
}


def declared_capabilities(manager_cls: type) -> frozenset[str]:
    """The capabilities ``manager_cls`` declares in its ``manager_capabilities`` class attribute (an
    iterable of the names in ``MANAGER_CAPABILITIES``; none when absent). The registry checks, when the
    class is registered, that every declared capability's hooks are there with the protocol's parameters;
    the coordinator calls a hook only on the managers that declare it. ``SingleTypeKVCacheManager``
    declares every capability but ``sub_block_hits``."""
    return frozenset(getattr(manager_cls, "manager_capabilities", ()))
