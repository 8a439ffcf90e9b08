"""Request traces (issue 21, first part): the Mooncake and kvspec formats, hash ids as tokens, clear errors
naming the line, and the pure cache replay through the real coordinator against the published count."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest

from kvspec.blocks.hashing import BlockHasher
from kvspec.blocks.request import Request
from kvspec.contracts.spec import SchedulerLimits
from kvspec.engine.replay import ReplayStats, TraceClock, replay_cache, replay_coordinator, trace_request
from kvspec.engine.timed_replay import StepTimeModel, replay_timed
from kvspec.engine.traces import HASH_ID_LIMIT, TraceRequest, parse_line, prompt_tokens, read_trace
from kvspec.errors import KVSpecError, SchedulingError, TraceFormatError
from tests.helpers import full_spec, make_config, make_coordinator, sw_spec

TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"
CONVERSATION = TRACES / "mooncake_conversation_trace.jsonl"


def _write(tmp_path: Path, lines: list[object]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_mooncake_lines_and_kvspec_lines() -> None:
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [3, 4]},
        {"arrival_ms": 10.5, "token_ids": [1, 2, 3], "output_length": 2, "priority": -1},
        {
            "hash_ids": [3],
            "hash_block_size": 4,
            "input_length": 3,
            "output_length": 1,
            "retention_seconds": 30,
        },
    ]
    a, b, c = (parse_line(row, line=i + 1, where=f"line {i + 1}") for i, row in enumerate(rows))
    assert (a.hash_block_size, a.input_length, a.arrival_ms) == (512, 600, 0.0)
    assert (b.token_ids, b.priority, b.arrival_ms, b.input_length) == ((1, 2, 3), -1, 10.5, 3)
    assert (c.hash_block_size, c.retention_seconds) == (4, 30.0)


def test_equal_hash_prefixes_give_equal_token_prefixes(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [7, 8]},
            {"timestamp": 1, "input_length": 700, "output_length": 1, "hash_ids": [7, 9]},
        ],
    )
    first, second = (prompt_tokens(r) for r in read_trace(path))
    assert (len(first), len(second)) == (1000, 700)
    assert first[:512] == second[:512] == [7] * 512
    assert first[512:] == [8] * 488 and second[512:] == [9] * 188  # distinct ids share no token
    # The biggest id a trace may hold is expanded as itself (below the generated tokens' 3 * 10**9).
    top = parse_line(
        {"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [2**31 - 1]}, line=1, where="x"
    )
    assert prompt_tokens(top) == [2**31 - 1] * 3


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"trace\.jsonl line 2: not JSON"),
        ('{"timestamp": 5, "input_length": 10, "hash_ids": [1]}', r"line 2: missing 'output_length'"),
        (
            '{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [1]}',
            r"line 2: 'input_length' 600 does not fit 1 hash ids of 512 tokens",
        ),
        (
            '{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": []}',
            r"line 2: 'hash_ids' must be",
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}',
            r"line 2: 'timestamp' 0 is before",
        ),
        ('{"token_ids": [1, -2], "output_length": 1}', r"line 2: 'token_ids' holds -2"),
        (
            '{"token_ids": [1], "hash_ids": [1], "output_length": 1}',
            r"line 2: give 'token_ids' or 'hash_ids'",
        ),
        (
            '{"hash_ids": [1], "input_length": 3, "output_length": 1}',
            r"line 2: a line of 'hash_ids' needs 'hash_block_size' .* or 'timestamp'",
        ),
        (
            '{"token_ids": [1], "output_length": 1, "priority": "high"}',
            r"line 2: 'priority' must be an integer",
        ),
        ("[1, 2]", r"line 2: expected a JSON object, got list"),
    ],
)
def test_bad_lines_name_the_line_and_the_field(tmp_path: Path, line: str, message: str) -> None:
    path = _write(tmp_path, [{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1]}, line])
    with pytest.raises(TraceFormatError, match=message):
        list(read_trace(path))
    assert issubclass(TraceFormatError, KVSpecError) and issubclass(TraceFormatError, ValueError)


def test_a_missing_trace_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot read trace"):
        list(read_trace(tmp_path / "nope.jsonl"))


def leading_runs(requests: list[TraceRequest]) -> list[int]:
    """The README's count, per request in arrival order: how many of its first hash ids were seen before."""
    seen: set[int] = set()
    runs: list[int] = []
    for r in requests:
        assert r.hash_ids is not None
        k = 0
        while k < len(r.hash_ids) and r.hash_ids[k] in seen:
            k += 1
        runs.append(k)
        seen.update(r.hash_ids)
    return runs


