"""The bounded, fragmentation-safe SSE usage parser."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from grid.gateway.sse import MAX_EVENT_BYTES, UsageParser, completion_tokens_of

STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"Hello"}}]}\n\n'
    b': a comment line\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":" usage \\"usage\\" in text"}}]}\n\n'
    b'data: {"choices":[],"usage":{"completion_tokens":17,"prompt_tokens":31,"total_tokens":48}}\n\n'
    b"data: [DONE]\n\n"
)


def parse(chunks: list[bytes]) -> UsageParser:
    p = UsageParser()
    for c in chunks:
        p.feed(c)
    p.close()
    return p


def test_whole_stream() -> None:
    p = parse([STREAM])
    assert p.completion_tokens == 17 and p.done and p.events == 5


def test_every_single_split_point() -> None:
    for i in range(len(STREAM) + 1):
        p = parse([STREAM[:i], STREAM[i:]])
        assert p.completion_tokens == 17 and p.done, i


def test_byte_by_byte_and_crlf() -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    assert parse([bytes([b]) for b in crlf]).completion_tokens == 17


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_property_any_fragmentation(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks, last = [], 0
    for p in points:
        chunks.append(STREAM[last:p])
        last = p
    chunks.append(STREAM[last:])
    assert parse(chunks).completion_tokens == 17


def test_stream_without_usage_reports_none() -> None:
    p = parse([b'data: {"choices":[{"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n'])
    assert p.completion_tokens is None and p.done


def test_malformed_and_hostile_events_are_ignored() -> None:
    p = parse([
        b'data: {"usage": {"completion_tokens": "many"}}\n\n',
        b'data: {"usage": {"completion_tokens": -3}}\n\n',
        b'data: {"usage": \n\n',
        b'data: {"usage":' + b"[" * 5000 + b"\n\n",
        b'data: {"usage": {"completion_tokens": 5}}\n\n',
    ])
    assert p.completion_tokens == 5


def test_oversized_events_are_skipped_and_memory_stays_bounded() -> None:
    p = UsageParser()
    big = b'data: {"usage":{"completion_tokens":99},"pad":"' + b"x" * (MAX_EVENT_BYTES * 2) + b'"}\n\n'
    for i in range(0, len(big), 4096):
        p.feed(big[i:i + 4096])
        assert len(p._partial) <= MAX_EVENT_BYTES
    p.feed(b'data: {"usage":{"completion_tokens":3}}\n\n')
    p.close()
    assert p.completion_tokens == 3
    # many data lines adding up past the bound are dropped as one oversized event
    lines = b"".join(b"data: " + b"y" * 1000 + b"\n" for _ in range(MAX_EVENT_BYTES // 1000 + 2))
    q = parse([lines + b'data: {"usage":{"completion_tokens":8}}\n\n'])
    assert q.completion_tokens is None


def test_final_event_without_trailing_blank_line() -> None:
    assert parse([b'data: {"usage":{"completion_tokens":4}}']).completion_tokens == 4


def test_completion_tokens_of_plain_body() -> None:
    assert completion_tokens_of(b'{"choices":[],"usage":{"completion_tokens":12}}') == 12
    assert completion_tokens_of(b'{"choices":[]}') is None
    assert completion_tokens_of(b"not json") is None
    assert completion_tokens_of(b"[1,2]") is None
