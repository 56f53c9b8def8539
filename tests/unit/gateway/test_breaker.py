"""Per engine+model circuit breaker over proxy-observed outcomes (explicit time)."""

from __future__ import annotations

from grid.gateway import breaker
from grid.gateway.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    OUTCOME_FAILURE,
    OUTCOME_NEUTRAL,
    OUTCOME_RATE_LIMITED,
    OUTCOME_SUCCESS,
    BreakerBoard,
    classify_status,
)

K = ("h1", "http://h1:1", "m")
OTHER_MODEL = ("h1", "http://h1:1", "other")


def test_status_classes() -> None:
    assert classify_status(200) == OUTCOME_SUCCESS
    assert classify_status(429) == OUTCOME_RATE_LIMITED
    assert classify_status(500) == OUTCOME_FAILURE and classify_status(503) == OUTCOME_FAILURE
    assert classify_status(400) == OUTCOME_NEUTRAL and classify_status(404) == OUTCOME_NEUTRAL
    # an endpoint the engine does not serve (embeddings on a chat-only model) is the caller's
    assert classify_status(501) == OUTCOME_NEUTRAL and classify_status(502) == OUTCOME_FAILURE
    # the engine refusing Grid's own key is a broken route, not a caller mistake
    assert classify_status(401) == OUTCOME_FAILURE


def test_429_opens_for_one_second_at_once() -> None:
    b = BreakerBoard()
    b.record(K, OUTCOME_RATE_LIMITED, 100.0)
    assert b.state(K, 100.5) == OPEN and not b.allows(K, 100.5)
    assert b.allows(K, 101.0)
    assert b.acquire(K, 101.0) is True  # the half-open probe
    assert not b.allows(K, 101.1)  # one probe at a time
    b.record(K, OUTCOME_SUCCESS, 101.2)
    assert b.state(K, 101.2) == CLOSED and len(b) == 0


def test_two_consecutive_failures_open_with_capped_exponential_backoff() -> None:
    b = BreakerBoard()
    b.record(K, OUTCOME_FAILURE, 0.0)
    assert b.state(K, 0.0) == CLOSED and b.allows(K, 0.0)
    b.record(K, OUTCOME_FAILURE, 0.1)
    assert b.state(K, 0.5) == OPEN
    t = 0.1
    waits = []
    for _ in range(8):
        until = b._circuits[K].open_until
        waits.append(round(until - t, 6))
        t = until
        assert not b.allows(K, t - 0.01) and b.allows(K, t)
        assert b.acquire(K, t) is True
        assert b.state(K, t) == HALF_OPEN
        b.record(K, OUTCOME_FAILURE, t)  # the probe fails: reopen, longer
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_success_between_failures_resets_the_streak() -> None:
    b = BreakerBoard()
    b.record(K, OUTCOME_FAILURE, 0.0)
    b.record(K, OUTCOME_SUCCESS, 0.1)
    b.record(K, OUTCOME_FAILURE, 0.2)
    assert b.state(K, 0.2) == CLOSED and b.allows(K, 0.2)


def test_caller_4xx_never_counts_and_releases_a_probe() -> None:
    b = BreakerBoard()
    for t in range(10):
        b.record(K, OUTCOME_NEUTRAL, float(t))
    assert len(b) == 0
    b.record(K, OUTCOME_FAILURE, 0.0)
    b.record(K, OUTCOME_NEUTRAL, 0.05)
    b.record(K, OUTCOME_FAILURE, 0.1)  # still consecutive transport/5xx failures
    assert b.state(K, 0.2) == OPEN
    assert b.acquire(K, 1.2) is True
    b.record(K, OUTCOME_NEUTRAL, 1.3)  # the probe got a caller 4xx: the next request may probe
    assert b.allows(K, 1.3) and b.state(K, 1.3) == HALF_OPEN


def test_a_broken_model_route_does_not_hide_healthy_models_on_the_same_engine() -> None:
    b = BreakerBoard()
    b.record(K, OUTCOME_FAILURE, 0.0)
    b.record(K, OUTCOME_FAILURE, 0.0)
    assert not b.allows(K, 0.1) and b.allows(OTHER_MODEL, 0.1)
    assert b.blocked(0.1) == frozenset({K})
    assert b.retry_after([K], 0.1) >= 0.9


def test_a_lost_probe_frees_its_slot_after_the_probe_timeout() -> None:
    b = BreakerBoard()
    b.record(K, OUTCOME_RATE_LIMITED, 0.0)
    assert b.acquire(K, 1.0)
    assert not b.allows(K, 1.0 + breaker.PROBE_TIMEOUT_SECONDS - 1)
    assert b.allows(K, 1.0 + breaker.PROBE_TIMEOUT_SECONDS)
