"""The dashboard view is a pure function of folded events and `now`."""

from __future__ import annotations

import time

import msgspec

from grid.clock import SimulatedClock
from grid.controller import inputs as inputs_mod
from grid.dashboard.view import RECENT_ACTIONS, build_view, encode_view
from grid.events.acks import ActionAck
from grid.events.commands import CommandIssued
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.events.log import InMemoryLog
from grid.events.plan import PlanCreated, make_generation
from grid.fleet.planning import encode_plan
from grid.planner.plan import PLANNER_VERSION, plan
from grid.projections.runner import ProjectionRunner

from tests.golden.examples import EXAMPLES
from tests import heartbeats

T0 = 1_800_000_000.0


async def _runner(events) -> ProjectionRunner:
    log = InMemoryLog(SimulatedClock(T0))
    for e in events:
        await log.append(e)
    runner = ProjectionRunner()
    await runner.catch_up(log)
    return runner


def _hb(host: str, *residencies: Residency, state: str = "accepting") -> HostHeartbeat:
    return heartbeats.heartbeat(host, *residencies, event_id=f"hb-{host}-{len(residencies)}", at=T0, state=state,
                                resources=HostResources(capacity_mb=8000, reserved_mb=1000, failure_domain="rack-a"))


def _cmd(i: int, kind: str, host: str, model: str) -> CommandIssued:
    return CommandIssued(event_id=f"c{i}", at=T0, action_id=f"a{i}", kind=kind, host_id=host, model_id=model,  # type: ignore[arg-type]
                         memory_mb=500, generation="e:1:d", controller_term=1, controller_id="c1",
                         lease_expires_at=T0 + 15, lease_ttl_seconds=15.0, reason="missing_replica")


async def test_hosts_models_plan_and_commands_appear() -> None:
    profile = ModelProfile(model_id="m1", memory_mb=500, min_replicas=2, max_replicas=3, priority=5)
    hb = _hb("h1", Residency(model_id="m1", memory_mb=500, state="ready", active_requests=2))
    events = [hb, ProfileSet(event_id="p1", at=T0, profile=profile), _cmd(1, "load", "h1", "m1"),
              ActionAck(event_id="k1", at=T0, host_id="h1", action_id="a1", status="succeeded", kind="load", model_id="m1",
                        generation="e:1:d", controller_term=1, duration_seconds=2.5)]
    runner = await _runner(events)
    pin = inputs_mod.build_planner_input(runner.states, T0 + 1)
    p = plan(pin)
    events.append(PlanCreated(event_id="pl1", at=T0, planner_version=PLANNER_VERSION, generation=make_generation("e", 1, p.inputs_digest),
                              epoch="e", sequence=1, inputs_digest=p.inputs_digest, based_on={}, now=T0 + 1,
                              controller_id="c1", controller_term=3, plan=msgspec.Raw(encode_plan(p))))
    runner = await _runner(events)
    view = build_view(runner.states, T0 + 10, positions=runner.positions)

    (host,) = view.hosts
    assert host.host_id == "h1" and host.state == "accepting" and host.fresh and host.failure_domain == "rack-a"
    assert host.resident_mb == 500 and host.capacity_mb == 8000
    assert [(r.model_id, r.state, r.active_requests) for r in host.residencies] == [("m1", "ready", 2)]
    (model,) = view.models
    assert (model.model_id, model.priority, model.min_replicas, model.ready) == ("m1", 5, 2, 1)
    assert model.wanted == 2 and model.placed == 1 and model.shortfall_reason  # one host cannot hold two replicas
    assert view.plan is not None and view.plan.controller_term == 3
    assert any("m1" in s for s in view.plan.shortfalls) and any("m1" in line for line in view.plan.explanation)
    (action,) = view.actions
    assert (action.kind, action.status, action.duration_seconds) == ("load", "succeeded", 2.5)
    (tl,) = view.timelines
    assert (tl.host_id, tl.model_id, [s.kind for s in tl.steps]) == ("h1", "m1", ["load"])


async def test_stale_host_and_unreadable_plan_are_shown_not_fatal() -> None:
    runner = await _runner(EXAMPLES)  # the golden plan's payload is not a full Plan
    view = build_view(runner.states, T0 + 3600)
    (host,) = view.hosts
    assert not host.fresh and host.heartbeat_age_seconds is not None and host.heartbeat_age_seconds > 3000
    assert view.plan is not None and "not readable" in view.plan.explanation[0]
    assert view.mode == "automatic"


async def test_same_input_same_bytes_and_bounded_actions() -> None:
    events = [_hb("h1")] + [_cmd(i, "load", "h1", f"m{i % 3}") for i in range(RECENT_ACTIONS + 25)]
    a = await _runner(events)
    b = await _runner(events)
    va, vb = build_view(a.states, T0 + 5), build_view(b.states, T0 + 5)
    assert encode_view(va) == encode_view(vb)
    assert len(va.actions) == RECENT_ACTIONS
    assert va.actions[0].action_id == f"a{RECENT_ACTIONS + 24}"  # newest first
    assert sum(len(t.steps) for t in va.timelines) <= 3 * 12


def test_view_reads_no_clock(monkeypatch) -> None:
    def boom() -> float:
        raise AssertionError("the view must take now explicitly")
    monkeypatch.setattr(time, "time", boom)
    from grid.projections import actions, catalog, fleet, plans
    view = build_view({"fleet": fleet.initial(), "catalog": catalog.initial(), "actions": actions.initial(),
                       "plans": plans.initial()}, T0)
    assert view.hosts == () and view.plan is None
