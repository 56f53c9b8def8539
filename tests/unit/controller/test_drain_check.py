"""What a drain costs (grid.controller.drain_check): the models whose last ready copy is on the host
and that a plan with the host draining replaces nowhere, with the reason and what the deadline does."""

from __future__ import annotations

from grid.controller import drain_check as dc
from grid.fleet.planning import PlannerInput, Policy
from grid.planner.plan import build_plan
from tests.unit.controller.ctlkit import NOW, host, profile, res

SHA = "c" * 64


def _pin(*hosts, models=("m",)) -> PlannerInput:  # type: ignore[no-untyped-def]
    profiles = tuple(profile(m, memory_mb=3000, min_replicas=1, max_replicas=1) for m in models)
    return PlannerInput(now=NOW, profiles=profiles, hosts=tuple(hosts), demand=(), policy=Policy())


def test_the_only_copy_with_no_room_elsewhere_is_a_risk_kept_past_the_deadline():
    pin = _pin(host("h1", res("m", memory=3000)), host("h2", capacity=2000))
    check = dc.check_drain(pin, "h1", 60.0, build_plan)
    assert check.known and [(r.model_id, r.reason, r.at_deadline) for r in check.risks] == [
        ("m", "no_eligible_host", dc.AT_DEADLINE_KEPT)]
    assert check.risks[0].detail.startswith("h2: insufficient_memory")
    (text,) = check.warnings
    assert "m has its last ready copy there" in text and "60 s evacuation deadline will not unload it" in text
    assert "gridctl host resume h1" in text


def test_no_risk_when_a_replacement_fits_or_another_copy_serves():
    # h2 has room: the what-if plan places the replacement there.
    assert dc.check_drain(_pin(host("h1", res("m", memory=3000)), host("h2")), "h1", 60.0, build_plan).risks == ()
    # h2 already serves m: h1's copy is not the last one.
    pin = _pin(host("h1", res("m", memory=3000)), host("h2", res("m", memory=3000), capacity=3000))
    assert dc.last_copies(pin, "h1") == ()
    # An external (unmanaged) engine on the drained host is never drained: no risk from it.
    pin = _pin(host("h1", res("m", memory=3000, managed=False)), host("h2", capacity=2000))
    assert dc.check_drain(pin, "h1", 60.0, build_plan).risks == ()


def test_a_copy_elsewhere_on_a_stale_or_fenced_host_does_not_count():
    stale = host("h2", res("m", memory=3000), hb_at=NOW - 600.0)
    paused = host("h3", res("m", memory=3000), state="paused")
    assert dc.last_copies(_pin(host("h1", res("m", memory=3000)), stale, paused), "h1") == ("m",)


def test_an_unknown_host_or_no_plan_yet_says_so():
    assert (dc.check_drain(None, "h1", 60.0, build_plan).known, dc.check_drain(None, "h1", 60.0, build_plan).reason) \
        == (False, dc.NO_PLAN_YET)
    unknown = dc.check_drain(_pin(host("h1")), "nope", 60.0, build_plan)
    assert (unknown.known, unknown.reason) == (False, dc.UNKNOWN_HOST)


def test_same_input_same_answer():
    pin = _pin(host("h1", res("m", memory=3000), res("n", memory=3000)), host("h2", capacity=2000), models=("m", "n"))
    a = dc.check_drain(pin, "h1", 60.0, build_plan)
    assert a == dc.check_drain(pin, "h1", 60.0, build_plan)
    assert [r.model_id for r in a.risks] == ["m", "n"]
