"""Build the planner's input from projection states exactly as the controller does.

Replay imports this module too, so a recorded plan's input can be rebuilt byte for byte.
Without a forecast, demand is the baseline (each profile's min_replicas).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from grid.events.control import ModelProfile
from grid.demand import forecast as forecast_mod
from grid.planner import plan as plan_module
from grid.planner.types import DemandTarget, Plan, PlannerInput, Policy, TimingSample
from grid.projections import catalog as catalog_proj
from grid.projections import fleet as fleet_proj
from grid.projections.actions import TIMING_AUTHORITATIVE_SAMPLES, ActionsState

PlanFn = Callable[[PlannerInput], Plan]


def baseline_demand(profiles: tuple[ModelProfile, ...]) -> tuple[DemandTarget, ...]:
    return tuple(
        DemandTarget(model_id=p.model_id, replicas=p.min_replicas, evidence="baseline", reason="min_replicas")
        for p in profiles
        if p.min_replicas > 0
    )


def timing_samples(actions: ActionsState) -> tuple[TimingSample, ...]:
    """Learned per host/model/artifact load and warm seconds (cold fetch preferred for load)."""
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for key in sorted(actions.timings):
        t = actions.timings[key]
        if not math.isfinite(t.ewma_seconds):
            continue
        k = (t.host_id, t.model_id, t.artifact_sha256 or "")
        slot = merged.setdefault(k, {"samples": 0})
        if t.kind == "warm":
            slot["warm"] = t.ewma_seconds
        elif t.kind == "load_fetch" or "load" not in slot:
            slot["load"] = t.ewma_seconds
        slot["samples"] = max(slot["samples"], t.samples)
    return tuple(
        TimingSample(
            host_id=h, model_id=m, artifact_sha256=sha or None,
            load_seconds=v.get("load"), warm_seconds=v.get("warm"), samples=v["samples"],
        )
        for (h, m, sha), v in sorted(merged.items())
        if v["samples"] >= 1
    )


def authoritative(sample: TimingSample) -> bool:
    return sample.samples >= TIMING_AUTHORITATIVE_SAMPLES


def build_planner_input(
    states: Mapping[str, Any],
    now: float,
    *,
    demand: tuple[DemandTarget, ...] | None = None,
    policy: Policy = Policy(),
) -> PlannerInput:
    catalog: catalog_proj.CatalogState = states["catalog"]
    fleet: fleet_proj.FleetState = states["fleet"]
    actions: ActionsState = states["actions"]
    profiles = catalog_proj.sorted_profiles(catalog)
    return PlannerInput(
        now=now,
        profiles=profiles,
        hosts=fleet_proj.snapshots(fleet, now),
        demand=baseline_demand(profiles) if demand is None else demand,
        policy=policy,
        timings=timing_samples(actions),
        retired=tuple(sorted(catalog.retired)),
    )


def planner() -> tuple[PlanFn, str, Callable[[Plan], list[str]]]:
    """(plan function, version, explanation renderer) of the installed planner."""
    return plan_module.plan, plan_module.PLANNER_VERSION, plan_module.render_explanation


def encode_plan(plan: Plan) -> bytes:
    return bytes(plan_module.encode_plan(plan))


def decode_plan(data: bytes) -> Plan:
    return plan_module.decode_plan(data)


def forecast_module() -> Any:
    return forecast_mod
