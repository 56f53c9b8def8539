"""`gridctl test watch` turns heartbeats into residency transitions (changes only) and acks into
command outcomes (grid.testfleet.watch.lines_for, pure)."""

from __future__ import annotations

from grid.events.acks import ActionAck
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.testfleet.watch import lines_for


def _hb(host: str, *states: tuple[str, str]) -> HostHeartbeat:
    return HostHeartbeat(event_id=f"hb-{host}-{len(states)}", at=1.0, host_id=host, resources=HostResources(capacity_mb=1024),
                         residencies=tuple(Residency(model_id=m, memory_mb=100, state=s) for m, s in states))  # type: ignore[arg-type]


def test_only_changes_become_lines_and_a_vanished_residency_is_absent() -> None:
    states, lines = lines_for({}, _hb("h1", ("m", "loading")), 1.0)
    assert [l.text for l in lines] == ["h1 m: absent -> loading"]
    states, lines = lines_for(states, _hb("h1", ("m", "loading")), 2.0)
    assert lines == []  # the same table again: nothing to show
    states, lines = lines_for(states, _hb("h2", ("m", "ready")), 2.5)
    states, lines = lines_for(states, _hb("h1", ("m", "ready")), 3.0)
    assert [l.text for l in lines] == ["h1 m: loading -> ready"]
    states, lines = lines_for(states, _hb("h1"), 4.0)
    assert [l.text for l in lines] == ["h1 m: ready -> absent"]
    assert states == {("h2", "m"): "ready"}  # the other host is untouched


def test_an_ack_is_an_outcome_line() -> None:
    ack = ActionAck(event_id="a", at=5.0, host_id="h3", action_id="x", status="failed", message="insufficient_free_memory",
                    duration_seconds=0.25, kind="load", model_id="m")
    _, lines = lines_for({}, ack, 5.0)
    assert [(l.kind, l.text) for l in lines] == [("outcome", "h3 load m failed in 0.2s: insufficient_free_memory")]
