"""Block hash chains, extra keys, salts, incremental hashing, and the hash algorithms."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec import BlockHasher, MultiModalFeature, Request
from kvspec.blocks.hashing import (
    BlockHashListWithBlockSize,
    generate_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
)
from kvspec.errors import KVSpecError, UnknownHashFunctionError


def extra(
    start: int, end: int, mm: list[MultiModalFeature], idx: int = 0, **kw: object
) -> tuple[object, int]:
    args: dict[str, object] = dict(lora_name=None, cache_salt=None, prompt_embeds_digest=None)
    args.update(kw)
    return generate_block_hash_extra_keys(mm_features=mm, start=start, end=end, start_mm_idx=idx, **args)  # type: ignore[arg-type]


MM = [
    MultiModalFeature(identifier="hash1", offset=3, length=5),
    MultiModalFeature(identifier="hash2", offset=10, length=5),
]


class TestExtraKeys:
    def test_mm_items_overlapping_a_block(self) -> None:
        assert extra(0, 5, MM) == ((("hash1", 3),), 0)
        assert extra(5, 10, MM) == ((("hash1", -2),), 1)  # offset relative to the block, negative
        assert extra(10, 15, MM, 1) == ((("hash2", 0),), 2)
        assert extra(15, 20, MM, 2) == (None, 2)

    def test_several_items_in_one_block(self) -> None:
        assert extra(0, 20, MM) == ((("hash1", 3), ("hash2", 10)), 2)

    def test_no_overlap(self) -> None:
        assert extra(0, 3, MM) == (None, 0)
        assert extra(0, 3, []) == (None, 0)

    def test_lora_salt_and_embeds_order(self) -> None:
        keys, _ = extra(
            0, 5, MM, lora_name="adapter", cache_salt="tenant-a", prompt_embeds_digest=lambda s, e: b"d"
        )
        assert keys == ("adapter", ("hash1", 3), "tenant-a", b"d")
        keys, _ = extra(5, 10, [], cache_salt="tenant-a")
        assert keys is None  # the salt goes on the first block only


class TestChains:
    def test_hash_covers_parent_tokens_and_extras(self) -> None:
        h = BlockHasher(4, seed="s")
        a = h.hash_block_tokens(None, [1, 2, 3, 4])
        assert a == h.hash_block_tokens(None, [1, 2, 3, 4])
        assert a != h.hash_block_tokens(None, [1, 2, 3, 5])
        assert a != h.hash_block_tokens(None, [1, 2, 3, 4], ("lora",))
        assert h.hash_block_tokens(a, [5, 6, 7, 8]) != h.hash_block_tokens(None, [5, 6, 7, 8])
        assert len(a) == 32

    def test_request_hashes_only_full_blocks_and_grows(self) -> None:
        h = BlockHasher(4, seed="s")
        req = Request("r", [1, 2, 3, 4, 5, 6], block_hasher=h)
        assert len(req.block_hashes) == 1
        assert req.block_hashes[0] == h.hash_block_tokens(None, [1, 2, 3, 4])
        req.append_output_token_ids([7, 8, 9])
        assert len(req.block_hashes) == 2
        assert req.block_hashes[1] == h.hash_block_tokens(req.block_hashes[0], [5, 6, 7, 8])
        req.append_output_token_ids(10)
        assert len(req.block_hashes) == 2
        whole = Request("w", list(range(1, 13)), block_hasher=h)
        inc = Request("i", [1], block_hasher=h)
        for t in range(2, 13):
            inc.append_output_token_ids(t)
        assert whole.block_hashes == inc.block_hashes

    def test_mm_inputs_change_the_chain(self) -> None:
        h = BlockHasher(4, seed="s")
        toks = list(range(12))
        a = Request(
            "a", toks, block_hasher=h, mm_features=[MultiModalFeature(identifier="img-a", offset=2, length=4)]
        )
        b = Request(
            "b", toks, block_hasher=h, mm_features=[MultiModalFeature(identifier="img-b", offset=2, length=4)]
        )
        plain = Request("c", toks, block_hasher=h)
        assert a.block_hashes[0] != b.block_hashes[0]
        assert all(x != y for x, y in zip(a.block_hashes, b.block_hashes))
        assert a.block_extra_keys[:3] == [(("img-a", 2),), (("img-a", -2),), None]
        assert plain.block_extra_keys == []  # kept only for requests that have extra keys

    def test_salt_isolates_tenants(self) -> None:
        h = BlockHasher(4, seed="s")
        toks = list(range(12))
        a, b = (
            Request("a", toks, block_hasher=h, cache_salt="A"),
            Request("b", toks, block_hasher=h, cache_salt="B"),
        )
        assert all(x != y for x, y in zip(a.block_hashes, b.block_hashes))
        assert a.block_extra_keys == [("A",), None, None]

    def test_prompt_embeds_digest_per_block(self) -> None:
        h = BlockHasher(2, seed="s")
        emb = torch.arange(12, dtype=torch.float32).reshape(4, 3)
        a = Request("a", [0, 0, 0, 0], block_hasher=h, prompt_embeds=emb)
        b = Request("b", [0, 0, 0, 0], block_hasher=h, prompt_embeds=emb.clone())
        c = Request("c", [0, 0, 0, 0], block_hasher=h, prompt_embeds=emb + 1)
        assert a.block_hashes == b.block_hashes
        assert a.block_hashes[0] != c.block_hashes[0]
        assert a.block_extra_keys[0] != a.block_extra_keys[1]

    def test_root_is_random_per_process_unless_explicitly_seeded(self) -> None:
        code = "from kvspec import BlockHasher; print(BlockHasher(4).root_hash.hex())"
        env = {
            k: v
            for k, v in __import__("os").environ.items()
            if k not in ("PYTHONHASHSEED", "KVSPEC_HASH_SEED")
        }

        def roots(extra: dict[str, str]) -> set[str]:
            return {
                subprocess.run(
                    [sys.executable, "-c", code],
                    capture_output=True,
                    text=True,
                    env={**env, **extra},
                    check=True,
                ).stdout
                for _ in range(2)
            }

        assert len(roots({})) == 2
        # PYTHONHASHSEED (even "random" or a fixed value) does not make the root predictable any more.
        assert len(roots({"PYTHONHASHSEED": "7"})) == 2
        assert len(roots({"PYTHONHASHSEED": "random"})) == 2
        # The explicit, documented switch does.
        assert len(roots({"KVSPEC_HASH_SEED": "shared-secret"})) == 1
        assert BlockHasher(4, seed="x").root_hash == BlockHasher(4, seed=b"x").root_hash

    def test_xxhash_option(self) -> None:
        h = BlockHasher(4, algorithm="xxhash", seed="s")
        assert len(h.hash_block_tokens(None, [1, 2, 3, 4])) == 16
        with pytest.raises(UnknownHashFunctionError, match="Unsupported hash function: 'md5'"):
            BlockHasher(4, algorithm="md5")


class TestGroupKeysAndViews:
    def test_group_id_suffix(self) -> None:
        key = make_block_hash_with_group_id(b"abc", 3)
        assert key == b"abc\x00\x00\x00\x03"
        assert get_block_hash(key) == b"abc" and get_group_id(key) == 3

    def test_coarse_view_concatenates(self) -> None:
        view = BlockHashListWithBlockSize([b"a", b"b", b"c", b"d", b"e"], 16, 32)
        assert len(view) == 2
        assert view[0] == b"ab" and view[1] == b"cd" and view[-1] == b"cd"
        assert view[0:2] == [b"ab", b"cd"]
        assert list(view) == [b"ab", b"cd"]
        with pytest.raises(IndexError):
            view[2]

    def test_coarse_view_of_vllm_0_34_is_the_last_fine_hash(self) -> None:
        view = BlockHashListWithBlockSize([b"a", b"b", b"c", b"d", b"e"], 16, 32, last_fine=True)
        assert list(view) == [b"b", b"d"] and view[-1] == b"d" and len(view) == 2


def test_token_ids_must_fit_uint32() -> None:
    from kvspec import KVSpecError

    with pytest.raises(KVSpecError, match=r"Token id -1 is outside \[0, 2\*\*32\)"):
        BlockHasher(2, seed="s").hash_block_tokens(None, [1, -1])


class TestRuns:
    """``hash_runs`` (a trace's hash ids hashed run by run) gives the hashes the expanded tokens give, and a
    request that adopts them goes on hashing as one hashed from tokens does."""

    @given(
        runs=st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 40)), min_size=0, max_size=8),
        block_size=st.sampled_from([1, 3, 16, 64]),
        algorithm=st.sampled_from(["sha256", "xxhash"]),
    )
    @settings(max_examples=60, deadline=None)
    def test_runs_hash_as_their_tokens(
        self, runs: list[tuple[int, int]], block_size: int, algorithm: str
    ) -> None:
        hasher = BlockHasher(block_size, algorithm=algorithm, seed=b"runs")
        tokens = [token for token, count in runs for _ in range(count)]
        assert hasher.hash_runs(runs) == Request("r", tokens, block_hasher=hasher).block_hashes

    def test_adopted_hashes_extend_with_output_tokens(self) -> None:
        hasher = BlockHasher(4, seed=b"runs")
        runs = [(7, 4), (9, 6)]  # 10 tokens: two full blocks and two tokens of a third
        tokens = [7] * 4 + [9] * 6
        adopted = Request("a", tokens)
        adopted.adopt_block_hashes(hasher, hasher.hash_runs(runs))
        plain = Request("p", tokens, block_hasher=hasher)
        assert adopted.block_hashes == plain.block_hashes and len(plain.block_hashes) == 2
        for request in (adopted, plain):
            request.append_output_token_ids([3, 4, 5])
        assert adopted.block_hashes == plain.block_hashes and len(plain.block_hashes) == 3
        assert adopted.block_hasher is hasher

    def test_adoption_is_refused_when_it_cannot_hold(self) -> None:
        hasher = BlockHasher(4, seed=b"runs")
        hashes = hasher.hash_runs([(7, 8)])
        with pytest.raises(KVSpecError, match=r"1 block hashes for 2 full blocks of 4 tokens"):
            Request("a", [7] * 8).adopt_block_hashes(hasher, hashes[:1])
        with pytest.raises(KVSpecError, match=r"built without a hasher and without extra keys"):
            Request("b", [7] * 8, block_hasher=hasher).adopt_block_hashes(hasher, hashes)
        with pytest.raises(KVSpecError, match=r"built without a hasher and without extra keys"):
            Request("c", [7] * 8, cache_salt="x").adopt_block_hashes(hasher, hashes)
        with pytest.raises(KVSpecError, match=r"counts are >= 0 and ids in \[0, 2\*\*32\)"):
            hasher.hash_runs([(2**32, 1)])
