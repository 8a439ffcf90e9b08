"""Hybrid-aware eviction: recency plus recompute cost saved per byte, coherent across KV cache groups.

For hybrid models (sliding window beside full attention, Mamba beside attention) LRU treats every block
alike. After Marconi (Pan et al., MLSys 2025), this policy ranks a free cached block by

    score = release order + alpha * num_blocks * (1 - e_min / e)

where ``e`` is the tokens of prefix the block saves recomputing per byte of its page: a block's own tokens
for attention, the whole prefix before it for a state snapshot (Mamba), whose one page stands for all of
it; ``e_min`` is the smallest per-block figure of the model's groups. Attention blocks of equal pages get
no bonus (their order is LRU); a state standing for a long prefix is kept up to ``alpha * num_blocks``
releases longer. The lowest score is evicted first.

Coherence: once a block of a group that every longer hit needs (full attention) is evicted, the free
attention blocks of the other groups at the same prefix position (sliding window) serve no hit until a
request recomputes that position, which recomputes them too; they are evicted next, before any block that
still could (unless a copy of the evicted content is still free: then the position still serves hits).
State snapshots at that position are not: a later request recomputing the attention brings
their hit back, and a state returns only where a chunk ends again (on Jamba 1.5 Mini and the conversation
trace, dooming states and copies cost 0.013 of the token hit rate at 113 GiB; without, the policy is within
0.0003 of LRU there).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

from kvspec.blocks.eviction import BlockUse, EvictionContext
from kvspec.blocks.hashing import get_group_id, group_suffix
from kvspec.eviction._heap import ScoredBlocks

if TYPE_CHECKING:
    from kvspec.blocks.block import KVCacheBlock


class HybridAwarePolicy:
    """Score = release order + cost-per-byte bonus; evicting a left-closed group's block dooms its peers.

    Bookkeeping per block is kept to what a victim can need. Only blocks of groups whose blocks an eviction
    can doom (attention groups but the model's one left-closed group) are indexed by prefix position; those
    are few under sparse retention. The left-closed group's own blocks, the most numerous, are not: whether
    a victim's content has another free copy is asked of the pool's prefix-cache map (``cached_blocks``),
    and only when the victim has peers to doom. Without that lookup (a policy built outside a pool) every
    attention block is indexed, as the copy check then needs."""

    __slots__ = (
        "_anchor_suffix",
        "_bonus_of",
        "_bonus_scale",
        "_cached_blocks",
        "_doomed",
        "_dooms",
        "_e_min",
        "_groups",
        "_heap",
        "_indexed",
        "_needed",
        "_needed_last_byte",
        "_no_bonus",
        "_peers",
        "_prefix_of",
        "_seq",
        "alpha",
        "coherent",
    )

    #: Scores come from release order and the groups alone: the pool need not tell it who uses blocks.
    watches_block_use: ClassVar[bool] = False

    def __init__(self, context: EvictionContext, alpha: float = 0.5, coherent: bool = True) -> None:
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha!r}")
        self.alpha = alpha
        self.coherent = coherent
        groups = context.groups
        self._groups = groups
        self._e_min = min((g.block_tokens / g.page_bytes for g in groups), default=1.0)
        self._bonus_scale = alpha * context.num_blocks
        #: group id -> the bonus of its blocks; -1.0 for state groups, whose bonus depends on the block
        self._bonus_of = [
            -1.0 if g.holds_prefix_state else self._bonus(g.block_tokens, g.page_bytes) for g in groups
        ]
        self._heap = ScoredBlocks()
        self._seq = 0
        self._cached_blocks: Callable[[bytes], Sequence[KVCacheBlock]] | None = context.cached_blocks
        needed = [gid for gid, g in enumerate(groups) if g.needed_by_longer_hits]
        attention = [gid for gid, g in enumerate(groups) if not g.holds_prefix_state]
        # A victim of a left-closed group dooms the free attention blocks of the other groups at its position.
        self._dooms = coherent and bool(needed) and len(attention) > 1
        if not self._dooms:
            indexed: set[int] = set()
        elif len(needed) == 1 and self._cached_blocks is not None:
            indexed = set(attention) - set(needed)  # its own copies are asked of the pool's map
        else:
            indexed = set(attention)
        #: group id -> whether its free blocks are indexed by prefix position
        self._indexed = [gid in indexed for gid in range(len(groups))]
        #: group id -> whether it is left-closed (its victims doom peers)
        self._needed = [g.needed_by_longer_hits for g in groups]
        # Where peers at a position are filed (their anchor): with one left-closed group that is not indexed,
        # that group's key there, so its victims find them by their own key (its hash is cached), with no
        # slicing; else the position itself (the hash without its group).
        self._anchor_suffix: bytes | None = (
            group_suffix(needed[0]) if len(needed) == 1 and not self._indexed[needed[0]] else None
        )
        # With 256 groups or fewer a key's last byte is its group id: a victim of another group than the one
        # left-closed group finds no peers filed under its key, and is told apart without a lookup.
        self._needed_last_byte = needed[0] if self._anchor_suffix is not None and len(groups) <= 256 else -1
        # Every block scores its release order (equal pages and no state snapshots, one group among them):
        # adds go to the plain list in one pass.
        self._no_bonus = all(bonus == 0.0 for bonus in self._bonus_of)
        #: a position's anchor -> the indexed free blocks cached there
        self._peers: dict[bytes, list[KVCacheBlock]] = {}
        #: block id -> the anchor it is filed under, while it is free and indexed
        self._prefix_of: list[bytes | None] = [None] * context.num_blocks
        #: (block, release number) of free blocks that can serve no hit any more, evicted first
        self._doomed: deque[tuple[KVCacheBlock, int]] = deque()

    def _bonus(self, tokens: int, page_bytes: int) -> float:
        e = tokens / page_bytes
        return self._bonus_scale * (1.0 - self._e_min / e) if e > self._e_min else 0.0

    def bonus(self, block: KVCacheBlock) -> float:
        """The score bonus of ``block``'s cached content (releases it is kept longer than LRU would)."""
        key = block.block_hash
        if key is None or not self._groups:
            return 0.0
        gid = get_group_id(key)
        if gid >= len(self._groups):
            return 0.0
        bonus = self._bonus_of[gid]
        if bonus >= 0.0:
            return bonus
        group = self._groups[gid]
        tokens = group.block_tokens
        if block.block_hash_num_tokens is not None:
            tokens = max(tokens, block.block_hash_num_tokens)
        return self._bonus(tokens, group.page_bytes)

    def add(self, block: KVCacheBlock) -> None:
        self.add_blocks((block,))

    def add_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
        if self._no_bonus:
            self._heap.extend_plain(blocks, self._seq)
            self._seq += len(blocks)
            if self._dooms:
                self._index(blocks)
            return
        heap, bonus_of = self._heap, self._bonus_of
        num_groups = len(bonus_of)
        small = num_groups <= 256  # a group id then fits the key's last byte (the suffix is big-endian)
        seq = self._seq
        for block in blocks:
            key = block.block_hash
            gid = -1
            if key is not None:
                gid = key[-1] if small else get_group_id(key)
            if 0 <= gid < num_groups:
                bonus = bonus_of[gid]
                if bonus < 0.0:
                    bonus = self.bonus(block)
                heap.push(block, seq + bonus, seq)
            else:
                heap.push(block, seq, seq)  # no group to weigh: plain release order
            seq += 1
        self._seq = seq
        if self._dooms:
            self._index(blocks)

    def _index(self, blocks: Sequence[KVCacheBlock]) -> None:
        """File the blocks of indexed groups under their anchor (``add_blocks`` without scoring)."""
        indexed, prefix_of, peers = self._indexed, self._prefix_of, self._peers
        num_groups = len(indexed)
        small = num_groups <= 256
        suffix = self._anchor_suffix
        for block in blocks:
            key = block.block_hash
            if key is None:
                continue
            gid = key[-1] if small else get_group_id(key)
            if gid < num_groups and indexed[gid]:
                anchor = key[:-4] if suffix is None else key[:-4] + suffix
                prefix_of[block.block_id] = anchor
                filed = peers.get(anchor)
                if filed is None:
                    peers[anchor] = [block]
                else:
                    filed.append(block)

    def _unindex(self, block_id: int) -> None:
        anchor = self._prefix_of[block_id]
        if anchor is not None:
            self._prefix_of[block_id] = None
            peers = self._peers[anchor]
            if len(peers) == 1:
                del self._peers[anchor]
            else:
                for i, peer in enumerate(peers):
                    if peer.block_id == block_id:
                        del peers[i]
                        break

    def remove(self, block: KVCacheBlock) -> None:
        self._heap.discard(block)
        self._unindex(block.block_id)

    def pop_victim(self) -> KVCacheBlock:
        victim = self._next_victim()
        self._evicted(victim)
        return victim

    def pop_victims(self, n: int) -> list[KVCacheBlock]:
        out: list[KVCacheBlock] = []
        for _ in range(n):
            victim = self._next_victim()
            self._evicted(victim)
            out.append(victim)
        return out

    def _next_victim(self) -> KVCacheBlock:
        """Take the next victim out of the heap: the oldest doomed block still free, else the lowest score."""
        heap, doomed = self._heap, self._doomed
        while doomed:
            candidate, seq = doomed.popleft()
            if candidate.policy_seq == seq and heap.discard(candidate):
                return candidate
        return heap.pop()

    def _evicted(self, victim: KVCacheBlock) -> None:
        """Forget ``victim``'s filing; if it is a left-closed group's, doom its peers."""
        self._unindex(victim.block_id)
        key = victim.block_hash
        if not self._dooms or key is None:
            return
        if self._anchor_suffix is not None:
            # Peers are filed under the left-closed group's keys: only its victims' keys find any, and
            # they are never of that group (it is not indexed).
            needed = self._needed_last_byte
            if needed >= 0 and key[-1] != needed:
                return
            filed = self._peers.get(key)
            if filed:
                self._doom(victim, key, filed, check_copies=True)
        elif self._peers:
            gid = get_group_id(key)
            if gid < len(self._needed) and self._needed[gid]:
                self._doom_peers(victim, key, gid)

    def _doom_peers(self, victim: KVCacheBlock, key: bytes, gid: int) -> None:
        """``victim`` of left-closed group ``gid`` was evicted: unless a free copy of its content still serves
        its position (a prefix recomputed after a shorter hit, as Mamba hybrids do), the indexed free blocks
        there serve no hit any more and are evicted next. State snapshots are never indexed: recomputing the
        attention up to one brings its hit back, while the state returns only if a chunk ends there again."""
        peers = self._peers.get(key[:-4])
        if not peers:
            return
        if any(p.block_hash is not None and get_group_id(p.block_hash) == gid for p in peers):
            return  # a free copy of the victim's content is filed there: the position still serves hits
        self._doom(victim, key, peers, check_copies=not self._indexed[gid])

    def _doom(
        self, victim: KVCacheBlock, key: bytes, peers: list[KVCacheBlock], *, check_copies: bool
    ) -> None:
        """Evict ``peers`` next, unless (``check_copies``: the victim's group is not indexed) the pool's map
        holds another free block with the victim's content."""
        heap = self._heap
        if check_copies:
            lookup = self._cached_blocks
            assert lookup is not None  # the group is indexed without the pool's map
            if any(copy is not victim and heap.holds(copy) for copy in lookup(key)):
                return
        for peer in peers:
            self._doomed.append((peer, peer.policy_seq))

    def __len__(self) -> int:
        return len(self._heap)

    def evictable_blocks(self) -> list[KVCacheBlock]:
        """The order pops would take now, cascades included (a copy of the state is popped empty)."""
        # Built through __init__ (the compiled build allows no other way), then given this one's state.
        twin = HybridAwarePolicy(
            EvictionContext(num_blocks=1, groups=self._groups, cached_blocks=self._cached_blocks),
            self.alpha,
            self.coherent,
        )
        twin._e_min = self._e_min
        twin._bonus_scale = self._bonus_scale
        twin._bonus_of = self._bonus_of
        twin._heap = self._heap.copy()
        twin._seq = self._seq
        twin._dooms = self._dooms
        twin._indexed = self._indexed
        twin._anchor_suffix = self._anchor_suffix
        twin._needed_last_byte = self._needed_last_byte
        twin._no_bonus = self._no_bonus
        twin._needed = self._needed
        twin._peers = {anchor: list(peers) for anchor, peers in self._peers.items()}
        twin._prefix_of = list(self._prefix_of)
        twin._doomed = deque(self._doomed)
        return [twin.pop_victim() for _ in range(len(twin))]

    def on_cached(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        pass

    def on_hit(self, blocks: Sequence[KVCacheBlock], use: BlockUse) -> None:
        pass
