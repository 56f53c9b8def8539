"""The one tick composition: projection states -> planner input -> forecast -> plan (pure).

The controller service and replay (and any simulator) call this module, and nothing else
builds a tick: a recorded plan's input is rebuilt by exactly the code that built it, so replay
reproduces it byte for byte. Everything here is a function of the projection states, an
explicit ``now`` and the planner ``Policy``; the side effects (recording, reconciling,
publishing) stay in ``grid.controller.service``. With two or more active workloads the
forecast's workload -> model map comes from the joint portfolio search
(``grid.demand.portfolio``), whose counterfactuals are planned by the production planner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from grid.controller.inputs import baseline_demand, build_planner_input, ready_replicas
from grid.demand import fold as demand_fold
from grid.demand import portfolio as portfolio_mod
from grid.demand.forecast import Forecast, forecast
from grid.events.base import Event
from grid.events.codec import encode_value
from grid.events.plan import PlanCreated
from grid.events.subjects import CONTROL_STREAM, REQUESTS_STREAM
from grid.planner import plan as planner_plan
from grid.planner.fleet_scan import placeable_models
from grid.fleet import heartbeat_fresh
from grid.planner.types import HostSnapshot, Plan, PlannerInput, Policy
from grid.projections import catalog as catalog_proj
from grid.projections.position import Position
from grid.projections import throughput as throughput_proj
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


# Demand also reads the control stream for the owner's quality evaluations.
DEMAND = ProjectionSpec("demand", (REQUESTS_STREAM, CONTROL_STREAM), demand_fold.DemandState, demand_fold.initial,
                        _fold_demand)
THROUGHPUT = ProjectionSpec("throughput", (REQUESTS_STREAM,), throughput_proj.ThroughputState,
                            throughput_proj.initial, _fold_throughput)
# The projections a tick reads: the core ones plus request demand (for the forecast) and the
# measured per-engine throughput (for placement).
# PLACED_CONTROL: which replicas the controller commanded and its hosts confirmed (a claim
# nobody commanded is not supply; a plan lists the corroborated ones for the gateway).
PROJECTIONS: tuple[ProjectionSpec, ...] = CORE_PROJECTIONS + (DEMAND, THROUGHPUT, PLACED_CONTROL)


class TickInput(msgspec.Struct, frozen=True, kw_only=True):
    """What the planner runs on, and the forecast its demand came from."""

    planner_input: PlannerInput
    # None: demand is the baseline (min_replicas), because there is no demand projection or
    # the forecast failed (then `forecast_error` says why).
    forecast: Forecast | None = None
    forecast_error: str | None = None


class Tick(msgspec.Struct, frozen=True, kw_only=True):
    planner_input: PlannerInput
    forecast: Forecast | None
    plan: Plan
    forecast_error: str | None = None
    # Durations measured with the caller's stopwatch (0.0 without one); they never feed a decision.
    forecast_seconds: float = 0.0
    plan_seconds: float = 0.0


def ready_since(hosts: Sequence[HostSnapshot], now: float, policy: Policy) -> dict[str, tuple[float | None, ...]]:
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


def tick_input(states: Mapping[str, Any], now: float, policy: Policy) -> TickInput:
    """The planner input a tick at `now` plans from: the fleet and catalog, demand from the forecast."""
    base = build_planner_input(states, now, demand=(), policy=policy)
    if "demand" not in states:
        return TickInput(planner_input=msgspec.structs.replace(base, demand=baseline_demand(base.profiles)))
    try:
        ready = ready_replicas(base.hosts, now, policy)
        serving_since = ready_since(base.hosts, now, policy)
        placeable = placeable_models(base.profiles, base.hosts)

        def counterfactual(portfolio: Mapping[str, str] | None = None) -> Forecast:
            return forecast(
                states["demand"], base.profiles, now, ready_replicas=ready, ready_since=serving_since,
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


def compose_tick(
    states: Mapping[str, Any],
    now: float,
    policy: Policy,
    *,
    planner: PlanFn = planner_plan.plan,
    stopwatch: Stopwatch | None = None,
) -> Tick:
    """One tick: forecast, then plan, from the projection states at `now` under `policy`."""
    t0 = stopwatch() if stopwatch is not None else 0.0
    prepared = tick_input(states, now, policy)
    t1 = stopwatch() if stopwatch is not None else 0.0
    plan = planner(prepared.planner_input)
    t2 = stopwatch() if stopwatch is not None else 0.0
    return Tick(
        planner_input=prepared.planner_input, forecast=prepared.forecast, plan=plan,
        forecast_error=prepared.forecast_error, forecast_seconds=t1 - t0, plan_seconds=t2 - t1,
    )


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
    "PROJECTIONS",
    "THROUGHPUT",
    "PlanFn",
    "Tick",
    "TickInput",
    "compose_tick",
    "encode_policy",
    "recorded_policy",
    "tick_input",
]
