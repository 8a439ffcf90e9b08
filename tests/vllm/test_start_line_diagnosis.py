"""The vLLM plugin's start line says what limits a hybrid's prefix hits (issue 52): under vLLM 0.34's sparse
retention (the interval 0 its planner writes into the config) a sliding-window group keeps cached blocks only
at replay boundaries and junctions, which the line names; under 0.23's dense retention there is nothing to
say. Runs on the installed release (0.23.0 in
``nox -s vllm``, 0.34.0 in ``nox -s vllm034``)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm.v1.kv_cache_interface", reason="needs vLLM")


def _manager(enable_caching: bool) -> Any:
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )

    from kvspec.integrations.vllm_kv_cache_manager import adapter_class

    common: dict[str, Any] = dict(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float16)
    config = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], FullAttentionSpec(**common)),
            KVCacheGroupSpec(["window"], SlidingWindowSpec(**common, sliding_window=128)),
        ],
    )
    if hasattr(config, "prefix_cache_retention_interval"):
        config.prefix_cache_retention_interval = 0  # what vLLM 0.34's planner writes (0.23 has no field)
    return adapter_class()(
        kv_cache_config=config,
        max_model_len=1024,
        scheduler_block_size=16,
        hash_block_size=16,
        enable_caching=enable_caching,
    )


def test_the_start_line_names_what_limits_the_hits() -> None:
    import vllm

    line = _manager(enable_caching=True).describe()
    if vllm.__version__.startswith("0.23"):
        assert "prefix caching on" in line and "; prefix caching limited" not in line
    else:
        assert line.endswith(
            "; prefix caching limited: group 1 (sliding window 128) keep cached blocks only where a request's "
            "prompt ends (its replay boundary) and where it meets a prefix another request shares (vLLM 0.34's "
            "sparse retention, interval 0): the next turn of a conversation hits, a prefix shared inside other "
            "prompts may not; a smaller retention interval keeps more (kvspec simulate and fleet: "
            "--retention-interval N, or dense: every block, as vLLM 0.23)"
        )
    off = _manager(enable_caching=False).describe()
    assert "prefix caching off" in off and "prefix caching limited" not in off
