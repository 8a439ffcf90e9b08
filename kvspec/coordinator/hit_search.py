"""Prefix-cache hit search across KV cache groups: the longest prefix that every group can serve.

Groups with equal specs are searched together (one query, a hit must exist in all of them). Groups whose
spec declares left-closed hits (``SpecTraits.prefix_hits_left_closed``, full attention) are searched first:
any shorter prefix of their hit is a hit too, so later passes only truncate them. Other groups are searched
again until the common length stops shrinking (a fixed point).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.blocks.hashing import BlockHashListWithBlockSize
from kvspec.blocks.pool import BlockPool, KVCacheBlock
from kvspec.contracts.manager import SUB_BLOCK_HITS, HitQuery, KVCacheManager, declared_capabilities
from kvspec.contracts.release import HitSearchRules
from kvspec.contracts.spec import KVCacheSpec
from kvspec.contracts.traits import SpecTraits

#: One block list per KV cache group (outer index = group id).
GroupBlocks = tuple[list[KVCacheBlock], ...]


@dataclass(frozen=True, slots=True)
class SpecGroup:
    """Groups with one equal spec, searched by one query of their manager class."""

    spec: KVCacheSpec
    traits: SpecTraits
    group_ids: tuple[int, ...]
    manager_cls: type[KVCacheManager]
    use_eagle: bool
    #: Copied from the traits and the spec: the hybrid search reads them in its inner loop.
    left_closed: bool = False
    #: Tokens per block of these groups: the spec's block size times the context-parallel sizes (a block
    #: spans the CP ranks); hashes are regrouped to it.
    block_size: int = 0
    #: The decode / prefill context-parallel ranks one block of these groups spans.
    dcp_world_size: int = 1
    pcp_world_size: int = 1


def shared_prefix_junction(num_hit_tokens: int, uncached: int) -> int:
    """Where a lookup's longest single-group hit ended (tokens; 0: no group reached past the common hit of
    ``num_hit_tokens``, ``uncached`` being ``find_with_uncached``'s third value): the junction an engine
    pins (``Request.shared_prefix_boundary``) so that the lagging groups cache it."""
    return num_hit_tokens + uncached if uncached else 0


def split_spec_groups(
    specs: Sequence[KVCacheSpec],
    traits: Sequence[SpecTraits],
    managers: Sequence[KVCacheManager],
    eagle_group_ids: frozenset[int],
    group_context_parallel: Sequence[tuple[int, int]] | None = None,
) -> tuple[SpecGroup, ...]:
    """Groups with equal specs together; left-closed ones first (stable otherwise). ``group_context_parallel``:
    the (DCP, PCP) ranks each group's block spans (None: one rank)."""
    cp = [(1, 1)] * len(specs) if group_context_parallel is None else list(group_context_parallel)
    by_spec: dict[KVCacheSpec, list[int]] = {}
    for gid, spec in enumerate(specs):
        if traits[gid].prefix_cacheable:  # a group never cached is left out of the search
            by_spec.setdefault(spec, []).append(gid)
    out = [
        SpecGroup(
            spec=spec,
            traits=traits[gids[0]],
            group_ids=tuple(gids),
            manager_cls=type(managers[gids[0]]),
            use_eagle=any(g in eagle_group_ids for g in gids),
            left_closed=traits[gids[0]].prefix_hits_left_closed,
            block_size=traits[gids[0]].block_tokens(spec.block_size) * cp[gids[0]][0] * cp[gids[0]][1],
            dcp_world_size=cp[gids[0]][0],
            pcp_world_size=cp[gids[0]][1],
        )
        for spec, gids in by_spec.items()
    ]
    out.sort(key=lambda g: not g.left_closed)
    return tuple(out)


