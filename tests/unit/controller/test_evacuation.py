"""An operator drain is a make-before-break evacuation (issue 25 item 4).

Planner and reconciler together, tick by tick, on real values: a single-copy model on a host the
operator drains gets a replacement elsewhere; the draining host's ready replica stays routable
(after every admitting host) and is drained only once the replacement is ready, or once the
evacuation deadline has passed, unless it is the model's last ready copy (safety invariant 5: it
stays until its replacement is ready). Paused hosts still stop traffic at once.
"""

from __future__ import annotations

import msgspec

from grid.controller import reconcile as rc
from grid.controller.governor import Limits
from grid.controller.reconcile import Guards
from grid.controller.tick import Controls, TickInput, decide, plan_prepared
from grid.fleet.planning import PlannerInput, Policy
from grid.fleet.reasons import RETAINED_UNTIL_REPLACED
from grid.fleet.views import HostView
from grid.gateway import routing

from tests.unit.controller.ctlkit import NOW, History, host, kinds, profile, profiles, reasons, res

M = profiles(profile("m", min_replicas=1, max_replicas=1, min_residency_seconds=300))
DRAIN_AT = NOW - 10.0


def _input(hosts: list[HostView], now: float = NOW) -> PlannerInput:
    return PlannerInput(now=now, profiles=tuple(M.values()), hosts=tuple(hosts), demand=(), policy=Policy())


def _routed(hosts: list[HostView], now: float = NOW) -> str | None:
    hosts = [msgspec.structs.replace(h, residencies=tuple(
        msgspec.structs.replace(r, endpoint=f"http://{h.host_id}:1") for r in h.residencies)) for h in hosts]
    table = routing.build_table(hosts)
    d = routing.choose(list(table.get("m", ())), now=now)
    return None if d.route is None else d.route.host_id


def _tick(hosts: list[HostView], history: History | None = None, now: float = NOW,
          since: float | None = DRAIN_AT, limits: Limits = Limits()):  # type: ignore[no-untyped-def]
    guards = Guards(evacuating_since={} if since is None else {
        h.host_id: since for h in hosts if h.state == "draining"})
    planned = plan_prepared(TickInput(planner_input=_input(hosts, now)))
    tick = decide(planned, (history or History()).state, now, Controls(limits=limits, guards=guards))
    return tick.plan, tick.result


def test_a_drained_single_copy_keeps_serving_until_its_replacement_is_ready() -> None:
    # h1 serves the only replica (loaded 60 s ago: minimum residency would also hold it); the
    # operator drains h1.
    old = res("m", loaded_age=60)
    hosts = [host("h1", old, state="draining"), host("h2")]
    p, r = _tick(hosts)
    # The planner places the replacement on h2 and retains the draining copy meanwhile.
    assert [(x.host_id, x.status) for x in p.placements] == [("h1", "existing"), ("h2", "new")]
    assert p.placements[0].reason == RETAINED_UNTIL_REPLACED
    # The reconciler loads the replacement and keeps the old copy: nothing destructive.
    assert kinds(r) == [("load", "h2", "m")]
    assert ("drain", "h1", "m") not in reasons(r)
    # Meanwhile the gateway still routes to the draining host's ready replica.
    assert _routed(hosts) == "h1"

    # The replacement is warming: still no drain, still served by h1.
    hosts = [host("h1", old, state="draining"), host("h2", res("m", "warming"))]
    p, r = _tick(hosts)
    assert [x.host_id for x in p.placements] == ["h1", "h2"]
    assert not [a for a in r.actions if a.destructive]
    assert _routed(hosts) == "h1"

    # The replacement is ready: the plan lets the old copy go and the gateway prefers the new one
    # (admitting before evacuating hosts). A copy inside its minimum residency still waits for
    # that (or the deadline); a settled one drains now.
    hosts = [host("h1", old, state="draining"), host("h2", res("m", loaded_age=1))]
    p, r = _tick(hosts)
    assert [(x.host_id, x.status) for x in p.placements] == [("h2", "existing")]
    assert reasons(r)[("drain", "h1", "m")] == rc.MIN_RESIDENCY
    assert _routed(hosts) == "h2"
    settled = res("m", loaded_age=1000)
    hosts = [host("h1", settled, state="draining"), host("h2", res("m", loaded_age=1))]
    _, r = _tick(hosts)
    assert kinds(r) == [("drain", "h1", "m")] and r.actions[0].reason == rc.DRAIN_OBSOLETE
    assert _routed(hosts) == "h2"

    # Once drained, its residency is out of routing and unloaded when idle.
    hosts = [host("h1", res("m", "draining"), state="draining"), host("h2", res("m", loaded_age=1))]
    _, r = _tick(hosts)
    assert kinds(r) == [("unload", "h1", "m")]


