"""When an answer's engine counts as stalled: a pure function of the last evidence that the engine
had the answer and worked (its arrival or the engine's last bytes), the engine's health checks and
now (grid.infer.responder.stall_verdict), and how the gateway reports it.

The real thing (a SIGSTOPped llama-server, and a busy one that is not cut off) is
tests/faults/test_engine_stall_in_flight.py.
"""

from __future__ import annotations

import json

import httpx
from hypothesis import given
from hypothesis import strategies as st

from grid.gateway.responses import STREAM_ENGINE_STALLED, ProxyStream, upstream_outcome
from grid.infer import wire
from grid.infer.client import EngineStalled, InferTarget, _read_error
from grid.infer.responder import (
    ENGINE_ALIVE,
    ENGINE_FLOWING,
    ENGINE_STALLED,
    ENGINE_UNPROVEN,
    PROBE_INTERVAL_SECONDS,
    PROBE_TIMEOUT_SECONDS,
    STALL_BOUND_SECONDS,
    STALL_PROBES,
    STALL_SILENCE_SECONDS,
    ProbeResult,
    needs_check,
    stall_verdict,
)

T0 = 1000.0  # the engine's last bytes to the answer (loop time)


def failed(*starts: float) -> list[ProbeResult]:
    return [ProbeResult(t, False) for t in starts]


def checks_from(first: float, n: int, answered: bool = False) -> list[ProbeResult]:
    """`n` checks one interval apart, as an engine's watch makes them."""
    return [ProbeResult(first + i * PROBE_INTERVAL_SECONDS, answered) for i in range(n)]


def test_an_engine_that_sent_bytes_lately_is_flowing_whatever_its_checks_said() -> None:
    just_after = T0 + STALL_SILENCE_SECONDS / 2
    assert stall_verdict(T0, [], just_after) == ENGINE_FLOWING
    # Failed checks from before the bytes: the bytes prove the engine came back.
    assert stall_verdict(T0, failed(T0 - 6, T0 - 4, T0 - 2), just_after) == ENGINE_FLOWING
    assert not needs_check(ENGINE_FLOWING)


def test_silence_alone_proves_nothing_it_only_asks_for_a_check() -> None:
    now = T0 + 60.0  # a long non-streamed answer: a minute without a byte
    assert stall_verdict(T0, [], now) == ENGINE_UNPROVEN
    assert needs_check(ENGINE_UNPROVEN)


def test_a_busy_engine_that_answers_its_checks_is_alive_for_as_long_as_it_answers() -> None:
    probes = checks_from(T0 + STALL_SILENCE_SECONDS, 100, answered=True)
    now = probes[-1].started_at + PROBE_TIMEOUT_SECONDS
    assert stall_verdict(T0, probes, now) == ENGINE_ALIVE
    # It stays watched: it may stop later.
    assert needs_check(ENGINE_ALIVE)


def test_stalled_takes_stall_probes_unanswered_checks_in_a_row_after_the_last_bytes() -> None:
    first = T0 + STALL_SILENCE_SECONDS
    probes = checks_from(first, STALL_PROBES)
    for n in range(1, STALL_PROBES):
        assert stall_verdict(T0, probes[:n], probes[n - 1].started_at + PROBE_TIMEOUT_SECONDS) == ENGINE_UNPROVEN
    assert stall_verdict(T0, probes, probes[-1].started_at + PROBE_TIMEOUT_SECONDS) == ENGINE_STALLED
    assert not needs_check(ENGINE_STALLED)


def test_one_answered_check_starts_the_count_again() -> None:
    first = T0 + STALL_SILENCE_SECONDS
    probes = checks_from(first, STALL_PROBES + 2)
    probes[1] = ProbeResult(probes[1].started_at, True)
    now = probes[-1].started_at + PROBE_TIMEOUT_SECONDS
    # Unanswered, answered, then STALL_PROBES unanswered: stalled only on the last three.
    assert stall_verdict(T0, probes[:-1], now) == ENGINE_UNPROVEN
    assert stall_verdict(T0, probes, now) == ENGINE_STALLED
    # The latest answered: alive, whatever came before.
    assert stall_verdict(T0, probes + [ProbeResult(now, True)], now + 1) == ENGINE_ALIVE


