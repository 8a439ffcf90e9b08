"""Adapters to other engines' KV cache APIs (``kvspec.integrations.vllm``); none imports its engine at
import time."""
