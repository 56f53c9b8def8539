"""What each active workload's `auto` traffic gets right now (the `workloads` rows of status).

The forecast says which model a workload's demand is projected onto and whether it was
admitted; the plan says whether that model got replicas; the fleet says whether they serve.
One row per non-idle workload joins the three, so an operator sees a deferred workload and
the reason, not only a model's shortfall:

* ``served``: its model has a ready replica;
* ``starting``: its model is placed, no replica is ready yet;
* ``deferred``: admitted, but its model is not placed (``reason``: the plan's shortfall reason,
  e.g. insufficient_memory, relocation_staged); ``served_by`` names a ready model the router
  sends its traffic to meanwhile, if any;
* ``waiting_for_evidence``: below the admission gate (``detail``: how far below);
* ``no_suitable_model``: no configured model scores it.

Pure: the forecast, the plan and the ready-replica counts in, rows out (sorted by workload).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grid.demand.forecast import WORKLOAD_ADMITTED, WORKLOAD_BELOW_GATE, WORKLOAD_IDLE, WORKLOAD_NO_CANDIDATE, Forecast
from grid.fleet.planning import Plan

SERVED = "served"
STARTING = "starting"
DEFERRED = "deferred"
WAITING_FOR_EVIDENCE = "waiting_for_evidence"
NO_SUITABLE_MODEL = "no_suitable_model"
# A deferred workload whose model the plan neither placed nor reported short of (its target
# is zero this tick, e.g. an exploration that lost its slot).
NOT_PLANNED = "not_planned"


def workload_rows(forecast: Forecast | None, plan: Plan | None, ready: Mapping[str, int]) -> list[dict[str, Any]]:
    if forecast is None:
        return []
    placed: dict[str, int] = {}
    for p in plan.placements if plan is not None else ():
        placed[p.model_id] = placed.get(p.model_id, 0) + 1
    short = {s.model_id: s for s in plan.shortfalls} if plan is not None else {}
    rows = []
    for w in sorted(forecast.workloads, key=lambda x: x.workload):
        if w.status == WORKLOAD_IDLE:
            continue
        model = w.model_id
        row: dict[str, Any] = {
            "workload": w.workload, "state": "", "model_id": model, "replicas": w.replicas,
            "ready": ready.get(model, 0) if model else 0, "placed": placed.get(model, 0) if model else 0,
            "offered_concurrency": round(w.offered_concurrency, 6), "reason": "", "detail": "",
            "served_by": None, "joint": w.joint, "exploring": w.exploring,
        }
        if w.status == WORKLOAD_NO_CANDIDATE or (w.status == WORKLOAD_ADMITTED and not model):
            row["state"] = NO_SUITABLE_MODEL
        elif w.status == WORKLOAD_BELOW_GATE:
            row["state"] = WAITING_FOR_EVIDENCE
            row["detail"] = (f"{w.observations} of {forecast.evidence_observations} observations, offered "
                             f"{w.offered_concurrency:.2f} of {forecast.evidence_concurrency:.2f} concurrency")
        elif row["ready"]:
            row["state"] = SERVED
        elif row["placed"]:
            row["state"] = STARTING
        else:
            row["state"] = DEFERRED
            s = short.get(model) if model else None
            row["reason"] = s.reason if s is not None else NOT_PLANNED
            row["detail"] = s.detail if s is not None else ""
            fallback = sorted((c for c in w.candidates if c.model_id != model and ready.get(c.model_id, 0)),
                              key=lambda c: (-c.suitability, c.model_id))
            row["served_by"] = fallback[0].model_id if fallback else None
        rows.append(row)
    return rows
