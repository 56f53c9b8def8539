"""The actions fold keeps the last failed load per (host, model) until a later load succeeds."""

from __future__ import annotations

import msgspec

from grid.events.acks import ActionAck
from grid.events.codec import encode_value
from grid.events.commands import CommandIssued
from grid.projections import actions
from grid.projections.position import Position


def cmd(action_id: str, kind: str = "load", host: str = "h", model: str = "m") -> CommandIssued:
    return CommandIssued(
        event_id=action_id, at=0, action_id=action_id, kind=kind, host_id=host, model_id=model, memory_mb=100,
        generation="e:1:d", controller_term=1, controller_id="c", lease_expires_at=0, lease_ttl_seconds=15,
        artifact_sha256="ab" * 32,
    )


def ack(action_id: str, status: str, message: str = "", host: str = "h") -> ActionAck:
    return ActionAck(event_id=f"{action_id}-{status}", at=0, host_id=host, action_id=action_id, status=status,
                     message=message, duration_seconds=1.0)


def fold(*events: object) -> actions.ActionsState:
    s = actions.initial()
    for i, ev in enumerate(events, 1):
        s = actions.apply(s, ev, Position("S", i, 1000.0 + i))  # type: ignore[arg-type]
    return s


def test_a_failed_load_is_kept_with_its_reason_until_a_later_success() -> None:
    s = fold(cmd("l1"), ack("l1", "failed", "artifact_not_cached: abababababab... not in the store"),
             cmd("w1", kind="warm"), ack("w1", "failed", "insufficient_memory: 10 < 100"),
             cmd("l2", host="h2"), ack("l2", "failed", "digest_mismatch", host="h2"))
    failures = s.load_failures
    assert sorted(f.host_id for f in failures.values()) == ["h", "h2"]  # a failed warm is not a load failure
    f = failures[actions.failure_key("h", "m")]
    assert (f.reason, f.detail, f.action_id, f.at) == ("artifact_not_cached", "abababababab... not in the store",
                                                       "l1", 1002.0)
    assert failures[actions.failure_key("h2", "m")].reason == "digest_mismatch"

    # A newer failure replaces the older; a success clears only its own (host, model).
    s = actions.apply(s, cmd("l3"), Position("S", 10, 2000.0))
    s = actions.apply(s, ack("l3", "failed", "artifact_store_unavailable: interrupted"), Position("S", 11, 2001.0))
    assert s.load_failures[actions.failure_key("h", "m")].reason == "artifact_store_unavailable"
    s = actions.apply(s, cmd("l4"), Position("S", 12, 2002.0))
    s = actions.apply(s, ack("l4", "succeeded", "fetched"), Position("S", 13, 2003.0))
    assert list(s.load_failures) == [actions.failure_key("h2", "m")]
    # Folding is unaffected by later, unrelated actions, and the state round-trips (snapshots).
    s = actions.apply(s, cmd("w2", kind="warm"), Position("S", 14, 2004.0))
    s = actions.apply(s, ack("w2", "succeeded"), Position("S", 15, 2005.0))
    assert list(s.load_failures) == [actions.failure_key("h2", "m")]
    encoded = encode_value(s)  # the project's encoder (snapshots): it writes a SharedMap as its dict
    assert msgspec.json.decode(encoded, type=actions.ActionsState) == s
