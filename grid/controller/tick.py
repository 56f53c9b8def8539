"""The one tick composition: observe -> forecast -> plan -> reconcile (pure).

``run_tick`` takes the projection states (typed by ``grid.controller.inputs.observe``), an
explicit ``now`` and the caller's ``Controls`` and returns the plan and the reconciler's
decision; ``grid.controller.issue`` turns the decision into commands. The controller service
and the lab (grid.sim.run) call it; the stateful reconciler test runs its plan and reconcile
steps (``plan_prepared``, ``decide``) on inputs it builds itself. Replay and the planning
benches run the part up to the plan (``compose_tick`` / ``tick_input``), so a recorded plan's
input is rebuilt by exactly the code that built it and replay reproduces it byte for byte.
The side effects (recording, publishing) stay in ``grid.controller.service``. With two or more
active workloads the forecast's workload -> model map comes from the joint portfolio search
(``grid.demand.portfolio``), whose counterfactuals are planned by the production planner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from grid.controller.governor import Limits
from grid.controller.inputs import Observation, baseline_demand, build_planner_input, observe, ready_replicas
from grid.controller.reconcile import Guards, ReconcileResult, reconcile
from grid.demand import fold as demand_fold
from grid.demand import portfolio as portfolio_mod
from grid.demand.forecast import Forecast, forecast
from grid.events.base import Event
from grid.events.codec import encode_value
from grid.events.plan import PlanCreated
from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM, REQUESTS_STREAM
from grid.fleet import heartbeat_fresh
from grid.fleet.planning import Plan, PlannerInput, Policy
from grid.fleet.views import HostView
from grid.gcpause import collector_paused
from grid.planner import plan as planner_plan
from grid.planner.fleet_scan import placeable_models
from grid.projections import catalog as catalog_proj
from grid.projections import lifecycle as lifecycle_proj
from grid.projections import throughput as throughput_proj
from grid.projections.actions import ActionsState
from grid.projections.position import Position
from grid.projections.runner import CORE_PROJECTIONS, PLACED_CONTROL, ProjectionSpec

PlanFn = Callable[[PlannerInput], Plan]
# Reads a monotonic clock in seconds (time.perf_counter); only durations are taken from it.
Stopwatch = Callable[[], float]


def _fold_demand(state: Any, event: Event, position: Position, states: dict[str, Any]) -> Any:
    # Demand only counts models the catalog configures, as of the same position in the log.
    return demand_fold.apply(state, event, position.time, catalog_proj.configured_models(states["catalog"]))


def _fold_throughput(state: Any, event: Event, position: Position, states: dict[str, Any]) -> Any:
    # Like demand: only configured models keep measurements (bounded state).
    return throughput_proj.apply(state, event, position, catalog_proj.configured_models(states["catalog"]))


# Demand also reads the control stream for the owner's quality evaluations. Demand and
# throughput fold in place (a copy per request would cost more than the fold): a held tick
# input copies them.
DEMAND = ProjectionSpec("demand", (REQUESTS_STREAM, CONTROL_STREAM), demand_fold.DemandState, demand_fold.initial,
                        _fold_demand, in_place=True)
THROUGHPUT = ProjectionSpec("throughput", (REQUESTS_STREAM,), throughput_proj.ThroughputState,
                            throughput_proj.initial, _fold_throughput, in_place=True)
# When hosts' and models' lifecycles changed: the evidence flap quarantine decides from.
LIFECYCLE = ProjectionSpec("lifecycle", (HOSTS_STREAM,), lifecycle_proj.LifecycleState, lifecycle_proj.initial,
                           lambda s, e, p, _states: lifecycle_proj.apply(s, e, p))
# The projections a tick reads: the core ones plus request demand (for the forecast) and the
# measured per-engine throughput (for placement).
# PLACED_CONTROL: which replicas the controller commanded and its hosts confirmed (a claim
# nobody commanded is not supply; a plan lists the corroborated ones for the gateway).
PROJECTIONS: tuple[ProjectionSpec, ...] = CORE_PROJECTIONS + (DEMAND, THROUGHPUT, PLACED_CONTROL, LIFECYCLE)


class TickInput(msgspec.Struct, frozen=True, kw_only=True):
    """What the planner runs on, and the forecast its demand came from."""

    planner_input: PlannerInput
    # None: demand is the baseline (min_replicas), because there is no demand projection or
    # the forecast failed (then `forecast_error` says why).
    forecast: Forecast | None = None
    forecast_error: str | None = None


class Planned(msgspec.Struct, frozen=True, kw_only=True):
    """A tick up to its plan: what replay re-runs and the planning benches time."""

    planner_input: PlannerInput
    forecast: Forecast | None
    plan: Plan
    forecast_error: str | None = None
    # Durations measured with the caller's stopwatch (0.0 without one); they never feed a decision.
    forecast_seconds: float = 0.0
    plan_seconds: float = 0.0


class Controls(msgspec.Struct, frozen=True, kw_only=True):
    """What the tick's caller decides rather than the log: the planner policy, the effective
    mode, the mutation limits and the service-held guards."""

    policy: Policy = Policy()
    mode: str = "recommend"
    limits: Limits = Limits()
    guards: Guards = Guards()


class Tick(msgspec.Struct, frozen=True, kw_only=True):
    """One whole tick: the plan and the reconciler's decision on it. Publishing the decision
    (`grid.controller.issue`) is the caller's side effect."""

    planned: Planned
    result: ReconcileResult
    reconcile_seconds: float = 0.0

    @property
    def planner_input(self) -> PlannerInput:
        return self.planned.planner_input

    @property
    def plan(self) -> Plan:
        return self.planned.plan


