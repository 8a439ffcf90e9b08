"""Trace replay respects the model and stays bounded (issue 34): prompts over max_model_len or over the whole
cache are refused before they touch the cache or expand their hash ids; every kind of bad trace file is a
TraceFormatError naming the file and the line, at once."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import pytest

from kvspec.contracts.spec import SchedulerLimits
from kvspec.engine.replay import PromptAdmission, replay_cache, replay_coordinator
from kvspec.engine.timed_replay import replay_timed
from kvspec.engine.traces import MAX_LINE_BYTES, TraceRequest, parse_line, prompt_tokens, read_trace
from kvspec.errors import TraceFormatError
from tests.helpers import full_spec, make_config


def _lines(*rows: dict[str, object]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def _hashed(line: int, ids: list[int], *, block: int = 16, length: int | None = None) -> TraceRequest:
    return parse_line(
        {
            "hash_ids": ids,
            "hash_block_size": block,
            "input_length": length or len(ids) * block,
            "output_length": 1,
        },
        line=line,
        where=f"line {line}",
    )


def test_a_prompt_larger_than_the_cache_is_refused_before_it_evicts() -> None:
    """A 64-token prompt is cached; a 400-token prompt cannot fit 20 blocks of 16 (before the fix it was
    allocated chunk by chunk, evicting the first prompt, then turned away); the first prompt is hit again."""
    coordinator = replay_coordinator(make_config([full_spec(16)], 21), SchedulerLimits(max_model_len=1024))
    hits: list[int] = []
    stats = replay_cache(
        [_hashed(1, [1, 2, 3, 4]), _hashed(2, list(range(100, 125))), _hashed(3, [1, 2, 3, 4])],
        coordinator,
        chunk_tokens=64,
        on_request=lambda _item, hit: hits.append(hit),
    )
    assert stats.refused == 1
    assert hits == [0, 0, 48]  # the whole blocks before the last prompt token (always recomputed)
    coordinator.check_invariants()


def test_a_prompt_over_max_model_len_is_refused_without_expanding_its_ids(tmp_path: Path) -> None:
    """A line of 100,000 hash ids (51 million tokens) is read with its lengths only under max_prompt_tokens
    and counted as refused; expanding it took 3.6 GB. (A million ids is a line over MAX_LINE_BYTES.)"""
    path = tmp_path / "trace.jsonl"
    ids = list(range(100_000))
    path.write_text(
        _lines(
            {"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]},
            {"timestamp": 1, "input_length": len(ids) * 512, "output_length": 1, "hash_ids": ids},
        )
    )
    small, huge = read_trace(path, max_prompt_tokens=4096)
    assert not small.over_length and huge.over_length and huge.hash_ids == ()
    assert huge.input_length == 51_200_000
    with pytest.raises(TraceFormatError, match="not kept"):
        prompt_tokens(huge)
    coordinator = replay_coordinator(make_config([full_spec(16)], 400), SchedulerLimits(max_model_len=4096))
    stats = replay_cache([small, huge], coordinator)
    assert (stats.requests, stats.refused, stats.prompt_tokens) == (2, 1, 1000 + 51_200_000)


def test_admission_counts_every_group_and_the_chunk() -> None:
    """Blocks for one request: full attention all of its blocks; the pool's null block is not usable."""
    coordinator = replay_coordinator(make_config([full_spec(16)], 11), SchedulerLimits(max_model_len=1024))
    admission = PromptAdmission(coordinator, chunk_tokens=64)
    assert admission.blocks_needed(160) == 10 and admission.blocks_needed(161) == 11
    assert not admission.refuses(_hashed(1, list(range(10))))
    assert admission.refuses(_hashed(1, list(range(11)), length=161))
    # prompt and output together over max_model_len
    assert admission.refuses(_hashed(1, [1]), output_tokens=1024)


def test_a_timed_replay_refuses_a_prompt_larger_than_the_cache_on_arrival() -> None:
    coordinator = replay_coordinator(make_config([full_spec(16)], 21), SchedulerLimits(max_model_len=1024))
    stats = replay_timed(
        [_hashed(1, [1, 2, 3, 4]), _hashed(2, list(range(100, 125))), _hashed(3, [1, 2, 3, 4])],
        coordinator,
        max_num_batched_tokens=64,
        max_num_seqs=4,
    )
    assert stats.refused == 1 and stats.finished == 2
    assert stats.first_admission_hit_tokens == 48
    coordinator.check_invariants()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\xff\xfe garbage\n", r"trace.jsonl line 1: not UTF-8 text"),
        (
            b'{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [2147483648]}\n',
            r"line 1: 'hash_ids' holds 2,147,483,648; entries must be below 2,147,483,648 \(a hash id is its",
        ),
        (b'{"token_ids": [4294967296], "output_length": 1}\n', r"line 1: 'token_ids' holds 4,294,967,296"),
        (
            b'{"timestamp": NaN, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n',
            r"line 1: 'timestamp' must be a number",
        ),
        (
            b'{"hash_ids": [1], "input_length": 3, "output_length": 1}\n',
            r"needs 'hash_block_size' .* or 'timestamp'",
        ),
        (b"[" * 100_000 + b"\n", r"line 1: nests JSON too deeply"),
    ],
)
def test_bad_trace_content_names_the_file_and_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message):
        list(read_trace(path))


def test_a_line_over_the_limit_is_refused_before_it_is_held(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    with path.open("wb") as handle:
        handle.write(b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
        handle.write(b'{"timestamp": 1, "hash_ids": [' + b"1, " * (MAX_LINE_BYTES // 3 + 10) + b"1]}\n")
    start = time.monotonic()
    with pytest.raises(TraceFormatError, match=r"trace.jsonl line 2: longer than 4,194,304 bytes"):
        list(read_trace(path))
    assert time.monotonic() - start < 10


def test_gzip_traces_are_read_by_suffix_or_magic(tmp_path: Path) -> None:
    text = _lines(
        {"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 5, "input_length": 100, "output_length": 1, "hash_ids": [1]},
    ).encode()
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(text))
    (tmp_path / "t.jsonl").write_bytes(gzip.compress(text))  # compressed without the suffix
    for name in ("t.jsonl.gz", "t.jsonl"):
        assert [r.input_length for r in read_trace(tmp_path / name)] == [600, 100]
    (tmp_path / "broken.gz").write_bytes(gzip.compress(text)[:30])
    with pytest.raises(TraceFormatError, match=r"broken\.gz line 1: cannot read the file"):
        list(read_trace(tmp_path / "broken.gz"))


def test_fifos_devices_and_folders_are_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero"), tmp_path):
        start = time.monotonic()
        with pytest.raises(TraceFormatError, match="is not a regular file"):
            list(read_trace(path))
        assert time.monotonic() - start < 5
    with pytest.raises(TraceFormatError, match="cannot read trace"):
        list(read_trace(tmp_path / "missing.jsonl"))
