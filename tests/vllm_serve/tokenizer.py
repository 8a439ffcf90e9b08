"""A small byte-level BPE tokenizer of kvspec's own, written beside a tiny checkpoint so ``vllm serve`` can start.

vLLM's server needs a tokenizer for text prompts, chat templates and ``vllm bench serve``'s datasets; the
project's checkpoints (tests/vllm_engine/checkpoints.py) have a vocabulary of 512 and none. This one is built
from rules, not trained, so it is the same on every machine: ids 0-2 are ``<pad>``, ``<s>``, ``</s>`` (the
checkpoints' pad, BOS and EOS ids); 3-258 the 256 byte-level symbols; 259-511 merges of frequent English
letter pairs (so ordinary text takes fewer tokens than bytes). Every id the model can emit decodes to text.
The chat template puts each message on a line of its own after its role.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB_SIZE = 512
SPECIALS = ("<pad>", "<s>", "</s>")
#: Letters by English frequency (with the space as ByteLevel's "Ġ" first): their pairs, in this order, are
#: the merges.
_LETTERS = "Ġetaoinshrdlucmfwypvbgk"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table: printable bytes stand for themselves, the rest for code points 256+."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    )
    symbols = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def tokenizer_json() -> dict[str, object]:
    vocab: dict[str, int] = {token: i for i, token in enumerate(SPECIALS)}
    for symbol in _byte_symbols():
        vocab[symbol] = len(vocab)
    merges: list[list[str]] = []
    for first in _LETTERS:
        for second in _LETTERS[1:]:
            if len(vocab) >= VOCAB_SIZE:
                break
            merged = first + second
            if merged not in vocab:
                vocab[merged] = len(vocab)
                merges.append([first, second])
    assert len(vocab) == VOCAB_SIZE, len(vocab)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, token in enumerate(SPECIALS)
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def write_tokenizer(directory: Path) -> Path:
    """Write the tokenizer's files into ``directory`` (a checkpoint's folder); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "add_bos_token": True,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (directory / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
    )
    return directory
