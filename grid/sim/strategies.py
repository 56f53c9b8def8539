"""The four controls the lab compares, each a function of the projection states and `now`.

* smart: the production tick composition (grid.controller.tick.tick_input and the planner), unchanged.
* reactive: the same forecast without lookahead or correlation: no trend horizon, targets
  only correlation or sequence evidence asked for dropped (workload demand kept), and no
  predictive prefetch (the planner stages no cache-only advisory).
* greedy: each minute, the latest complete minute's visible demand only: named requests to
  their model, each `auto` workload to its highest-suitability feasible model, replicas for the
  offered concurrency; placed by the production planner.
* static: the population's average mix, planned once at the start; that plan is kept for the
  whole day (no rescheduling around failures).

Each is a (prepare, planner) pair for grid.controller.tick.run_tick; all four are reconciled,
routed and measured identically by grid.sim.run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from grid.controller.inputs import Observation, build_planner_input, ready_replicas
from grid.controller.tick import PlanFn, Prepare, TickInput, ready_since, tick_input
from grid.demand.fold import DemandState
from grid.demand.forecast import REASON_WORKLOAD, ForecastConfig, forecast
from grid.events.control import ModelProfile
from grid.fleet.planning import DemandTarget, Plan, PlannerInput, Policy
from grid.planner import plan as planner_plan
from grid.planner.fleet_scan import placeable_models
from grid.sim.fleet import MachineSpec

SMART = "smart"
REACTIVE = "reactive"
GREEDY = "greedy"
STATIC = "static"
STRATEGIES: tuple[str, ...] = (SMART, REACTIVE, GREEDY, STATIC)

# Controls the lab fences with the reconciler's minimum residency only: the scale-down cooldown
# is smart's own policy (reactive is smart without lookahead and keeps it), so minute-greedy is
# measured as the seed defines it, not with smart's churn damping borrowed.
RESIDENCY_FENCE_ONLY = frozenset({GREEDY})

REACTIVE_CONFIG = ForecastConfig(max_lookahead_seconds=0.0)
TARGET_UTILIZATION = 0.7


def feasible(spec: MachineSpec, p: ModelProfile) -> bool:
    """Static compatibility: runtime, backend and memory (the lab's own fleet facts)."""
    if not set(p.runtimes) & set(spec.runtimes):
        return False
    if p.backends and not set(p.backends) & set(spec.backends):
        return False
    return p.memory_mb <= spec.memory_mb


def best_model(workload: str, profiles: Mapping[str, ModelProfile], fleet: tuple[MachineSpec, ...]) -> str | None:
    """The highest-suitability model for a workload that some machine can host (ties: model id)."""
    best: tuple[float, str] | None = None
    for model_id in sorted(profiles):
        p = profiles[model_id]
        score = float(p.workload_scores.get(workload, 0.0))
        if score <= 0.0 or not any(feasible(s, p) for s in fleet):
            continue
        if best is None or (-score, model_id) < best:
            best = (-score, model_id)
    return None if best is None else best[1]


def replicas_for(offered: float, p: ModelProfile) -> int:
    cap = max(1, p.replica_concurrency) * TARGET_UTILIZATION
    return max(0, min(max(p.max_replicas, p.min_replicas), math.ceil(offered / cap - 1e-9)))


def targets_from_offered(
    offered: Mapping[str, float], profiles: Mapping[str, ModelProfile], reason: str,
) -> tuple[DemandTarget, ...]:
    out = []
    for model_id in sorted(profiles):
        p = profiles[model_id]
        want = max(p.min_replicas, replicas_for(offered.get(model_id, 0.0), p))
        if offered.get(model_id, 0.0) > 0 and want == 0:
            want = 1
        if want > 0:
            evidence = "direct" if offered.get(model_id, 0.0) > 0 else "baseline"
            out.append(DemandTarget(model_id=model_id, replicas=want, evidence=evidence,  # type: ignore[arg-type]
                                    offered_concurrency=round(offered.get(model_id, 0.0), 6), reason=reason))
    return tuple(out)


def reactive_input(obs: Observation, now: float, policy: Policy) -> TickInput:
    base = build_planner_input(obs, now, demand=(), policy=msgspec.structs.replace(policy, max_prefetch_per_plan=0))
    if obs.demand is None:
        raise ValueError("the reactive control needs the demand projection")
    fc = forecast(
        obs.demand, base.profiles, now, ready_replicas=ready_replicas(base.hosts, now, policy),
        ready_since=ready_since(base.hosts, now, policy),
        timings=base.timings, retired=frozenset(base.retired), config=REACTIVE_CONFIG,
        placeable=placeable_models(base.profiles, base.hosts),
    )
    targets = tuple(t for t in fc.targets if not _correlation_only(t))
    return TickInput(planner_input=msgspec.structs.replace(base, demand=targets))


def _correlation_only(t: DemandTarget) -> bool:
    """An inferred target that no workload (auto traffic) asked for: correlation or sequence only."""
    if t.evidence != "inferred":
        return False
    return not any(part.startswith(REASON_WORKLOAD + ":") for part in t.reason.split("+"))


def latest_offered(demand: DemandState, now: float, profiles: Mapping[str, ModelProfile],
                   fleet: tuple[MachineSpec, ...]) -> dict[str, float]:
    """Offered concurrency per model in the latest complete minute (greedy's whole view)."""
    b = int(now // demand.bucket_seconds) - 1
    offered: dict[str, float] = {}

    def minute(series: Any) -> float:
        for bk in reversed(series.buckets):
            if bk.index == b:
                service = bk.service_sum / bk.service_n if bk.service_n else 0.0
                return bk.count * service / demand.bucket_seconds
            if bk.index < b:
                break
        return 0.0

    for model_id in sorted(demand.models):
        if model_id in profiles:
            offered[model_id] = offered.get(model_id, 0.0) + minute(demand.models[model_id])
    for w in sorted(demand.workloads):
        model_id = best_model(w, profiles, fleet)
        if model_id is not None:
            offered[model_id] = offered.get(model_id, 0.0) + minute(demand.workloads[w])
    return offered


def greedy_input(profiles: Mapping[str, ModelProfile], fleet: tuple[MachineSpec, ...]) -> Prepare:
    def prepare(obs: Observation, now: float, policy: Policy) -> TickInput:
        if obs.demand is None:
            raise ValueError("the greedy control needs the demand projection")
        offered = latest_offered(obs.demand, now, profiles, fleet)
        demand = targets_from_offered(offered, profiles, "greedy_minute")
        return TickInput(planner_input=build_planner_input(obs, now, demand=demand, policy=policy))

    return prepare


def fixed_input(average: tuple[DemandTarget, ...]) -> Prepare:
    """The static control's input: the population's average mix, whatever the log says."""
    def prepare(obs: Observation, now: float, policy: Policy) -> TickInput:
        return TickInput(planner_input=build_planner_input(obs, now, demand=average, policy=policy))

    return prepare


def planned_once(planner: PlanFn = planner_plan.plan) -> PlanFn:
    """The static control's planner: the first plan, kept for the whole day."""
    kept: list[Plan] = []

    def plan_fn(pin: PlannerInput) -> Plan:
        if not kept:
            kept.append(planner(pin))
        return kept[0]

    return plan_fn


def lab_profile(strategy: str, p: ModelProfile) -> ModelProfile:
    """The profile a strategy's run configures: without the scale-down cooldown where only the
    minimum-residency fence applies."""
    if strategy in RESIDENCY_FENCE_ONLY:
        return msgspec.structs.replace(p, scale_down_cooldown_seconds=0.0)
    return p


def tick_functions(strategy: str, profiles: Mapping[str, ModelProfile], fleet: tuple[MachineSpec, ...],
                   average: tuple[DemandTarget, ...]) -> tuple[Prepare, PlanFn]:
    """How `strategy` prepares its planner input and plans, for grid.controller.tick.run_tick."""
    if strategy == SMART:
        return tick_input, planner_plan.plan
    if strategy == REACTIVE:
        return reactive_input, planner_plan.plan
    if strategy == GREEDY:
        return greedy_input(profiles, fleet), planner_plan.plan
    if strategy == STATIC:
        return fixed_input(average), planned_once()
    raise ValueError(f"unknown strategy {strategy!r} (one of: {', '.join(STRATEGIES)})")
