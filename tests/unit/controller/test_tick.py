"""The one tick composition: projection states + now + controls -> planner input, forecast, plan,
reconciler decision."""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import pytest

from grid.clock import SimulatedClock
from grid.controller.inputs import baseline_demand, ready_replicas
from grid.controller.reconcile import reconcile
from grid.controller.tick import (
    PROJECTIONS, Controls, compose_tick, encode_policy, recorded_policy, run_tick, tick_input,
)
from grid.events.log import InMemoryLog
from grid.events.plan import PlanCreated
from grid.fleet.planning import Policy, encode_plan
from grid.planner.digest import inputs_digest
from grid.planner.plan import plan
from grid.projections.runner import CORE_PROJECTIONS, ProjectionRunner
from tests.unit.replay.session import Session

POLICY = Policy(max_evictions=5, explain_host_limit=3, heartbeat_timeout_seconds=40.0)


@pytest.fixture
async def folded() -> tuple[dict[str, Any], float]:
    """Projection states after a recorded session (hosts, profiles, requests), and its last `now`."""
    clock = SimulatedClock(1_800_000_000.0)
    log = InMemoryLog(clock)
    await Session(log, clock, hosts=3, models=3).run(rounds=3)
    runner = ProjectionRunner(PROJECTIONS)
    await runner.catch_up(log)
    return runner.states, clock.now()


async def test_same_states_now_and_policy_give_the_same_plan_bytes(folded) -> None:
    states, now = folded
    a, b = compose_tick(states, now, POLICY), compose_tick(states, now, POLICY)
    assert encode_plan(a.plan) == encode_plan(b.plan)
    assert a.plan.inputs_digest == inputs_digest(a.planner_input) == inputs_digest(b.planner_input)
    assert a.planner_input.now == now and a.planner_input.policy == POLICY
    assert a.forecast_seconds == a.plan_seconds == 0.0  # no stopwatch, no clock read
    other = compose_tick(states, now, Policy())
    assert other.plan.inputs_digest != a.plan.inputs_digest


async def test_demand_is_the_forecast_and_the_plan_is_made_from_it(folded) -> None:
    states, now = folded
    tick = compose_tick(states, now, POLICY)
    assert tick.forecast is not None and tick.forecast_error is None
    assert tick.planner_input.demand == tuple(tick.forecast.targets)
    assert tick.plan.placements and tick_input(states, now, POLICY).planner_input == tick.planner_input


async def test_a_failing_forecast_plans_for_the_baseline_and_says_why(folded) -> None:
    states, now = folded
    broken = dict(states, demand=object())  # a demand state the forecast cannot read
    tick = compose_tick(broken, now, POLICY)
    assert tick.forecast is None and tick.forecast_error and "AttributeError" in tick.forecast_error
    assert tick.planner_input.demand == baseline_demand(tick.planner_input.profiles)
    # Without a demand projection at all, demand is the baseline too, and nothing is reported.
    core = {name: states[name] for name in (s.name for s in CORE_PROJECTIONS)}
    plain = compose_tick(core, now, POLICY)
    assert plain.forecast is None and plain.forecast_error is None
    assert plain.planner_input.demand == baseline_demand(plain.planner_input.profiles)


async def test_ready_replicas_count_only_hosts_with_a_fresh_heartbeat(folded) -> None:
    states, now = folded
    hosts = tick_input(states, now, POLICY).planner_input.hosts
    live = ready_replicas(hosts, now, POLICY)
    assert live and all(n > 0 for n in live.values())
    latest = max(h.heartbeat_at for h in hosts if h.heartbeat_at is not None)
    assert ready_replicas(hosts, latest + POLICY.heartbeat_timeout_seconds, POLICY) == live
    assert ready_replicas(hosts, latest + POLICY.heartbeat_timeout_seconds + 0.001, POLICY) == {}


def test_the_recorded_policy_round_trips_and_defaults_for_older_plans() -> None:
    plan = PlanCreated(event_id="p", at=0.0, planner_version="v", generation="g", epoch="e", sequence=1,
                       inputs_digest="d", based_on={}, now=0.0)
    assert recorded_policy(plan) == Policy()  # recorded before PlanCreated carried a policy
    assert recorded_policy(msgspec.structs.replace(plan, policy=encode_policy(POLICY))) == POLICY


async def test_one_tick_reconciles_the_plan_it_made_from_the_same_observation(folded) -> None:
    states, now = folded
    controls = Controls(policy=POLICY, mode="automatic")
    tick = run_tick(states, now, controls)
    assert tick.planned == compose_tick(states, now, POLICY)
    # The reconciler is shown exactly what the planner was (hosts, profiles, retired models).
    assert tick.result == reconcile(tick.plan, tick.planner_input, states["actions"], now, mode="automatic")
    assert msgspec.json.encode(run_tick(states, now, controls)) == msgspec.json.encode(tick)


async def test_the_reconciler_decides_from_the_plan_basis_never_from_explanations(folded) -> None:
    states, now = folded
    tick = run_tick(states, now, Controls(policy=POLICY, mode="automatic"))
    assert {b.model_id for b in tick.plan.basis} == {e.model_id for e in tick.plan.explanations}
    bare = msgspec.structs.replace(tick.plan, explanations=())
    assert reconcile(bare, tick.planner_input, states["actions"], now, mode="automatic") == tick.result


async def test_the_collector_is_paused_for_the_whole_tick_and_restored_as_it_was(folded) -> None:
    states, now = folded
    controls = Controls(policy=POLICY, mode="automatic")
    seen: list[tuple[str, bool]] = []

    def prepare(obs, at, policy):  # type: ignore[no-untyped-def]
        seen.append(("prepare", gc.isenabled()))
        return tick_input(obs, at, policy)

    def planner(inp):  # type: ignore[no-untyped-def]
        seen.append(("plan", gc.isenabled()))
        return plan(inp)

    assert gc.isenabled()
    tick = run_tick(states, now, controls, prepare=prepare, planner=planner)
    assert seen == [("prepare", False), ("plan", False)] and gc.isenabled()
    assert msgspec.json.encode(tick) == msgspec.json.encode(run_tick(states, now, controls))
    gc.disable()  # a caller that turned it off keeps it off
    try:
        run_tick(states, now, controls)
        assert not gc.isenabled()
    finally:
        gc.enable()
