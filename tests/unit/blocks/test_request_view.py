"""RequestView: what the core reads from a request, so an engine's own request type runs unchanged."""

from __future__ import annotations

import kvspec


def test_pure_python_subclass_of_request_and_an_engines_own_request_type_both_run() -> None:
    """``Request`` stays subclassable in the compiled build, and an engine's own request class that only
    satisfies ``RequestView`` (no kvspec base) gets the same blocks and hits as a ``Request``."""
    from kvspec import Request, RequestView
    from tests.helpers import full_spec, make_coordinator

    class TaggedRequest(Request):
        def __init__(self, *args: object, tag: str, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            self.tag = tag

    class EngineRequest:
        """An engine's request: plain attributes, its own token list, kvspec's hasher."""

        def __init__(self, request_id: str, tokens: list[int], hasher: kvspec.BlockHasher) -> None:
            self.request_id = request_id
            self.all_token_ids = list(tokens)
            self.num_prompt_tokens = len(tokens)
            self.num_computed_tokens = 0
            self.num_preemptions = 0
            self.skip_reading_prefix_cache = False
            self.block_hasher: kvspec.BlockHasher | None = hasher
            self.lora_name: str | None = None
            self.lora_id: int | None = None
            self.cache_salt: str | None = None
            self.needs_extra_keys = False
            self.block_hashes: list[kvspec.BlockHash] = []
            self.block_extra_keys: list[tuple[object, ...] | None] = []
            hasher.hash_new_blocks(self)

        @property
        def num_tokens(self) -> int:
            return len(self.all_token_ids)

        def extra_keys_for_block(self, start: int, end: int) -> None:
            return None

        def extra_keys_for_range(self, start: int, end: int) -> None:
            return None

    prompt = list(range(100, 150))
    ids: dict[str, tuple[list[list[int]], int]] = {}
    for kind in ("plain", "tagged", "engine"):
        coord = make_coordinator([full_spec()], 32)
        hasher = coord.make_block_hasher(seed="same")
        make: dict[str, RequestView] = {
            "plain": Request("a", prompt, block_hasher=hasher),
            "tagged": TaggedRequest("a", prompt, block_hasher=hasher, tag="t"),
            "engine": EngineRequest("a", prompt, hasher),
        }
        first = make[kind]
        assert isinstance(first, RequestView)
        new = coord.allocate_slots(first, len(prompt))
        assert new is not None
        coord.free(first)
        twins: dict[str, RequestView] = {
            "plain": Request("b", prompt, block_hasher=hasher),
            "tagged": TaggedRequest("b", prompt, block_hasher=hasher, tag="t"),
            "engine": EngineRequest("b", prompt, hasher),
        }
        again = twins[kind]
        computed, hit = coord.get_computed_blocks(again)
        ids[kind] = ([list(g) for g in new.get_block_ids()], hit)
        assert hit == 48 and computed.get_block_ids() == tuple(g[:3] for g in new.get_block_ids())
        coord.check_invariants()
    assert ids["plain"] == ids["tagged"] == ids["engine"]


def test_request_view_requires_exactly_the_members_it_declares() -> None:
    """isinstance() against RequestView asks for its declared members only, in both builds (a protocol
    defined in a compiled module would also ask for mypyc's __getstate__/__mypyc_attrs__)."""
    import typing

    from kvspec import RequestView

    members = typing._get_protocol_attrs(RequestView)  # type: ignore[attr-defined]
    assert not any(name.startswith("__") for name in members), sorted(members)
    assert {"request_id", "block_hashes", "block_hasher", "extra_keys_for_block"} <= members
