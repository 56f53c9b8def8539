"""Status rows per active workload: served, starting, deferred (with the reason and the model
serving its traffic meanwhile), waiting for evidence, no suitable model; idle ones are left out."""

from __future__ import annotations

from grid.controller import workload_status as ws
from grid.demand.forecast import (
    WORKLOAD_ADMITTED,
    WORKLOAD_BELOW_GATE,
    WORKLOAD_IDLE,
    WORKLOAD_NO_CANDIDATE,
    ModelCandidate,
    Forecast,
    WorkloadForecast,
)
from grid.fleet import reasons as R
from grid.fleet.planning import Placement, Plan, Shortfall


def cand(model_id: str, suitability: float) -> ModelCandidate:
    return ModelCandidate(model_id=model_id, suitability=suitability, score=suitability, confidence=1.0,
                     quality_confidence=1.0, samples=10.0, quality_samples=0.0, bonus=0.0, validated=True)


def test_rows_join_forecast_plan_and_fleet() -> None:
    fc = Forecast(now=1000.0, bucket_seconds=60.0, window_buckets=60, evidence_observations=3,
                  evidence_concurrency=1.5, workloads=(
                      WorkloadForecast(workload="coding", status=WORKLOAD_ADMITTED, model_id="coder", replicas=1,
                                       offered_concurrency=0.8),
                      WorkloadForecast(workload="research", status=WORKLOAD_ADMITTED, model_id="big", replicas=1),
                      WorkloadForecast(workload="image", status=WORKLOAD_ADMITTED, model_id="img", replicas=2,
                                       offered_concurrency=1.2,
                                       candidates=(cand("img", 1.0), cand("general", 0.2), cand("other", 0.1))),
                      WorkloadForecast(workload="sales", status=WORKLOAD_BELOW_GATE, observations=1,
                                       offered_concurrency=0.05),
                      WorkloadForecast(workload="video", status=WORKLOAD_NO_CANDIDATE),
                      WorkloadForecast(workload="design", status=WORKLOAD_IDLE),
                  ))
    plan = Plan(planner_version="t", inputs_digest="0" * 64, now=1000.0,
                placements=(Placement(model_id="coder", host_id="h1", runtime="llama.cpp", memory_mb=1, status="existing"),
                            Placement(model_id="big", host_id="h2", runtime="llama.cpp", memory_mb=1, status="new")),
                shortfalls=(Shortfall(model_id="img", wanted=2, placed=0, reason=R.RELOCATION_STAGED,
                                      detail="1 replica(s) wait for another model to move off h3"),))
    rows = {r["workload"]: r for r in ws.workload_rows(fc, plan, {"coder": 1, "general": 1, "other": 1})}
    assert sorted(rows) == ["coding", "image", "research", "sales", "video"]
    assert rows["coding"]["state"] == ws.SERVED and rows["coding"]["ready"] == 1
    assert rows["research"]["state"] == ws.STARTING and rows["research"]["placed"] == 1
    img = rows["image"]
    assert (img["state"], img["reason"], img["served_by"]) == (ws.DEFERRED, R.RELOCATION_STAGED, "general")
    assert "move off h3" in img["detail"]
    assert rows["sales"]["state"] == ws.WAITING_FOR_EVIDENCE
    assert rows["sales"]["detail"] == "1 of 3 observations, offered 0.05 of 1.50 concurrency"
    assert rows["video"]["state"] == ws.NO_SUITABLE_MODEL


def test_a_model_neither_placed_nor_short_is_not_planned_and_no_forecast_no_rows() -> None:
    fc = Forecast(now=0.0, bucket_seconds=60.0, window_buckets=60, evidence_observations=3, evidence_concurrency=1.5,
                  workloads=(WorkloadForecast(workload="coding", status=WORKLOAD_ADMITTED, model_id="coder"),))
    (row,) = ws.workload_rows(fc, None, {})
    assert (row["state"], row["reason"], row["served_by"]) == (ws.DEFERRED, ws.NOT_PLANNED, None)
    assert ws.workload_rows(None, None, {}) == []