# Builds the planner input (and forecast) from the observation: the production forecast by
# default; the lab's comparison controls substitute their own.
Prepare = Callable[[Observation, float, Policy], TickInput]


def ready_since(hosts: Sequence[HostView], now: float, policy: Policy) -> dict[str, tuple[float | None, ...]]:
    """When each ready replica (fresh heartbeat, as ``ready_replicas`` counts) became ready, per
    model, sorted (None: unknown). The forecast judges capacity pressure against the replicas
    that were serving when it was measured."""
    out: dict[str, list[float | None]] = {}
    for h in hosts:
        if not heartbeat_fresh(h.heartbeat_at, now, policy):
            continue
        for r in h.residencies:
            if r.state == "ready":
                out.setdefault(r.model_id, []).append(r.loaded_at)
    return {m: tuple(sorted(ts, key=lambda t: (t is not None, t or 0.0))) for m, ts in sorted(out.items())}


def tick_input(states: Mapping[str, Any] | Observation, now: float, policy: Policy) -> TickInput:
    """The planner input a tick at `now` plans from: the fleet and catalog, demand from the forecast."""
    obs = observe(states)
    base = build_planner_input(obs, now, demand=(), policy=policy)
    if obs.demand is None:
        return TickInput(planner_input=msgspec.structs.replace(base, demand=baseline_demand(base.profiles)))
    demand_state = obs.demand
    try:
        ready = ready_replicas(base.hosts, now, policy)
        serving_since = ready_since(base.hosts, now, policy)
        placeable = placeable_models(base.profiles, base.hosts)

        def counterfactual(portfolio: Mapping[str, str] | None = None) -> Forecast:
            return forecast(
                demand_state, base.profiles, now, ready_replicas=ready, ready_since=serving_since,
                timings=base.timings, retired=frozenset(base.retired), placeable=placeable, portfolio=portfolio,
            )

        fc = counterfactual()
        # Two or more active workloads: the joint portfolio search, evaluated by the planner.
        _, fc = portfolio_mod.search(fc, base, counterfactual, planner_plan.plan, ready=ready)
    except Exception as exc:  # the forecast must never stop a tick: plan for the baseline instead
        return TickInput(
            planner_input=msgspec.structs.replace(base, demand=baseline_demand(base.profiles)),
            forecast_error=f"{type(exc).__name__}: {exc}",
        )
    return TickInput(planner_input=msgspec.structs.replace(base, demand=tuple(fc.targets)), forecast=fc)