def test_checks_from_before_an_answer_arrived_do_not_count_against_it() -> None:
    """A request that reaches an engine whose earlier checks failed gets its own evidence: the
    responder passes the later of its arrival and the engine's last bytes."""
    probes = checks_from(T0 + STALL_SILENCE_SECONDS, STALL_PROBES)
    arrived = probes[-1].started_at + 0.5
    now = arrived + STALL_SILENCE_SECONDS
    assert stall_verdict(T0, probes, now) == ENGINE_STALLED
    assert stall_verdict(arrived, probes, now) == ENGINE_UNPROVEN


def test_an_engine_stopped_right_after_its_last_bytes_is_judged_within_the_bound() -> None:
    """The timeline of a stopped engine's watch: the silence is noticed at most a sweep late,
    then a check per interval (one interval from the start of one to the start of the next, or
    its timeout if longer), each unanswered after its timeout."""
    noticed = T0 + STALL_SILENCE_SECONDS + wire.PROGRESS_SWEEP_SECONDS  # the latest a sweep sees it
    probes: list[ProbeResult] = []
    now = noticed
    while stall_verdict(T0, probes, now) != ENGINE_STALLED:
        assert needs_check(stall_verdict(T0, probes, now))
        probes.append(ProbeResult(now, False))
        now += max(PROBE_TIMEOUT_SECONDS, PROBE_INTERVAL_SECONDS)
    judged = probes[-1].started_at + PROBE_TIMEOUT_SECONDS
    assert len(probes) == STALL_PROBES
    assert judged - T0 <= STALL_BOUND_SECONDS
    # The grid's promise for a request in flight on an engine that stopped.
    assert STALL_BOUND_SECONDS <= 15.0
    # A live engine answers a check in tens of ms: the timeout leaves a loaded machine room.
    assert PROBE_TIMEOUT_SECONDS >= 1.0 and STALL_PROBES >= 2


probe_lists = st.lists(st.tuples(st.floats(0, 100), st.booleans()), max_size=12).map(
    lambda items: [ProbeResult(T0 + t, ok) for t, ok in sorted(items)])


@given(probe_lists, st.floats(0, 200), st.floats(0, 100))
def test_never_stalled_without_the_evidence(probes: list[ProbeResult], later: float, heard_offset: float) -> None:
    heard = T0 + heard_offset
    now = T0 + later
    verdict = stall_verdict(heard, probes, now)
    since = [p for p in probes if p.started_at >= heard]
    if verdict == ENGINE_STALLED:
        assert now - heard >= STALL_SILENCE_SECONDS
        assert len(since) >= STALL_PROBES and not any(p.answered for p in since[-STALL_PROBES:])
    if since and since[-1].answered and now - heard >= STALL_SILENCE_SECONDS:
        assert verdict == ENGINE_ALIVE
    if now - heard < STALL_SILENCE_SECONDS:
        assert verdict == ENGINE_FLOWING


# How the gateway reports it.

TARGET = InferTarget("host-a", "m", "/v1/chat/completions")


def test_the_agents_stall_error_is_a_named_retryable_read_error() -> None:
    error = _read_error(TARGET, wire.ERR_ENGINE_STALLED)
    assert isinstance(error, EngineStalled) and isinstance(error, httpx.ReadError)
    assert error.code == "engine_stalled" and error.host_id == "host-a"
    assert "retry" in error.client_message
    assert upstream_outcome(error) == STREAM_ENGINE_STALLED
    # Any other engine failure stays a plain read error.
    assert type(_read_error(TARGET, "engine failed: ReadError")) is httpx.ReadError


def test_a_stream_cut_by_a_stalled_engine_ends_with_an_openai_error_event() -> None:
    stream = ProxyStream(200, [(b"content-type", b"text/event-stream")],
                         None, lambda _c: None, lambda _o: None)  # type: ignore[arg-type]
    event = stream._error_event(EngineStalled("x", "host-a"))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    body = json.loads(event[len(b"data: "):])
    assert body == {"error": {"message": EngineStalled.client_message, "type": "server_error", "param": None,
                              "code": "engine_stalled"}}
