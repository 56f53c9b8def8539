"""The forwarding failure table (grid.gateway.failures) pins what each failure means.

Every exception the gateway handles while sending a request or reading a plain answer maps to
(breaker outcome, telemetry outcome, HTTP status, error code, routed again), and a failed stream
ending to what its record and the route's breaker learn. The expected rows are written out here,
not derived from the table, so changing a row means changing this test.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from grid.gateway import failures
from grid.gateway.failures import READING, SENDING, failure_of, stream_ending_of
from grid.infer.client import (
    EngineStalled,
    NoResponders,
    NotServedThere,
    SilentBeforeAnswer,
    SilentHost,
    SilentMidAnswer,
    UpstreamConnectionLost,
)

NO_RESPONDERS = ("neutral", "unavailable", 503, "model_not_ready", True)
NOT_SERVED_THERE = ("neutral", "unavailable", 503, "model_not_ready", True)
CONNECTION_LOST = ("neutral", "error", 502, "upstream_connection_lost", False)
SILENT = ("failure", "timeout", 504, "upstream_silent", False)
STALLED = ("failure", "timeout", 504, "engine_stalled", False)
SEND_TIMEOUT = ("failure", "timeout", 504, "upstream_timeout", False)
UNREACHABLE = ("failure", "error", 502, "upstream_error", False)
SEND_CANCELLED = ("neutral", "cancelled", 499, None, False)
BROKE_DURING_RESPONSE = ("failure", "error", 502, "upstream_error", False)
READ_CANCELLED = (None, "cancelled", 499, None, False)

SENT: list[tuple[BaseException, tuple[object, ...]]] = [
    (NoResponders("x", "h"), NO_RESPONDERS),
    (NotServedThere("x", "h", "m"), NOT_SERVED_THERE),
    (UpstreamConnectionLost("x"), CONNECTION_LOST),
    (SilentHost("x", "h"), SILENT),
    (SilentBeforeAnswer("x", "h"), SILENT),  # also an httpx.ConnectTimeout
    (SilentMidAnswer("x", "h"), SILENT),  # also an httpx.ReadTimeout
    (EngineStalled("x", "h"), STALLED),
    (httpx.ConnectTimeout("x"), SEND_TIMEOUT),
    (httpx.ReadTimeout("x"), SEND_TIMEOUT),
    (httpx.WriteTimeout("x"), SEND_TIMEOUT),
    (httpx.PoolTimeout("x"), SEND_TIMEOUT),
    (httpx.ConnectError("x"), UNREACHABLE),
    (httpx.ReadError("x"), UNREACHABLE),
    (httpx.RemoteProtocolError("x"), UNREACHABLE),
    (httpx.UnsupportedProtocol("x"), UNREACHABLE),
    (httpx.InvalidURL("x"), UNREACHABLE),
    (OSError("x"), UNREACHABLE),
    (ConnectionResetError("x"), UNREACHABLE),
    (ValueError("x"), UNREACHABLE),
    (asyncio.CancelledError(), SEND_CANCELLED),
    (KeyboardInterrupt(), SEND_CANCELLED),
    (RuntimeError("x"), SEND_CANCELLED),
]

READ: list[tuple[BaseException, tuple[object, ...]]] = [
    (UpstreamConnectionLost("x"), CONNECTION_LOST),
    (SilentHost("x", "h"), SILENT),
    (SilentMidAnswer("x", "h"), SILENT),
    (EngineStalled("x", "h"), STALLED),
    (httpx.ReadTimeout("x"), BROKE_DURING_RESPONSE),
    (httpx.ReadError("x"), BROKE_DURING_RESPONSE),
    (httpx.RemoteProtocolError("x"), BROKE_DURING_RESPONSE),
    (NoResponders("x", "h"), BROKE_DURING_RESPONSE),
    (NotServedThere("x", "h", "m"), BROKE_DURING_RESPONSE),
    (httpx.InvalidURL("x"), READ_CANCELLED),
    (OSError("x"), READ_CANCELLED),
    (ValueError("x"), READ_CANCELLED),
    (asyncio.CancelledError(), READ_CANCELLED),
    (RuntimeError("x"), READ_CANCELLED),
]


def _row(failure: failures.Failure) -> tuple[object, ...]:
    return failure.breaker, failure.outcome, failure.status, failure.code, failure.reroutable


@pytest.mark.parametrize("exc,expected", SENT, ids=[type(e).__name__ for e, _ in SENT])
def test_failures_while_sending(exc: BaseException, expected: tuple[object, ...]) -> None:
    assert _row(failure_of(SENDING, exc)) == expected


@pytest.mark.parametrize("exc,expected", READ, ids=[type(e).__name__ for e, _ in READ])
def test_failures_while_reading_a_plain_answer(exc: BaseException, expected: tuple[object, ...]) -> None:
    assert _row(failure_of(READING, exc)) == expected


def _answer(failure: failures.Failure, model: str = "m") -> tuple[int, dict[str, object], str | None]:
    r = failure.response(model)
    return r.status_code, json.loads(r.body)["error"], r.headers.get("retry-after")


def test_what_the_client_is_told() -> None:
    assert _answer(failure_of(SENDING, NoResponders("x", "h"))) == (
        503, {"message": "The host serving this model went away; retry shortly.",
              "type": "service_unavailable_error", "param": None, "code": "model_not_ready"}, "1")
    assert _answer(failure_of(SENDING, NotServedThere("x", "h", "m")), model="qwen-{0}") == (
        503, {"message": "No host could serve 'qwen-{0}' just now; retry shortly.",
              "type": "service_unavailable_error", "param": None, "code": "model_not_ready"}, "1")
    for stage in (SENDING, READING):
        assert _answer(failure_of(stage, UpstreamConnectionLost("x"))) == (
            502, {"message": UpstreamConnectionLost.client_message, "type": "server_error", "param": None,
                  "code": "upstream_connection_lost"}, "1")
        assert _answer(failure_of(stage, SilentHost("x", "h"))) == (
            504, {"message": SilentHost.client_message, "type": "server_error", "param": None,
                  "code": "upstream_silent"}, "1")
        assert _answer(failure_of(stage, EngineStalled("x", "h"))) == (
            504, {"message": EngineStalled.client_message, "type": "server_error", "param": None,
                  "code": "engine_stalled"}, "1")
    assert _answer(failure_of(SENDING, httpx.ReadTimeout("x"))) == (
        504, {"message": "The engine did not answer in time.", "type": "server_error", "param": None,
              "code": "upstream_timeout"}, None)
    assert _answer(failure_of(SENDING, OSError("x"))) == (
        502, {"message": "The engine could not be reached.", "type": "server_error", "param": None,
              "code": "upstream_error"}, None)
    assert _answer(failure_of(READING, httpx.ReadError("x"))) == (
        502, {"message": "The engine connection broke during the response.", "type": "server_error",
              "param": None, "code": "upstream_error"}, None)


def test_what_routing_learns() -> None:
    gone = failure_of(SENDING, NoResponders("x", "h"))
    assert (gone.excludes_host, gone.reroute_counter, gone.refuses_route) == (
        "no_responders", "no_responders_retried", False)
    refused = failure_of(SENDING, NotServedThere("x", "h", "m"))
    assert (refused.excludes_host, refused.reroute_counter, refused.refuses_route) == (
        None, "not_served_there_retried", True)
    for stage in (SENDING, READING):
        assert failure_of(stage, SilentMidAnswer("x", "h")).excludes_host == "agent_silent"
    others = [f for f in failures.FAILURES if f is not gone and f is not refused]
    assert {f.reroute_counter for f in others} == {None} and not any(f.refuses_route for f in others)
    assert {f.excludes_host for f in others if SilentHost not in f.caught} == {None}


def test_every_stage_ends_with_a_row_for_anything() -> None:
    for stage in (SENDING, READING):
        assert [f for f in failures.FAILURES if f.stage == stage][-1].caught == (BaseException,)


STREAM_ENDINGS = {
    # ProxyStream outcome: (breaker outcome, telemetry outcome, status, host excluded, tokens counted)
    "cancelled": (None, "cancelled", 499, None, True),
    "connection_lost": (None, "error", 502, None, False),
    "upstream_silent": ("failure", "timeout", 502, "agent_silent", False),
    "engine_stalled": ("failure", "timeout", 502, None, True),
    "upstream_timeout": ("failure", "timeout", 502, None, False),
    "upstream_error": ("failure", "error", 502, None, False),
    "an outcome nobody named": ("failure", "error", 502, None, False),
}


@pytest.mark.parametrize("outcome", list(STREAM_ENDINGS))
def test_failed_stream_endings(outcome: str) -> None:
    e = stream_ending_of(outcome)
    assert (e.breaker, e.outcome, e.status, e.excludes_host, e.counts_output) == STREAM_ENDINGS[outcome]
