"""The other extension points a plugin author writes: a request view, a router and a tier, each with one
mistake, refused where it is handed to kvspec."""

from collections.abc import Collection

from kvspec import KVCacheCoordinator, RequestView
from kvspec.fleet import FleetView, RouteRequest, RouterContext, register_router
from kvspec.tiers import LookupResult, TierContext, TierEvent, TierRequest, register_tier


class NoHashes:
    """A request view without block_hashes: the prefix-cache lookup reads them."""

    request_id = "r0"
    all_token_ids = [1, 2, 3]
    num_tokens = 3
    num_prompt_tokens = 3


def lookup(coordinator: KVCacheCoordinator, request: NoHashes) -> None:
    coordinator.get_computed_blocks(request)  # E: [arg-type] "NoHashes"; expected "RequestView"


class NamesTheInstance:
    """A router that answers an instance's name instead of its index."""

    def __init__(self, context: RouterContext) -> None:
        pass

    def route(self, request: RouteRequest, fleet: FleetView) -> str:
        return "instance-0"


register_router("acme.named", NamesTheInstance)  # E: [arg-type] "type[NamesTheInstance]"


class CannotStore:
    """A tier with no prepare_store / complete_store: it could never take a block."""

    medium = "CPU"
    capacity_blocks = 8
    num_blocks = 0

    def __init__(self, context: TierContext) -> None:
        pass

    def lookup(self, key: bytes, request: TierRequest, /) -> LookupResult:
        return LookupResult.MISS

    def prepare_load(self, keys: Collection[bytes], request: TierRequest, /) -> None:
        pass

    def complete_load(self, keys: Collection[bytes], request: TierRequest, /) -> None:
        pass

    def on_request_finished(self, request: TierRequest, /) -> None:
        pass

    def take_events(self) -> list[TierEvent]:
        return []

    def reset(self) -> None:
        pass


register_tier("acme.nostore", CannotStore)  # E: [arg-type] "type[CannotStore]"
view: RequestView = NoHashes()  # E: [assignment] "NoHashes", variable has type "RequestView"
