"""Drive a server with the ``openai`` client: the workloads, one request at a time, and what each returned.

Requests go one after another (each waits for the previous answer), so the engine schedules them the same
way on every server and two servers can be compared request for request: the generated text and
``usage.prompt_tokens_details.cached_tokens`` (the server runs with ``--enable-prompt-tokens-details``).

Workloads (text prompts from a seeded word list, about 2.7 tokens a word with tests/vllm_serve/tokenizer.py):

- :func:`api_workload`: completions and chat, streaming and not, three shared system prompts, a repeat
  of each, then enough unrelated long prompts to evict;
- :func:`pressure_workload`: three popular prompts sent again and again, each round followed by one-off long
  prompts that push the cache past its size; the first popular prompt may carry a retention
  (``vllm_xargs={"kv_retention_seconds": S}``) and a scheduling priority of its own, the one-offs another
  (vLLM's ``priority``, a larger number is less important; needs ``--scheduling-policy priority``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.vllm_serve.server import SERVED_NAME

_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part over new sound take only little work know place year live me back give most very"
).split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


@dataclass(frozen=True, kw_only=True)
class Ask:
    """One request: ``kind`` "completion" or "chat"; ``system`` (chat) and ``prompt`` texts; ``stream``;
    ``max_tokens`` generated (EOS ignored); ``retention_s``: a kvspec retention in ``vllm_xargs``;
    ``tag`` names the request's family in reports."""

    name: str
    kind: str
    prompt: str
    system: str | None = None
    stream: bool = False
    max_tokens: int = 8
    retention_s: float | None = None
    priority: int = 0
    tag: str = ""


@dataclass(kw_only=True)
class Answer:
    name: str
    tag: str
    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    latency_s: float
    extra: dict[str, Any] = field(default_factory=dict)


def api_workload(seed: int = 0) -> list[Ask]:
    rng = random.Random(seed)
    systems = [_text(rng, n) for n in (40, 60, 80)]  # about 110, 165 and 215 tokens
    asks: list[Ask] = []
    for repeat in range(2):
        for i, system in enumerate(systems):
            question = _text(rng, 12)
            kinds = ("completion", "chat")
            for kind in kinds:
                for stream in (False, True):
                    asks.append(
                        Ask(
                            name=f"r{repeat}-s{i}-{kind}-{'stream' if stream else 'plain'}",
                            kind=kind,
                            prompt=(question if kind == "chat" else f"{system}\n{question}"),
                            system=system if kind == "chat" else None,
                            stream=stream,
                            tag=f"system{i}",
                        )
                    )
        for j in range(
            4
        ):  # unrelated long prompts: the pool (96 blocks) overflows, shared blocks are evicted
            asks.append(Ask(name=f"r{repeat}-long{j}", kind="completion", prompt=_text(rng, 150), tag="long"))
    return asks


def pressure_workload(
    seed: int = 1,
    *,
    rounds: int = 5,
    retention_s: float | None = None,
    oneoff_priority: int = 0,
    pinned_priority: int = 0,
) -> list[Ask]:
    rng = random.Random(seed)
    # Three popular prompts (a system prompt and its usual question, sent verbatim: about 215, 160 and 120
    # tokens), the first twice a round; then one-off long prompts that push the cache past its size.
    popular = [f"{_text(rng, n)}\n{_text(rng, 10)}" for n in (70, 50, 35)]
    asks: list[Ask] = []
    for r in range(rounds):
        for i, prompt in enumerate(popular):
            for q in range(2 if i == 0 else 1):
                asks.append(
                    Ask(
                        name=f"round{r}-popular{i}-{q}",
                        kind="completion",
                        prompt=prompt,
                        retention_s=retention_s if i == 0 else None,
                        priority=pinned_priority if i == 0 else 0,
                        tag=f"popular{i}",
                    )
                )
        for j in range(3):
            asks.append(
                Ask(
                    name=f"round{r}-oneoff{j}",
                    kind="completion",
                    prompt=_text(rng, 150),
                    priority=oneoff_priority,
                    tag="oneoff",
                )
            )
    return asks


def run_workload(base_url: str, asks: Sequence[Ask]) -> list[Answer]:
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="kvspec", max_retries=0, timeout=120)
    return [_ask(client, ask) for ask in asks]


def _extra_body(ask: Ask) -> dict[str, Any]:
    body: dict[str, Any] = {"ignore_eos": True}
    if ask.retention_s is not None:
        body["vllm_xargs"] = {"kv_retention_seconds": ask.retention_s}
    if ask.priority:
        body["priority"] = ask.priority
    return body


def _ask(client: Any, ask: Ask) -> Answer:
    common: dict[str, Any] = {
        "model": SERVED_NAME,
        "max_tokens": ask.max_tokens,
        "temperature": 0,
        "extra_body": _extra_body(ask),
    }
    if ask.stream:
        common["stream"] = True
        common["stream_options"] = {"include_usage": True}
    start = time.perf_counter()
    first: float | None = None
    if ask.kind == "chat":
        messages = [{"role": "system", "content": ask.system}] if ask.system else []
        messages.append({"role": "user", "content": ask.prompt})
        response = client.chat.completions.create(messages=messages, **common)
    else:
        response = client.completions.create(prompt=ask.prompt, **common)
    if ask.stream:
        pieces: list[str] = []
        usage = None
        for chunk in response:
            if chunk.choices:
                choice = chunk.choices[0]
                piece = choice.delta.content if ask.kind == "chat" else choice.text
                if piece:
                    if first is None:
                        first = time.perf_counter()
                    pieces.append(piece)
            if chunk.usage is not None:
                usage = chunk.usage
        text = "".join(pieces)
    else:
        choice = response.choices[0]
        text = choice.message.content if ask.kind == "chat" else choice.text
        usage = response.usage
    end = time.perf_counter()
    if usage is None:
        raise AssertionError(f"{ask.name}: the server sent no usage")
    details = usage.prompt_tokens_details
    return Answer(
        name=ask.name,
        tag=ask.tag,
        text=text or "",
        prompt_tokens=int(usage.prompt_tokens),
        cached_tokens=int(details.cached_tokens or 0) if details is not None else 0,
        completion_tokens=int(usage.completion_tokens),
        ttft_s=(first if first is not None else end) - start,
        latency_s=end - start,
    )


def answers_as_json(answers: Sequence[Answer]) -> list[dict[str, Any]]:
    return [asdict(a) for a in answers]
