"""Imported in ``vllm serve``'s engine core by kvspec's plugin (``KVSPEC_VLLM_IMPORTS``) during the load run
(tests/vllm_serve/load.py): after every ``free`` that leaves no request holding blocks, the coordinator's
invariants are checked (ref counts, free queue, cache map) and one JSON line is appended to the file
``KVSPEC_LOAD_PROBE`` names: the free blocks, the blocks a request can use (the pool less its null block) and
whether the invariants held (else the error). The load run reads the last line once the server is idle: every
block back in the pool, nothing inconsistent on the way.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kvspec.integrations.vllm_adapter_023 import Vllm023KVCacheManager

_PATH = os.environ.get("KVSPEC_LOAD_PROBE")
_free = Vllm023KVCacheManager.free


def _free_and_check(self: Any, request: Any) -> None:
    _free(self, request)
    coordinator = self.kvspec_coordinator
    if _PATH is None or any(manager.num_requests for manager in coordinator.managers):
        return
    line: dict[str, Any] = {
        "free": coordinator.num_free_blocks,
        "usable": coordinator.block_pool.num_gpu_blocks - 1,
    }
    try:
        coordinator.check_invariants()
        line["invariants"] = "held"
    except Exception as exc:  # written down for the run to report, never raised into the engine
        line["invariants"] = f"{type(exc).__name__}: {exc}"
    with open(_PATH, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


Vllm023KVCacheManager.free = _free_and_check  # type: ignore[method-assign]
