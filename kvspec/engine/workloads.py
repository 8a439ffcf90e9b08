"""Synthetic request streams: shared system prompts, multi-turn chats, and random prompts."""

from __future__ import annotations

import random
from dataclasses import dataclass

WORKLOADS = ("shared-prefix", "chat", "random")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkItem:
    prompt: list[int]
    max_tokens: int


def make_workload(
    name: str, *, num_requests: int, prompt_len: int, max_tokens: int, vocab_size: int, seed: int = 0
) -> list[WorkItem]:
    """``num_requests`` requests of about ``prompt_len`` prompt tokens each (ids below ``vocab_size``)."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(vocab_size) for _ in range(n)]

    if name == "shared-prefix":
        # four system prompts of 3/4 of the prompt, each followed by a unique question
        prefix_len = prompt_len * 3 // 4
        prefixes = [tokens(prefix_len) for _ in range(4)]
        return [
            WorkItem(prompt=prefixes[i % 4] + tokens(prompt_len - prefix_len), max_tokens=max_tokens)
            for i in range(num_requests)
        ]
    if name == "chat":
        # conversations of 4 turns: each turn resends the whole history plus a new user message
        items: list[WorkItem] = []
        turn_len = max(prompt_len // 4, 1)
        while len(items) < num_requests:
            history: list[int] = []
            for _ in range(4):
                history = history + tokens(turn_len)
                items.append(WorkItem(prompt=list(history), max_tokens=max_tokens))
                history = history + tokens(max_tokens)  # the assistant's reply, as the client resends it
                if len(items) == num_requests:
                    break
        return items
    if name == "random":
        return [
            WorkItem(
                prompt=tokens(rng.randint(max(prompt_len // 4, 1), prompt_len)),
                max_tokens=rng.randint(1, max_tokens),
            )
            for _ in range(num_requests)
        ]
    raise ValueError(f"unknown workload {name!r}; choose one of {WORKLOADS}")
