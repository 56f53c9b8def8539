"""The dashboard forecasts under the policy the controller recorded with its latest plan."""

from __future__ import annotations

from grid.clock import SimulatedClock
from grid.controller.tick import PROJECTIONS, encode_policy
from grid.dashboard.serve import controller_forecast, plan_policy
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import Residency
from grid.events.log import InMemoryLog
from grid.events.plan import PlanCreated, make_generation
from grid.fleet.planning import Policy
from grid.projections.runner import ProjectionRunner
from tests import heartbeats
from tests.placement import route_admitted

T0 = 1_800_000_000.0
# Longer than the default heartbeat timeout (30 s), shorter than the recorded one.
NOW = T0 + 100.0
RECORDED = Policy(heartbeat_timeout_seconds=600.0)


async def _states(*, recorded: Policy | None) -> dict:
    log = InMemoryLog(SimulatedClock(T0))
    await log.append(ProfileSet(event_id="p1", at=T0, profile=ModelProfile(model_id="m1", memory_mb=500, min_replicas=1)))
    # An unmanaged residency (an engine the host runs itself) the operator admitted counts as supply
    # without a warm ack.
    await log.append(route_admitted("h1", "m1", kind="llama.cpp", endpoint="http://127.0.0.1:8080", at=T0))
    await log.append(heartbeats.heartbeat("h1", Residency(model_id="m1", memory_mb=500, state="ready", managed=False,
                                                          endpoint="http://127.0.0.1:8080"),
                                          event_id="hb1", at=T0, capacity_mb=8000))
    if recorded is not None:
        await log.append(PlanCreated(event_id="pl1", at=T0, planner_version="v", generation=make_generation("e", 1, "d"),
                                     epoch="e", sequence=1, inputs_digest="d", based_on={}, now=T0,
                                     policy=encode_policy(recorded)))
    runner = ProjectionRunner(PROJECTIONS)
    await runner.catch_up(log)
    return runner.states


def _ready(fc) -> int:  # type: ignore[no-untyped-def]
    (m1,) = [m for m in fc.models if m.model_id == "m1"]
    return m1.ready


async def test_forecast_uses_the_recorded_policy() -> None:
    states = await _states(recorded=RECORDED)
    assert plan_policy(states) == RECORDED
    # Under the recorded 600 s timeout the host's ready replica still counts; under the default it is stale.
    assert _ready(controller_forecast()(states, NOW)) == 1
    assert _ready(controller_forecast(Policy())(states, NOW)) == 0


async def test_before_any_plan_the_default_policy() -> None:
    states = await _states(recorded=None)
    assert plan_policy(states) == Policy()
    assert _ready(controller_forecast()(states, NOW)) == 0
