"""Which build runs (pure / mypyc-compiled), and what plugins may still do on the compiled one."""

from __future__ import annotations

import json
import os

import pytest

import kvspec
from kvspec.blocks.pool import BlockPool, KVCacheBlock
from kvspec.build_info import COMPILED_MODULES, build_info


def test_build_is_reported_consistently() -> None:
    info = build_info()
    assert kvspec.__build__ == info.build
    assert sorted(info.compiled + info.pure) == sorted(p[:-3].replace("/", ".") for p in COMPILED_MODULES)
    expected = os.environ.get("KVSPEC_EXPECT_BUILD")
    if expected:  # CI states which build it built: a compiled build that fell back to pure fails here
        assert info.build == expected, info


def test_pure_python_subclass_of_the_block_pool_overrides_a_hot_method() -> None:
    taken: list[int] = []

    class CountingPool(BlockPool):
        def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
            blocks = super().get_new_blocks(num_blocks)
            taken.extend(b.block_id for b in blocks)
            return blocks

    pool = CountingPool(8, enable_caching=True, hash_block_size=4)
    blocks = pool.get_new_blocks(3)
    assert taken == [b.block_id for b in blocks] == [1, 2, 3]
    pool.free_blocks(blocks)
    pool.check_invariants()


def test_inspect_names_the_build(capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.cli.main import main

    assert main(["inspect"]) == 0
    assert f"build: {build_info().build}" in capsys.readouterr().out
    assert main(["inspect", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["build"] == build_info().build
    assert report["compiled_modules"] == list(build_info().compiled)