def _published_count(requests: list[TraceRequest]) -> tuple[int, int]:
    """The leading runs with the engine's rules: in tokens, capped at the prompt's last token and floored to
    the 16-token block; and in the trace blocks that hit reaches into."""
    tokens = blocks = 0
    for r, k in zip(requests, leading_runs(requests), strict=True):
        hit = min(k * 512, r.input_length - 1) // 16 * 16
        tokens += hit
        blocks += -(-hit // 512)
    return tokens, blocks


@pytest.mark.skipif(not CONVERSATION.exists(), reason="needs ../shared/traces")
def test_unlimited_replay_equals_the_published_count_request_by_request() -> None:
    """The first 150 requests of the conversation trace: the real coordinator's hits equal the leading-run
    count (the README's figure, 0.3736 of tokens over the whole trace) request by request."""
    requests = list(read_trace(CONVERSATION, limit=150))
    blocks = sum(r.input_length // 16 + 1 for r in requests) + 1
    coord = make_coordinator([full_spec(16)], blocks, max_model_len=max(r.input_length for r in requests))
    hits: list[int] = []
    stats = replay_cache(requests, coord, on_request=lambda _r, hit: hits.append(hit))
    tokens, blocks = _published_count(requests)
    assert (stats.hit_tokens, stats.hit_blocks) == (tokens, blocks)
    assert stats.hit_tokens > 0 and stats.refused == 0
    expected = [
        _published_count(requests[: i + 1])[0] - _published_count(requests[:i])[0]
        for i in range(len(requests))
    ]
    assert hits == expected
    assert coord.block_pool.get_num_free_blocks() == coord.block_pool.num_gpu_blocks - 1  # nothing held


def test_a_small_cache_evicts_and_hits_less() -> None:
    """Two requests sharing a 256-token prefix with an unrelated one between them: with room for all, the
    third hits the prefix; in a 20-block cache (19 usable, 19 per request) the unrelated request evicts it;
    in a 10-block cache no prompt fits (refused, no hit)."""
    shared = tuple(range(1000, 1256))
    prompts = [shared + tuple(range(44)), tuple(range(5000, 5300)), shared + tuple(range(3000, 3044))]
    rows = [
        TraceRequest(line=i, arrival_ms=float(i), input_length=300, output_length=1, token_ids=p)
        for i, p in enumerate(prompts)
    ]
    big = replay_cache(rows, make_coordinator([full_spec(16)], 64))
    assert (big.hit_tokens, big.hit_blocks, big.prompt_blocks, big.refused) == (256, 16, 57, 0)
    small = replay_cache(rows, make_coordinator([full_spec(16)], 20))
    assert (small.hit_tokens, small.refused) == (0, 0)
    tiny = replay_cache(rows, make_coordinator([full_spec(16)], 10))
    assert (tiny.hit_tokens, tiny.refused) == (0, 3)
    short = replay_cache(rows, make_coordinator([full_spec(16)], 64, max_model_len=299))
    assert (short.hit_tokens, short.refused, short.prompt_tokens) == (0, 3, 900)


def _record(out: list[int], _request: TraceRequest, hit: int) -> None:
    out.append(hit)


def test_a_mamba_hybrid_hits_where_chunks_ended_and_at_pinned_junctions() -> None:
    """Full attention + Mamba "align": the first request's prompt is computed in one chunk, so only its end
    state exists; the second learns the junction at 64 tokens (full attention hits, Mamba does not), ends
    its first chunk there and so leaves a state at 64; the third then hits 64. In 32-token chunks the first
    request leaves states every 32 tokens and the second already hits 64."""
    import torch

    from kvspec import MambaSpec

    mamba = MambaSpec(block_size=16, shapes=((16, 4),), dtypes=(torch.float32,), mamba_cache_mode="align")
    shared = tuple(range(1000, 1064))
    rows = [
        TraceRequest(line=i, arrival_ms=float(i), input_length=128, output_length=1, token_ids=shared + tail)
        for i, tail in enumerate([tuple(range(64)), tuple(range(2000, 2064)), tuple(range(3000, 3064))])
    ]
    for chunk, expected in ((None, [0, 0, 64]), (32, [0, 64, 64])):
        coord = make_coordinator([full_spec(16), mamba], 200, max_model_len=1024)
        hits: list[int] = []
        replay_cache(rows, coord, chunk_tokens=chunk, on_request=functools.partial(_record, hits))
        assert hits == expected, chunk
    with pytest.raises(KVSpecError, match="below the scheduler block"):
        replay_cache(rows, make_coordinator([full_spec(16)], 64), chunk_tokens=8)


def _three_siblings(shared_tokens: int, arrival_gap_ms: float = 1.0) -> list[TraceRequest]:
    """Three 128-token prompts sharing their first ``shared_tokens`` tokens, each with its own tail."""
    shared = tuple(range(1000, 1000 + shared_tokens))
    tails = [tuple(range(b, b + 128 - shared_tokens)) for b in (0, 2000, 3000)]
    return [
        TraceRequest(
            line=i, arrival_ms=arrival_gap_ms * i, input_length=128, output_length=1, token_ids=shared + tail
        )
        for i, tail in enumerate(tails)
    ]


@pytest.mark.parametrize(("retention", "expected"), [(None, [0, 64, 64]), (0, [0, 0, 64]), (48, [0, 48, 64])])
def test_a_replay_retains_sliding_window_blocks_as_the_release_plans(
    retention: int | None, expected: list[int]
) -> None:
    """Full attention + a 32-token window. Dense (None, vLLM 0.23) caches every window block, so the second
    prompt hits the whole 64-token shared prefix. Sparse (0, vLLM 0.34's plan and the replay's default) keeps
    the window's tail only at the first prompt's replay boundary: the second hits nothing, learns the
    junction at 64 and caches the tail there, so the third hits 64. An interval of 48 tokens also keeps a tail
    at 48."""
    coord = replay_coordinator(
        make_config([full_spec(16), sw_spec(32)], 200),
        SchedulerLimits(max_model_len=1024),
        retention_interval=retention,
    )
    assert coord.prefix_cache_retention_interval == retention
    hits: list[int] = []
    replay_cache(_three_siblings(64), coord, on_request=functools.partial(_record, hits))
    assert hits == expected
    default = replay_coordinator(
        make_config([full_spec(16), sw_spec(32)], 200), SchedulerLimits(max_model_len=1024)
    )
    assert default.prefix_cache_retention_interval == 0
    coord.check_invariants()


def test_a_timed_replay_pins_the_shared_prefix_junction() -> None:
    """As the pure replay: full attention + Mamba "align", prompts computed in one chunk (a 1024-token
    budget). The second request's lookup finds full attention reaching 64 tokens past Mamba's hit (0): its
    first chunk ends at that junction, leaving a state there, so the third request hits 64 tokens."""
    import torch

    from kvspec import MambaSpec

    mamba = MambaSpec(block_size=16, shapes=((16, 4),), dtypes=(torch.float32,), mamba_cache_mode="align")
    coord = replay_coordinator(
        make_config([full_spec(16), mamba], 200),
        SchedulerLimits(max_model_len=1024, mamba_cache_mode="align"),
    )
    stats = replay_timed(
        _three_siblings(64, arrival_gap_ms=1000.0), coord, max_num_batched_tokens=1024, max_num_seqs=4
    )
    assert (stats.finished, stats.first_admission_hit_tokens, stats.preemptions) == (3, 64, 0)
    assert stats.steps == 4  # the second request's prompt took two steps: to the junction, then the rest
    coord.check_invariants()


def _retention_rows(retention: float | None) -> list[TraceRequest]:
    shared = tuple(range(1000, 1256))  # 16 blocks of 16 tokens
    prompts = [
        shared + tuple(range(44)),
        tuple(range(5000, 5300)),
        tuple(range(7000, 7300)),
        shared + tuple(range(3000, 3044)),
    ]
    return [
        TraceRequest(
            line=i,
            arrival_ms=1000.0 * i,
            input_length=300,
            output_length=1,
            token_ids=p,
            retention_seconds=retention if i == 0 else None,
        )
        for i, p in enumerate(prompts)
    ]


@pytest.mark.parametrize(
    ("policy", "retention", "last_hit"),
    [
        ("lru", 60.0, 32),  # vLLM's LRU ignores the ask: the third prompt evicts the prefix down to 2 blocks
        ("retention", 60.0, 256),  # the prefix is retained; the unrelated second prompt is evicted instead
        ("retention", 1.5, 32),  # the retention ended (t=1.5 s) before the third prompt arrived (t=2 s)
        ("retention", None, 32),  # no ask: LRU's order
    ],
)
def test_a_trace_request_can_retain_its_prefix(policy: str, retention: float | None, last_hit: int) -> None:
    """A 39-block cache, 19 blocks a prompt: the third prompt must evict 16 cached blocks. LRU takes the
    oldest, the first prompt's (tail first, leaving its first 2 blocks); the retention policy keeps the
    first prompt's retained prefix and takes the second's, so the fourth prompt hits all 256 shared tokens."""
    clock = TraceClock()
    coord = replay_coordinator(
        make_config([full_spec(16)], 40),
        SchedulerLimits(max_model_len=4096),
        eviction_policy=policy,
        clock=clock,
    )
    hits: list[int] = []
    replay_cache(_retention_rows(retention), coord, on_request=functools.partial(_record, hits), clock=clock)
    assert hits == [0, 0, 0, last_hit]
    assert clock.now == 3.0
    coord.check_invariants()


def test_a_timed_replay_follows_the_step_time_model_exactly() -> None:
    """A (t=0, 100 tokens, 2 out) and B (t=50 ms, the same prompt, 1 out); 64 tokens a step; a step costs
    10 ms + 0.5 ms a token. Step 1 (t=0): A's first 64 tokens, 42 ms. Step 2 (t=42): A's last 36, 28 ms: A's
    first token at 70. Step 3 (t=70): A decodes 1, B arrived and hits A's 6 cached blocks (96 tokens) and
    computes 4: 5 tokens, 12.5 ms: at 82.5 A finishes and B's first (and last) token is out."""
    prompt = tuple(range(500, 600))
    rows = [
        TraceRequest(line=0, arrival_ms=0.0, input_length=100, output_length=2, token_ids=prompt),
        TraceRequest(line=1, arrival_ms=50.0, input_length=100, output_length=1, token_ids=prompt),
    ]
    clock = TraceClock()
    coord = replay_coordinator(
        make_config([full_spec(16)], 64), SchedulerLimits(max_model_len=4096), clock=clock
    )
    model = StepTimeModel(base_ms=10.0, per_token_ms=0.5, per_request_ms=0.0)
    stats = replay_timed(rows, coord, max_num_batched_tokens=64, max_num_seqs=4, step_time=model, clock=clock)
    assert (stats.steps, stats.finished, stats.refused, stats.preemptions) == (3, 2, 0, 0)
    assert stats.ttft_ms == [70.0, 32.5] and stats.e2e_ms == [82.5, 32.5] and stats.simulated_ms == 82.5
    assert (stats.query_tokens, stats.hit_tokens, stats.generated_tokens) == (200, 96, 3)
    assert stats.prompt_hit_rate == 96 / 200 and clock.now == 70 / 1000  # the last step started at 70 ms
    assert coord.block_pool.get_num_free_blocks() == 63
    coord.check_invariants()


def test_a_timed_replay_preempts_recomputes_and_refuses() -> None:
    """Ten 16-token blocks (9 usable): two requests of 64 prompt tokens growing by 60 output tokens each
    cannot both finish at once: one is preempted, readmitted (its prompt looked up again) and finishes; a
    300-token prompt can never fit and is refused; one longer than max_model_len is refused on arrival."""
    rows = [
        TraceRequest(
            line=i,
            arrival_ms=0.0,
            input_length=64,
            output_length=60,
            token_ids=tuple(range(i * 1000, i * 1000 + 64)),
        )
        for i in range(2)
    ]
    rows.append(
        TraceRequest(
            line=2, arrival_ms=1.0, input_length=300, output_length=1, token_ids=tuple(range(9000, 9300))
        )
    )
    rows.append(
        TraceRequest(line=3, arrival_ms=1.0, input_length=900, output_length=200, token_ids=tuple(range(900)))
    )
    coord = replay_coordinator(make_config([full_spec(16)], 10), SchedulerLimits(max_model_len=1024))
    stats = replay_timed(rows, coord, max_num_batched_tokens=64, max_num_seqs=4)
    assert (stats.requests, stats.finished, stats.refused) == (4, 2, 2)
    assert stats.preemptions >= 1 and stats.generated_tokens >= 120
    assert stats.query_tokens > 128  # a readmission looks the prompt (and its output so far) up again
    assert len(stats.ttft_ms) == 2 and len(stats.e2e_ms) == 2
    assert coord.block_pool.get_num_free_blocks() == 9
    coord.check_invariants()
    with pytest.raises(SchedulingError, match="PER_TOKEN"):
        StepTimeModel.parse("6,0.06")
    with pytest.raises(SchedulingError, match="per_token_ms must be >= 0"):
        StepTimeModel(per_token_ms=-1.0)


def test_a_timed_replay_cuts_mamba_align_chunks_on_block_boundaries() -> None:
    """Three prompts share 100 tokens (6 full 16-token blocks); 40 tokens a step. vLLM's Scheduler cuts a
    Mamba "align" prefill chunk to whole blocks (32 of the 40) and ends the chunk reaching past the last full
    block exactly there, so the second prompt's chunks end at 32, 64 and its junction 96, where its state is
    kept: the third prompt hits 96 tokens. Cut at 40 and 80 instead, no state lies on the shared prefix and
    the third would hit nothing. Steps: A 0-32-64-96-112-120 (5), B the same (5), C 96-112-120 (2)."""
    import torch

    from kvspec import MambaSpec

    shared = tuple(range(1000, 1100))
    rows = [
        TraceRequest(
            line=i,
            arrival_ms=1000.0 * i,
            input_length=120,
            output_length=1,
            token_ids=shared + tuple(range(5000 + 1000 * i, 5020 + 1000 * i)),
        )
        for i in range(3)
    ]
    mamba = MambaSpec(block_size=16, shapes=((16, 4),), dtypes=(torch.float32,), mamba_cache_mode="align")
    coord = replay_coordinator(
        make_config([full_spec(16), mamba], 200),
        SchedulerLimits(max_model_len=1024, mamba_cache_mode="align"),
    )
    stats = replay_timed(rows, coord, max_num_batched_tokens=40, max_num_seqs=4)
    assert (stats.first_admission_hit_tokens, stats.steps) == (96, 12)
    coord.check_invariants()


@pytest.mark.parametrize("input_length", [1000, 1024, 513, 30])
def test_trace_requests_hash_their_runs_as_their_tokens(input_length: int) -> None:
    """A trace request is hashed run by run; its hashes are those its expanded prompt gives, and the
    generated tokens go on into the same chain."""
    ids = [7, 8] if input_length > 512 else [7]
    item = parse_line(
        {"timestamp": 0, "input_length": input_length, "output_length": 1, "hash_ids": ids}, line=3, where="x"
    )
    hasher = BlockHasher(16, seed=b"trace")
    fast = trace_request(item, hasher)
    plain = Request("plain", prompt_tokens(item), block_hasher=hasher)
    assert fast.request_id == "trace-3" and fast.all_token_ids == plain.all_token_ids
    assert fast.block_hashes == plain.block_hashes and len(plain.block_hashes) == input_length // 16
    for request in (fast, plain):
        request.append_output_token_ids(list(range(3_000_000_000, 3_000_000_040)))
    assert fast.block_hashes == plain.block_hashes


def test_hash_ids_stay_below_generated_tokens() -> None:
    from kvspec.engine.instance import _GENERATED_BASE

    assert HASH_ID_LIMIT <= _GENERATED_BASE  # a prompt token never equals a generated one


@pytest.mark.parametrize(
    ("retention", "group_hits", "limited"),
    [(0, (128, 64), (0, 1)), (None, (128, 128), (0, 0))],
)
def test_per_group_counts_name_the_group_that_limits_the_hit(
    retention: int | None, group_hits: tuple[int, int], limited: tuple[int, int]
) -> None:
    """The three siblings again (issue 52's per-group report). Under sparse retention the second prompt's full
    attention finds all 64 shared tokens but the window none: the window limited that hit. Dense: no group
    limits. Counting changes nothing of the replay itself."""

    def replay(per_group: bool) -> ReplayStats:
        coord = replay_coordinator(
            make_config([full_spec(16), sw_spec(32)], 200),
            SchedulerLimits(max_model_len=1024),
            retention_interval=retention,
        )
        stats = replay_cache(_three_siblings(64), coord, per_group=per_group)
        coord.check_invariants()
        return stats

    counted, plain = replay(True), replay(False)
    assert (counted.group_hit_tokens, counted.group_limited_requests) == (group_hits, limited)
    assert counted.limiting_groups == ((1,) if any(limited) else ())
    assert dataclasses.replace(counted, group_hit_tokens=(), group_limited_requests=()) == plain
    assert plain.group_hit_tokens == () and "limiting_groups" not in plain.summary()
    summary = counted.summary()
    assert summary["group_hit_rates"] == [round(t / 384, 4) for t in group_hits]
    assert summary["group_limited_requests"] == list(limited)