def test_the_deadline_never_takes_the_last_ready_copy() -> None:
    # No other host can take the model: the draining host's copy is the last one. Safety
    # invariant 5 (protect the last required replica) outlasts the evacuation deadline: the copy
    # stays, serving, until a replacement is ready (the drain warned of it: drain_check).
    hosts = [host("h1", res("m", loaded_age=60), state="draining")]
    p, r = _tick(hosts)
    assert [(x.host_id, x.reason) for x in p.placements] == [("h1", RETAINED_UNTIL_REPLACED)]
    assert r.actions == () and ("drain", "h1", "m") not in reasons(r)
    assert _routed(hosts) == "h1"

    def later(t: float) -> list[HostView]:
        return [host("h1", res("m", loaded_age=60), state="draining", hb_at=t - 1.0)]

    for t in (DRAIN_AT + 59.0, DRAIN_AT + 60.0, DRAIN_AT + 3600.0):
        _, r = _tick(later(t), now=t)
        assert r.actions == (), t
        assert _routed(later(t), now=t) == "h1"
    # A shorter deadline changes nothing for the last copy either.
    _, r = _tick(later(DRAIN_AT + 5.0), now=DRAIN_AT + 5.0, limits=Limits(evacuation_deadline_seconds=5.0))
    assert r.actions == ()
    # A drain of it that was already delivered is withdrawn as unsafe, deadline or not.
    h = History().issue(rc.Action(action_id="d1", kind="drain", host_id="h1", model_id="m", memory_mb=1000,
                                  reason=rc.DRAIN_OBSOLETE, destructive=True), at=DRAIN_AT + 60.0)
    _, r2 = _tick(later(DRAIN_AT + 62.0), h, now=DRAIN_AT + 62.0)
    assert [w.action_id for w in r2.withdrawals] == ["d1"]


def test_the_deadline_ends_the_evacuation_of_a_copy_served_elsewhere_too() -> None:
    # m wants two replicas; h2 serves one, h1 (draining) the other; nothing can take h1's.
    two = profiles(profile("m", min_replicas=2, max_replicas=2, min_residency_seconds=300))

    def fleet(t: float) -> list[HostView]:
        return [host("h1", res("m", loaded_age=60), state="draining", hb_at=t - 1.0),
                host("h2", res("m", loaded_age=60), hb_at=t - 1.0)]

    def tick(t: float, history: History | None = None, **kw):  # type: ignore[no-untyped-def]
        guards = Guards(evacuating_since={"h1": DRAIN_AT})
        pin = PlannerInput(now=t, profiles=tuple(two.values()), hosts=tuple(fleet(t)), demand=(), policy=Policy())
        planned = plan_prepared(TickInput(planner_input=pin))
        return decide(planned, (history or History()).state, t, Controls(limits=Limits(**kw), guards=guards)).result

    # Before the deadline the copy waits for a replacement that cannot come...
    assert tick(DRAIN_AT + 59.0).actions == ()
    # ...at the deadline it drains: h2 still serves the model, the shortfall stays visible.
    r = tick(DRAIN_AT + 60.0)
    assert kinds(r) == [("drain", "h1", "m")]
    # A delivered drain past the deadline is not withdrawn as unsafe; before it, it would be.
    h = History().issue(r.actions[0], at=DRAIN_AT + 60.0)
    assert tick(DRAIN_AT + 62.0, h).withdrawals == ()
    assert tick(DRAIN_AT + 30.0, h).withdrawals != ()
    # An unknown start keeps make-before-break.
    guards = Guards()
    pin = PlannerInput(now=DRAIN_AT + 600.0, profiles=tuple(two.values()), hosts=tuple(fleet(DRAIN_AT + 600.0)),
                       demand=(), policy=Policy())
    result = decide(plan_prepared(TickInput(planner_input=pin)), History().state, DRAIN_AT + 600.0,
                    Controls(guards=guards)).result
    assert result.actions == ()


def test_pause_quarantine_and_unhealthy_stop_traffic_at_once() -> None:
    for state in ("paused", "quarantined", "unhealthy"):
        hosts = [host("h1", res("m"), state=state), host("h2")]
        assert _routed(hosts) is None, state
        # ...and its replica is not drained before the replacement is ready either.
        _, r = _tick(hosts)
        assert not [a for a in r.actions if a.destructive]
    # A draining residency never takes new requests, whatever its host's state.
    assert _routed([host("h1", res("m", "draining"), state="draining")]) is None


def test_a_silent_draining_host_is_not_retained() -> None:
    hosts = [host("h1", res("m"), state="draining", hb_at=NOW - 45.0), host("h2")]
    p, _ = _tick(hosts)
    assert [(x.host_id, x.status) for x in p.placements] == [("h2", "new")]
