"""The one heartbeat-freshness rule: stale after the timeout, ahead beyond the clock skew."""

from __future__ import annotations

from grid.controller.governor import Limits
from grid.fleet import (
    FUTURE_SKEW_SECONDS,
    HEARTBEAT_TIMEOUT_SECONDS,
    HeartbeatWindow,
    heartbeat_ahead,
    heartbeat_fresh,
    heartbeat_live,
)
from grid.fleet.planning import Policy
from grid.gateway.routing import RoutingPolicy

NOW = 1_000.0
WINDOW = HeartbeatWindow()


def test_a_missing_heartbeat_is_neither_fresh_nor_live() -> None:
    assert not heartbeat_fresh(None, NOW, WINDOW)
    assert not heartbeat_live(None, NOW, WINDOW)


def test_stale_exactly_after_the_timeout() -> None:
    assert heartbeat_fresh(NOW - HEARTBEAT_TIMEOUT_SECONDS, NOW, WINDOW)
    assert not heartbeat_fresh(NOW - HEARTBEAT_TIMEOUT_SECONDS - 0.001, NOW, WINDOW)


def test_ahead_only_beyond_the_skew() -> None:
    assert not heartbeat_ahead(NOW + FUTURE_SKEW_SECONDS, NOW, WINDOW)
    assert heartbeat_ahead(NOW + FUTURE_SKEW_SECONDS + 0.001, NOW, WINDOW)
    # A heartbeat from the future is fresh (the skew check names it apart) but not live.
    assert heartbeat_fresh(NOW + 60.0, NOW, WINDOW)
    assert not heartbeat_live(NOW + 60.0, NOW, WINDOW)
    assert heartbeat_live(NOW + FUTURE_SKEW_SECONDS, NOW, WINDOW)


def test_planner_reconciler_and_router_share_the_defaults() -> None:
    for policy in (Policy(), Limits(), RoutingPolicy()):
        assert policy.heartbeat_timeout_seconds == HEARTBEAT_TIMEOUT_SECONDS
        assert policy.future_skew_seconds == FUTURE_SKEW_SECONDS


def test_a_shorter_timeout_is_honoured() -> None:
    short = HeartbeatWindow(heartbeat_timeout_seconds=5.0)
    assert not heartbeat_live(NOW - 6.0, NOW, short)
    assert heartbeat_live(NOW - 6.0, NOW, WINDOW)
