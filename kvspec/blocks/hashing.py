"""Block hashing for prefix caching.

A block's hash covers its parent block's hash, its token ids and its extra keys (LoRA name, multimodal
items overlapping the block, prompt-embeds digest, and the tenant's cache salt on the first block), so a
hit on block i implies a hit on every block before it. The chain's root is derived from a seed that is
random per process (``os.urandom``; ``PYTHONHASHSEED`` plays no part), so another tenant cannot predict a
hash (vLLM's fix for CVE-2025-25183). Reproducible hashes across processes are an explicit choice: pass
``seed=`` to BlockHasher, or set ``KVSPEC_HASH_SEED`` to a secret shared by the processes that must agree. sha256 (default) is collision-resistant: one tenant cannot forge another's cache entry.
xxhash (xxh3-128) is a fast non-cryptographic option for single-tenant deployments.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NewType, Protocol, cast, overload

from kvspec.errors import KVSpecError, UnknownHashFunctionError

BlockHash = NewType("BlockHash", bytes)
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)

#: A token id as hashed: uint32 in the machine's order, as ``array("I")`` writes it (``_token_bytes``).
_UINT32 = struct.Struct("=I")

#: Algorithms by name; values build a digest of a bytes message.
HASH_ALGORITHMS = ("sha256", "xxhash")


class HashObject(Protocol):
    """What a hash constructor returns (``hashlib.sha256(data)``, ``xxhash.xxh3_128(data)``)."""

    def digest(self) -> bytes: ...


def get_hash_constructor(name: str) -> Callable[[bytes], HashObject]:
    """The hash constructor for ``name`` ("sha256" or "xxhash"): ``constructor(data).digest()``."""
    if name == "sha256":
        return hashlib.sha256
    if name == "xxhash":
        try:
            import xxhash
        except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
            raise UnknownHashFunctionError(
                "The 'xxhash' block hash needs the xxhash package: pip install xxhash."
            ) from exc
        constructor: Callable[[bytes], HashObject] = xxhash.xxh3_128
        return constructor
    raise UnknownHashFunctionError(f"Unsupported hash function: {name!r}; choose one of {HASH_ALGORITHMS}.")


#: The explicit switch for reproducible hashes across processes (a secret; unset: random per process).
HASH_SEED_ENV = "KVSPEC_HASH_SEED"


def _process_seed() -> bytes:
    env = os.environ.get(HASH_SEED_ENV)
    if env:
        return b"KVSPEC_HASH_SEED=" + env.encode()
    return os.urandom(32)


#: Random per process unless KVSPEC_HASH_SEED is set; fixed for the process's lifetime.
PROCESS_SEED = _process_seed()


#: group_suffix of the first 256 groups, computed once: hit searches ask for it per block and group.
GROUP_SUFFIXES: tuple[bytes, ...] = tuple(gid.to_bytes(4, "big") for gid in range(256))


def group_suffix(group_id: int) -> bytes:
    """What follows a block hash in a prefix-cache map key: the 4-byte big-endian group id."""
    if 0 <= group_id < 256:
        return GROUP_SUFFIXES[group_id]
    return group_id.to_bytes(4, "big")


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> BlockHashWithGroupId:
    """Key of a block in the prefix-cache map: the hash followed by the 4-byte big-endian group id."""
    return BlockHashWithGroupId(block_hash + group_suffix(group_id))


def get_block_hash(key: bytes) -> BlockHash:
    return BlockHash(key[:-4])


def get_group_id(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big")


@dataclass(frozen=True, kw_only=True, slots=True)
class MultiModalFeature:
    """One multimodal item of a prompt: its content ``identifier`` occupies tokens [offset, offset+length)."""

    identifier: str
    offset: int
    length: int


class HashedRequest(Protocol):
    """What the hasher reads from (and appends to) a request; kvspec.blocks.request.Request satisfies it."""

    @property
    def all_token_ids(self) -> Sequence[int]: ...

    @property
    def block_hashes(self) -> list[BlockHash]: ...

    @property
    def block_extra_keys(self) -> list[tuple[Any, ...] | None]: ...

    @property
    def needs_extra_keys(self) -> bool: ...

    def extra_keys_for_block(self, start: int, end: int) -> tuple[Any, ...] | None: ...


class BlockHasher:
    """Hashes full blocks of ``block_size`` tokens into a chain rooted at a seed.

    Invariant: the hash of block i depends on the tokens and extra keys of blocks 0..i only.
    """

    __slots__ = ("_new_hash", "_token_bytes", "algorithm", "block_size", "root_hash")

    def __init__(
        self, block_size: int, *, algorithm: str = "sha256", seed: bytes | str | None = None
    ) -> None:
        if block_size <= 0:
            raise KVSpecError(f"BlockHasher.block_size must be positive, got {block_size}.")
        self.block_size = block_size
        self.algorithm = algorithm
        self._new_hash = get_hash_constructor(algorithm)
        if isinstance(seed, str):
            seed = seed.encode()
        self.root_hash = BlockHash(self._new_hash(b"kvspec-root:" + (seed or PROCESS_SEED)).digest())
        self._token_bytes = block_size * array("I").itemsize

    def hash_block_tokens(
        self, parent: bytes | None, token_ids: Sequence[int], extra_keys: tuple[Any, ...] | None = None
    ) -> BlockHash:
        """Hash of one block: (parent or root) || tokens as uint32 || pickled extra keys."""
        return BlockHash(
            self._new_hash(
                _block_message(parent or self.root_hash, _token_bytes(token_ids), extra_keys)
            ).digest()
        )

    def hash_runs(self, runs: Iterable[tuple[int, int]]) -> list[BlockHash]:
        """Hashes of the full blocks of a prompt given as runs ``(token id, count)``: equal to hashing the
        runs expanded into tokens (no extra keys), without converting token by token (a trace's hash id is
        a run of one token id). Tokens of a partial last block are not hashed."""
        parts: list[bytes] = []
        for token, count in runs:
            if count < 0 or not 0 <= token < 2**32:
                raise KVSpecError(
                    f"A run of {count} tokens of id {token}: counts are >= 0 and ids in [0, 2**32)."
                )
            parts.append(_UINT32.pack(token) * count)
        return cast("list[BlockHash]", self._chain(self.root_hash, b"".join(parts)))

    def _chain(self, parent: bytes, raw: bytes) -> list[bytes]:
        """The hashes of the full blocks of token bytes ``raw`` (no extra keys), chained from ``parent``; a
        partial last block is left out."""
        step = self._token_bytes
        new_hash = self._new_hash
        out: list[bytes] = []
        for i in range(0, len(raw) - step + 1, step):
            parent = new_hash(parent + raw[i : i + step]).digest()
            out.append(parent)
        return out

    def hash_new_blocks(self, request: HashedRequest) -> list[BlockHash]:
        """Hashes of the request's full blocks that are not hashed yet (appended to the request)."""
        bs = self.block_size
        hashes = request.block_hashes
        start = len(hashes) * bs
        tokens = request.all_token_ids
        num_tokens = len(tokens)
        if start + bs > num_tokens:
            return []
        end = num_tokens - (num_tokens - start) % bs
        # A new prompt is hashed whole: no slice copy of its token list.
        raw = _token_bytes(tokens if start == 0 and end == num_tokens else tokens[start:end])
        parent: bytes = hashes[-1] if hashes else self.root_hash
        if not request.needs_extra_keys:
            new = self._chain(parent, raw)  # the common case
        else:
            step = self._token_bytes
            new_hash = self._new_hash
            extras = request.block_extra_keys
            new = []
            for i in range(0, len(raw), step):
                block_start = start + (i // step) * bs
                extra = request.extra_keys_for_block(block_start, block_start + bs)
                extras.append(extra)
                parent = new_hash(_block_message(parent, raw[i : i + step], extra)).digest()
                new.append(parent)
        out = cast("list[BlockHash]", new)
        hashes.extend(out)
        return out


def _block_message(parent: bytes, token_bytes: bytes, extra_keys: tuple[Any, ...] | None) -> bytes:
    """What a block's hash covers: parent hash || tokens as uint32 || (0x01 || pickled extra keys)."""
    if extra_keys:
        return parent + token_bytes + b"\x01" + pickle.dumps(extra_keys, protocol=5)
    return parent + token_bytes


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 (every tokenizer's vocabulary fits)."""
    try:
        return array("I", token_ids).tobytes()
    except OverflowError:
        bad = next(t for t in token_ids if not 0 <= t < 2**32)
        raise KVSpecError(
            f"Token id {bad} is outside [0, 2**32); block hashing needs non-negative ids."
        ) from None


def generate_block_hash_extra_keys(
    *,
    lora_name: str | None,
    mm_features: Sequence[MultiModalFeature],
    cache_salt: str | None,
    prompt_embeds_digest: Callable[[int, int], bytes] | None,
    start: int,
    end: int,
    start_mm_idx: int,
) -> tuple[tuple[Any, ...] | None, int]:
    """Extra hash keys of the block [start, end) and the index of the first mm item to look at next.

    Order: LoRA name, multimodal (identifier, offset from block start) items, cache salt (first block only),
    prompt-embeds digest. Multimodal items must be sorted by offset. The offset can be negative when an
    item began in an earlier block.
    """
    keys: list[Any] = []
    if lora_name is not None:
        keys.append(lora_name)
    idx = start_mm_idx
    while idx < len(mm_features):
        item = mm_features[idx]
        if end <= item.offset:
            break
        if start >= item.offset + item.length:
            idx += 1
            continue
        keys.append((item.identifier, item.offset - start))
        if end >= item.offset + item.length:
            idx += 1
        else:
            break
    if cache_salt is not None and start == 0:
        keys.append(cache_salt)
    if prompt_embeds_digest is not None:
        keys.append(prompt_embeds_digest(start, end))
    return (tuple(keys) if keys else None), idx


class BlockHashListWithBlockSize(Sequence[bytes]):
    """A lazy coarse view of a hash list: block i of the coarse size is the concatenation of ``scale``
    fine hashes (a byte concatenation, not a re-hash, so it stays a prefix chain; vLLM 0.23), or with
    ``last_fine`` the last of them (it already chains over the whole prefix; vLLM 0.34)."""

    __slots__ = ("_hashes", "_last_fine", "_scale")

    def __init__(
        self, hashes: Sequence[bytes], hash_block_size: int, target_block_size: int, last_fine: bool = False
    ) -> None:
        if target_block_size % hash_block_size:
            raise KVSpecError(
                f"Block size {target_block_size} is not a multiple of the hash block size {hash_block_size}."
            )
        self._hashes = hashes
        self._scale = target_block_size // hash_block_size
        self._last_fine = last_fine

    @property
    def fine_hashes(self) -> Sequence[bytes]:
        """The hash-block hashes this view is over (vLLM 0.32 and 0.34 hand those to a manager's hit search,
        which makes its own view)."""
        return self._hashes

    def __len__(self) -> int:
        return len(self._hashes) // self._scale

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        s = self._scale
        if self._last_fine:
            return self._hashes[(index + 1) * s - 1]
        return b"".join(self._hashes[index * s : (index + 1) * s])

    def __iter__(self) -> Iterator[bytes]:
        for i in range(len(self)):
            yield self[i]
