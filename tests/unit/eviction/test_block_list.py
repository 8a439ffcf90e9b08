"""BlockList, the intrusive list the built-in policies keep their order in: against a plain list model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec import KVCacheBlock
from kvspec.eviction import BlockList

OPS = st.lists(
    st.tuples(st.sampled_from(["append", "extend", "remove", "popleft", "popleft_into"]), st.integers(0, 40)),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_block_list_matches_a_list_model(ops: list[tuple[str, int]]) -> None:
    blocks = [KVCacheBlock(i) for i in range(40)]
    listed = BlockList()
    model: list[KVCacheBlock] = []
    for op, arg in ops:
        outside = [b for b in blocks if b not in model]
        if op == "append" and outside:
            block = outside[arg % len(outside)]
            listed.append(block)
            model.append(block)
        elif op == "extend":
            chunk = outside[: arg % 5]
            listed.extend(chunk)
            model.extend(chunk)
        elif op == "remove" and model:
            block = model.pop(arg % len(model))
            listed.remove(block)
            assert block.prev_in_policy is None and block.next_in_policy is None
        elif op == "popleft" and model:
            assert listed.popleft() is model.pop(0)
        elif op == "popleft_into":
            n = arg % (len(model) + 1)
            out: list[KVCacheBlock] = []
            listed.popleft_into(n, out)
            assert out == model[:n]
            del model[:n]
        assert listed.blocks() == model and len(listed) == len(model)
        assert listed.first() is (model[0] if model else None)
    # The pool's own links are never touched.
    assert all(b.prev_free_block is None and b.next_free_block is None for b in blocks)