class PrefixHitSearch:
    """Finds the longest common prefix hit of a request over every group of one coordinator.

    Units: ``max_length`` and hit lengths in tokens; block hashes are at ``hash_block_size`` tokens and
    are regrouped to each spec's block size on the fly.
    """

    def __init__(
        self,
        *,
        spec_groups: tuple[SpecGroup, ...],
        num_groups: int,
        block_pool: BlockPool,
        hash_block_size: int,
        scheduler_block_size: int,
        rules: HitSearchRules,
        partial_hash_hits: bool = False,
    ) -> None:
        self.spec_groups = spec_groups
        # Sub-block hits: a group whose manager supports them searches the hash-block hashes too, and
        # every hit aligns to the hash block.
        self._fine = tuple(
            partial_hash_hits and SUB_BLOCK_HITS in declared_capabilities(g.manager_cls) for g in spec_groups
        )
        # How far past the candidate an EAGLE group's search may look (tokens): one block (one hash block
        # for a sub-block search), except for a group of state snapshots under 0.34
        # (HitSearchRules.eagle_margin_for_state_groups).
        self._eagle_margin = tuple(
            0
            if g.traits.hits_at_own_block_boundaries and not rules.eagle_margin_for_state_groups
            else (hash_block_size if fine and g.block_size > hash_block_size else g.block_size)
            for g, fine in zip(spec_groups, self._fine, strict=True)
        )
        self._partial = partial_hash_hits
        self._alignment = hash_block_size if partial_hash_hits else scheduler_block_size
        # HitSearchRules.eagle_margin_within_hashes: how far an EAGLE group's search may reach past the
        # candidate length (the request's hashed tokens, 0.34; the search's maximum, 0.23).
        self.eagle_margin_within_hashes = rules.eagle_margin_within_hashes
        self.num_groups = num_groups
        self.block_pool = block_pool
        self.hash_block_size = hash_block_size
        self.scheduler_block_size = scheduler_block_size
        if len(spec_groups) == 1:
            group = spec_groups[0]
            # Single-group search, precomputed: the alignment of a hit.
            self._single_alignment = (
                self._alignment if num_groups > 1 or partial_hash_hits else group.block_size
            )

    def _hash_view(self, hashes: Sequence[bytes], block_size: int) -> Sequence[bytes]:
        if block_size == self.hash_block_size:
            return hashes
        return BlockHashListWithBlockSize(
            hashes, self.hash_block_size, block_size, self.block_pool.coarse_hash_is_last_fine
        )

    def find(self, block_hashes: Sequence[bytes], max_length: int) -> tuple[GroupBlocks, int]:
        """(blocks per group, hit tokens): the longest prefix of at most ``max_length`` tokens; a group left
        out of the search (not prefix-cacheable) gets no block."""
        blocks, length, _ = self.find_with_uncached(block_hashes, max_length)
        return blocks, length

    def find_with_uncached(
        self, block_hashes: Sequence[bytes], max_length: int
    ) -> tuple[GroupBlocks, int, int]:
        """``find``'s answer and the uncached shared prefix (tokens): how far the longest single group's hit
        reached past the common hit. A group that caches sparsely (sliding window or Mamba under retention)
        lags the others at a prefix two requests share; the engine may stop a chunk there so that group
        caches it (vLLM 0.34's ``shared_prefix_boundary``). 0 for a single group."""
        if not self.spec_groups:
            return tuple([] for _ in range(self.num_groups)), 0, 0
        if len(self.spec_groups) == 1:
            blocks, length = self._single(block_hashes, max_length)
            return blocks, length, 0
        return self._hybrid(block_hashes, max_length)

    def find_per_group(
        self, block_hashes: Sequence[bytes], max_length: int
    ) -> tuple[GroupBlocks, tuple[int, ...]]:
        """Each spec group's own longest hit of at most ``max_length`` tokens, searched independently (no
        agreement between groups): (blocks per group, hit tokens per group). The hits may diverge: under
        block pressure a full-attention tail can be evicted while a deeper Mamba state survives, or the
        reverse. Only a KV connector that can supply the missing part uses this (vLLM 0.34's
        ``find_longest_cache_hit_per_group``); the engine's hit is ``find``'s. A group left out of the
        search (not prefix-cacheable) gets no block and 0."""
        per_group: list[list[KVCacheBlock]] = [[] for _ in range(self.num_groups)]
        lengths = [0] * self.num_groups
        hashed = len(block_hashes) * self.hash_block_size
        for idx, (group, margin) in enumerate(zip(self.spec_groups, self._eagle_margin, strict=True)):
            limit = min(max_length + margin, hashed) if group.use_eagle else max_length
            alignment = self._alignment if self.num_groups > 1 or self._partial else group.block_size
            found, length = self._search_alone(group, block_hashes, limit, alignment, self._fine[idx])
            for gid, blocks in zip(group.group_ids, found):
                per_group[gid] = blocks
                lengths[gid] = length
        return tuple(per_group), tuple(lengths)

    def _search_alone(
        self,
        group: SpecGroup,
        block_hashes: Sequence[bytes],
        max_length: int,
        alignment: int,
        fine: bool = False,
    ) -> tuple[GroupBlocks, int]:
        """One spec group's hit of at most ``max_length`` tokens ending on a multiple of ``alignment``: its
        blocks (one list per group id of the spec group) and tokens."""
        hit = group.manager_cls.find_longest_cache_hit(
            HitQuery(
                block_hashes=self._hash_view(block_hashes, group.block_size),
                max_length=max_length,
                kv_cache_group_ids=group.group_ids,
                block_pool=self.block_pool,
                kv_cache_spec=group.spec,
                traits=group.traits,
                use_eagle=group.use_eagle,
                alignment_tokens=alignment,
                dcp_world_size=group.dcp_world_size,
                pcp_world_size=group.pcp_world_size,
                fine_block_hashes=block_hashes if fine else None,
            )
        )
        found = hit.blocks
        return found, len(found[0]) * group.block_size if hit.num_tokens is None else hit.num_tokens

    def _single(self, block_hashes: Sequence[bytes], max_length: int) -> tuple[GroupBlocks, int]:
        group = self.spec_groups[0]
        blocks_found, length = self._search_alone(
            group, block_hashes, max_length, self._single_alignment, self._fine[0]
        )
        if self.num_groups == 1:
            return blocks_found, length
        per_group: list[list[KVCacheBlock]] = [[] for _ in range(self.num_groups)]
        for gid, blocks in zip(group.group_ids, blocks_found):
            per_group[gid] = blocks
        return tuple(per_group), length

    def _hybrid(self, block_hashes: Sequence[bytes], max_length: int) -> tuple[GroupBlocks, int, int]:
        """Fixed point, as vLLM 0.23.0 runs it: each group in turn is searched up to the length the group
        before it reached; a pass that ends shorter than it began starts another. A left-closed group is
        searched once and then only bounds the length. An EAGLE group searches one block further and drops
        its last block, once per candidate length (a group's shortening invalidates the others' drops).

        One departure: a pass may end with a group holding fewer, or (a Mamba group extended by EAGLE, whose
        search ignores the drop) more, blocks than the common length; vLLM returns that as it is. kvspec
        searches every group again at that length without the EAGLE extension until they agree, so each
        group's hit is exactly the common hit."""
        hit_length = max_length
        longest = 0
        # An EAGLE group's reach past the candidate: the search's maximum (0.23) or the hashed tokens (0.34).
        reach = len(block_hashes) * self.hash_block_size if self.eagle_margin_within_hashes else max_length
        groups = self.spec_groups
        margins = self._eagle_margin
        results: list[GroupBlocks | None] = [None] * len(groups)
        # Each group's hit in tokens as its manager reported it (HitResult.num_tokens, else its blocks).
        lengths = [0] * len(groups)
        verified: set[int] = set()
        pool, alignment = self.block_pool, self._alignment
        fines = self._fine
        # One full-attention group and one other: the other's hit bounds the first; one pass decides.
        simple = len(groups) == 2 and groups[0].left_closed
        while True:
            current = hit_length
            for idx, group in enumerate(groups):
                bs = group.block_size
                if group.left_closed and results[idx] is not None:
                    # Any shorter prefix of a left-closed hit is a hit (a sub-block one too).
                    current = min(
                        current // alignment * alignment if fines[idx] else current // bs * bs, lengths[idx]
                    )
                    continue
                drop = group.use_eagle and idx not in verified
                # Positional construction (in HitQuery's field order): this runs per request admission.
                query = HitQuery(
                    self._hash_view(block_hashes, bs),
                    min(current + margins[idx], reach) if drop else current,
                    group.group_ids,
                    pool,
                    group.spec,
                    group.traits,
                    drop,
                    alignment,
                    group.dcp_world_size,
                    group.pcp_world_size,
                    block_hashes if fines[idx] else None,
                )
                answer = group.manager_cls.find_longest_cache_hit(query)
                found = answer.blocks
                results[idx] = found
                length = len(found[0]) * bs if answer.num_tokens is None else answer.num_tokens
                lengths[idx] = length
                if drop:
                    verified.add(idx)
                elif length < current:
                    verified.clear()
                current = length
                if length > longest:
                    longest = length
            if current < hit_length:
                hit_length = current
                if not simple:
                    continue
            if self._agree(lengths, hit_length):
                break
            verified = set(range(len(groups)))
        per_group: list[list[KVCacheBlock]] = [[] for _ in range(self.num_groups)]
        for group, kept in zip(groups, results, strict=True):
            assert kept is not None
            keep = -(hit_length // -group.block_size)  # a reported hit may end inside its last block
            for gid, blocks in zip(group.group_ids, kept):
                del blocks[keep:]
                per_group[gid] = blocks
        return tuple(per_group), hit_length, max(longest - hit_length, 0)

    def _agree(self, lengths: Sequence[int], hit_length: int) -> bool:
        """Every group's hit is exactly ``hit_length`` tokens (a left-closed group's at least as many)."""
        for group, length in zip(self.spec_groups, lengths):
            if length < hit_length or (length > hit_length and not group.left_closed):
                return False
        return True
