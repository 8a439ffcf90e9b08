"""Before vLLM is imported: an offline Hugging Face cache with the configs vLLM's ModelConfig reads (the hub
is unreachable here; huggingface_hub reads its cache location once, at import)."""

from __future__ import annotations

import importlib.util

from benchmarks.vllm_scheduler_loop import _setup_offline_hub

if importlib.util.find_spec("vllm") is not None:
    _setup_offline_hub()
