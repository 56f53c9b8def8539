"""Flap evidence counts only what a host did itself: an operator's drain, pause, quarantine and
resume (overrides, and their release) are not lifecycle flaps, whichever of the agent's
transition event and the heartbeat showing its state reaches the log first."""

from __future__ import annotations

from grid.events.host import HostHeartbeat, HostResources, ProtectionTransition
from grid.fleet import quarantine as Q
from grid.fleet.planning import Policy
from grid.projections import lifecycle as lifecycle_proj
from grid.projections.position import Position

RES = HostResources(capacity_mb=16_000)


def hb(state: str = "accepting") -> HostHeartbeat:
    return HostHeartbeat(event_id="e", at=0.0, host_id="h1", state=state, resources=RES)  # type: ignore[arg-type]


def tr(from_state: str, to_state: str, override: bool) -> ProtectionTransition:
    return ProtectionTransition(event_id="t", at=0.0, host_id="h1", from_state=from_state,  # type: ignore[arg-type]
                                to_state=to_state, reason="override:x" if override else "cpu_high",  # type: ignore[arg-type]
                                override=override)


def fold(events):
    state = lifecycle_proj.initial()
    for seq, (at, ev) in enumerate(events, start=1):
        state = lifecycle_proj.apply(state, ev, Position("GRID_HOSTS", seq, at))
    return state


def operator_cycle(start: float, verb_state: str, heartbeat_first: bool):
    """An operator override to `verb_state` and its release, heartbeats every 10 s."""
    on, off = tr("accepting", verb_state, True), tr(verb_state, "accepting", False)
    if heartbeat_first:
        return [(start, hb(verb_state)), (start + 1, on), (start + 10, hb(verb_state)),
                (start + 20, hb()), (start + 21, off), (start + 30, hb())]
    return [(start, on), (start + 1, hb(verb_state)), (start + 10, hb(verb_state)),
            (start + 20, off), (start + 21, hb()), (start + 30, hb())]


def test_operator_drains_pauses_and_resumes_are_not_flaps():
    events = [(0.0, hb())]
    for i, verb_state in enumerate(("draining", "paused", "quarantined", "draining", "paused", "draining")):
        events += operator_cycle(40.0 * (i + 1), verb_state, heartbeat_first=bool(i % 2))
    s = fold(events)
    assert lifecycle_proj.host_transitions(s) == {}
    assert Q.quarantines(lifecycle_proj.host_transitions(s), {}, 300.0, Policy()) == ()


def test_an_override_and_its_release_between_two_heartbeats_count_nothing():
    s = fold([(0.0, hb()), (5.0, tr("accepting", "draining", True)), (6.0, tr("draining", "accepting", False)),
              (10.0, hb()), (20.0, hb("throttled")), (30.0, hb())])
    # ...and the announcement does not swallow the host's own later return to accepting.
    assert lifecycle_proj.host_transitions(s) == {"h1": (20.0, 30.0)}


def test_host_caused_changes_still_count_beside_operator_ones():
    s = fold([(0.0, hb()), (5.0, tr("accepting", "throttled", False)), (6.0, hb("throttled")),
              (10.0, tr("throttled", "draining", True)), (11.0, hb("draining")),
              (20.0, tr("draining", "throttled", False)), (21.0, hb("throttled")),
              (30.0, tr("throttled", "accepting", False)), (31.0, hb())])
    # throttled in and out by the sensors; the drain and its release are the operator's.
    assert lifecycle_proj.host_transitions(s) == {"h1": (6.0, 31.0)}


def test_a_flapping_host_is_still_quarantined():
    events = [(0.0, hb())]
    for i in range(1, 9):
        state = "throttled" if i % 2 else "accepting"
        events += [(10.0 * i, tr("accepting" if i % 2 else "throttled", state, False)), (10.0 * i + 1, hb(state))]
    s = fold(events)
    assert len(lifecycle_proj.host_transitions(s)["h1"]) == 8
    assert [q.subject for q in Q.quarantines(lifecycle_proj.host_transitions(s), {}, 90.0, Policy())] == ["h1"]


def test_an_override_claim_cannot_hide_a_change_into_a_state_no_override_makes():
    # `override` on a transition to throttled is no operator action (overrides drain, pause or
    # quarantine): the change counts.
    s = fold([(0.0, hb()), (5.0, tr("accepting", "throttled", True)), (6.0, hb("throttled"))])
    assert lifecycle_proj.host_transitions(s) == {"h1": (6.0,)}
