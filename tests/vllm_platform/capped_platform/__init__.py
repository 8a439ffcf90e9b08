"""A test hardware platform for vLLM: vLLM's CPU platform plus a KV-cache spec and manager of its own.

Everything here is written against vLLM's API alone (no kvspec import): ``CappedFullAttentionSpec`` (full
attention, the CPU backend's layout) is what the model's full-attention layers emit on this platform, and
``CappedHitManager`` runs it, capping every prefix-cache hit at :data:`HIT_CAP_BLOCKS` blocks, which a client
sees in ``cached_tokens``. The platform registers both from ``register_custom_kv_cache_specs``, where vLLM
asks every platform for its own specs.
"""

from __future__ import annotations

import os

#: The longest prefix hit, in blocks, this platform's manager gives a request.
HIT_CAP_BLOCKS = 4


def register() -> str | None:
    """vLLM's ``vllm.platform_plugins`` entry point: the platform class, where it is switched on
    (``CAPPED_PLATFORM=1``; ``unpinning``: its manager also unpins blocks through vLLM's pool, a pool call
    kvspec's pool does not have, so kvspec refuses it at start)."""
    if os.environ.get("CAPPED_PLATFORM") not in ("1", "unpinning"):
        return None
    return "capped_platform.platform.CappedCpuPlatform"