def _clock(stopwatch: Stopwatch | None) -> float:
    return stopwatch() if stopwatch is not None else 0.0


def plan_prepared(prepared: TickInput, *, planner: PlanFn = planner_plan.plan,
                  stopwatch: Stopwatch | None = None, forecast_seconds: float = 0.0) -> Planned:
    """The plan step: run the planner on a prepared input."""
    t0 = _clock(stopwatch)
    plan = planner(prepared.planner_input)
    return Planned(
        planner_input=prepared.planner_input, forecast=prepared.forecast, plan=plan,
        forecast_error=prepared.forecast_error, forecast_seconds=forecast_seconds,
        plan_seconds=_clock(stopwatch) - t0,
    )


def compose_tick(
    states: Mapping[str, Any] | Observation,
    now: float,
    policy: Policy,
    *,
    planner: PlanFn = planner_plan.plan,
    prepare: Prepare = tick_input,
    stopwatch: Stopwatch | None = None,
) -> Planned:
    """The tick up to its plan: observe, forecast, plan from the projection states at `now`."""
    # The cyclic collector is paused for the whole tick, not only the plan: building the input
    # and the forecast allocate per host too, and each collection traversed the fleet's held
    # states to free nothing (grid.gcpause).
    with collector_paused():
        t0 = _clock(stopwatch)
        prepared = prepare(observe(states), now, policy)
        return plan_prepared(prepared, planner=planner, stopwatch=stopwatch,
                             forecast_seconds=_clock(stopwatch) - t0)


def decide(planned: Planned, history: ActionsState, now: float, controls: Controls, *,
           stopwatch: Stopwatch | None = None) -> Tick:
    """The reconcile step: the lifecycle actions that move the observed fleet toward the plan."""
    t0 = _clock(stopwatch)
    result = reconcile(planned.plan, planned.planner_input, history, now, mode=controls.mode,
                       limits=controls.limits, guards=controls.guards)
    return Tick(planned=planned, result=result, reconcile_seconds=_clock(stopwatch) - t0)


def run_tick(
    states: Mapping[str, Any] | Observation,
    now: float,
    controls: Controls,
    *,
    planner: PlanFn = planner_plan.plan,
    prepare: Prepare = tick_input,
    stopwatch: Stopwatch | None = None,
) -> Tick:
    """One whole tick at `now`: observe -> forecast -> plan -> reconcile (pure). The commands are
    `grid.controller.issue.command_issued` of `result.actions`, stamped by the caller."""
    # Paused through the reconciler as well (see compose_tick).
    with collector_paused():
        obs = observe(states)
        planned = compose_tick(obs, now, controls.policy, planner=planner, prepare=prepare, stopwatch=stopwatch)
        return decide(planned, obs.actions, now, controls, stopwatch=stopwatch)


# --- the policy a recorded plan ran under -----------------------------------------------------------


def encode_policy(policy: Policy) -> msgspec.Raw:
    """The policy as PlanCreated records it (deterministic bytes, opaque to the log)."""
    return msgspec.Raw(encode_value(policy))


def recorded_policy(event: PlanCreated) -> Policy:
    """The policy a recorded plan ran under; plans recorded before the field existed used the default."""
    raw = bytes(event.policy)
    if raw.strip() in (b"", b"null"):
        return Policy()
    return msgspec.json.decode(raw, type=Policy)


__all__ = [
    "DEMAND",
    "LIFECYCLE",
    "PROJECTIONS",
    "THROUGHPUT",
    "Controls",
    "PlanFn",
    "Planned",
    "Prepare",
    "Tick",
    "TickInput",
    "compose_tick",
    "decide",
    "encode_policy",
    "plan_prepared",
    "recorded_policy",
    "run_tick",
    "tick_input",
]
