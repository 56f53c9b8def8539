"""Admission rows per active workload: each of the nine states from a real plan (the production
planner on real inputs) and a real forecast, and a property that the rows partition the active
workloads whatever the forecast, plan and fleet."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grid.controller import workload_status as ws
from grid.controller.reconcile import LAST_REPLICA, MIN_RESIDENCY
from grid.demand.forecast import (
    WORKLOAD_ADMITTED,
    WORKLOAD_BELOW_GATE,
    WORKLOAD_IDLE,
    WORKLOAD_NO_CANDIDATE,
    Forecast,
    ModelCandidate,
    WorkloadForecast,
)
from grid.events.control import ModelProfile
from grid.fleet import reasons as R
from grid.fleet.planning import DemandTarget, Plan, PlannerInput, Policy, Preemption, Shortfall, TimingSample
from grid.fleet.views import HostView, ResidencyView
from grid.planner.plan import plan as make_plan

from tests.unit.planner.builders import NOW, host, mk, prof, res, want


def cand(model_id: str, suitability: float) -> ModelCandidate:
    return ModelCandidate(model_id=model_id, suitability=suitability, score=suitability, confidence=1.0,
                          quality_confidence=1.0, samples=10.0, quality_samples=0.0, bonus=0.0, validated=True)


def admitted(workload: str, model: str, replicas: int = 1, **kw) -> WorkloadForecast:
    return WorkloadForecast(workload=workload, status=WORKLOAD_ADMITTED, model_id=model, replicas=replicas,
                            offered_concurrency=0.8, **kw)


def fc(*workloads: WorkloadForecast, targets: tuple[DemandTarget, ...] = (), now: float = NOW) -> Forecast:
    return Forecast(now=now, bucket_seconds=60.0, window_buckets=60, evidence_observations=3,
                    evidence_concurrency=1.5, targets=targets, workloads=workloads)


def ready_of(hosts: tuple[HostView, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for h in hosts:
        for r in h.residencies:
            if r.state == "ready":
                out[r.model_id] = out.get(r.model_id, 0) + 1
    return out


def rows_for(inp: PlannerInput, forecast: Forecast, plan: Plan | None = None) -> dict[str, dict]:
    p = make_plan(inp) if plan is None else plan
    rows = ws.workload_rows(forecast, p, ready_of(inp.hosts), inp.hosts, {x.model_id: x for x in inp.profiles},
                            inp.timings)
    return {r["workload"]: r for r in rows}


def one(inp: PlannerInput, forecast: Forecast) -> dict:
    (row,) = rows_for(inp, forecast).values()
    return row


CODER = prof("coder", 4_000, min_replicas=0, max_replicas=2, load_seconds=40.0, warm_seconds=20.0)


def test_ready_when_every_desired_replica_is_ready() -> None:
    target = want("coder", 1, "inferred")
    inp = mk([CODER], [host("h1", residencies=(res("coder"),))], [target])
    row = one(inp, fc(admitted("coding", "coder"), targets=(target,)))
    assert (row["state"], row["reason"]) == (ws.READY, ws.ALL_READY)
    assert (row["desired"], row["planned"], row["ready"], row["missing"], row["eligible_hosts"]) == (1, 1, 1, 0, 1)
    assert row["served_by"] is None


def test_starting_while_a_placed_replica_warms_on_its_host() -> None:
    target = want("coder", 1, "inferred")
    inp = mk([CODER], [host("h1", residencies=(res("coder", state="warming", loaded_at=None),))], [target])
    row = one(inp, fc(admitted("coding", "coder"), targets=(target,)))
    assert (row["state"], row["reason"], row["detail"]) == (ws.STARTING, ws.REPLICA_STARTING, "on h1")
    assert (row["desired"], row["planned"], row["ready"], row["missing"]) == (1, 1, 0, 1)
    # Past its load: only the warm phase remains.
    assert row["startup_seconds"] == 20.0


def test_planned_while_the_placed_host_has_no_process_yet_and_served_by_names_the_fallback() -> None:
    target = want("coder", 1, "inferred")
    general = prof("general", 2_000, min_replicas=0, max_replicas=1)
    hosts = (host("h1"), host("h2", residencies=(res("general", 2_000),)))
    inp = mk([CODER, general], hosts, [target])
    w = admitted("coding", "coder", candidates=(cand("coder", 1.0), cand("general", 0.3)))
    row = one(inp, fc(w, targets=(target,)))
    assert row["state"] == ws.PLANNED and row["reason"] == ws.PLACED_NOT_STARTED
    assert (row["desired"], row["planned"], row["ready"], row["missing"], row["eligible_hosts"]) == (1, 1, 0, 1, 2)
    assert row["served_by"] == "general"
    assert row["startup_seconds"] == 60.0  # the profile's load + warm prior, no learned timing


def test_startup_estimate_takes_the_fastest_learned_path_over_the_placed_hosts() -> None:
    target = want("coder", 1, "inferred")
    timings = (TimingSample(host_id="h1", model_id="coder", load_seconds=4.0, warm_seconds=2.0, samples=8),)
    inp = mk([CODER], [host("h1")], [target], timings=timings)
    assert one(inp, fc(admitted("coding", "coder"), targets=(target,)))["startup_seconds"] == 6.0


def test_undersupplied_when_some_but_not_all_desired_replicas_are_ready_and_nothing_more_is_placed() -> None:
    target = want("coder", 2, "inferred")
    hosts = (host("h1", residencies=(res("coder"),)), host("h2", 3_000))  # h2 is too small
    inp = mk([CODER], hosts, [target])
    p = make_plan(inp)
    row = one(inp, fc(admitted("coding", "coder", 2), targets=(target,)))
    assert row["state"] == ws.UNDERSUPPLIED
    assert row["reason"] == next(ex.shortfall_reason for ex in p.explanations if ex.model_id == "coder")
    assert (row["desired"], row["planned"], row["ready"], row["missing"]) == (2, 1, 1, 1)


def test_deferred_below_the_evidence_gate_keeps_demand_visible() -> None:
    w = WorkloadForecast(workload="sales", status=WORKLOAD_BELOW_GATE, observations=1, offered_concurrency=0.05)
    row = one(mk([CODER], [host("h1")]), fc(w))
    assert (row["state"], row["reason"]) == (ws.DEFERRED, WORKLOAD_BELOW_GATE)
    assert row["detail"] == "1 of 3 observations, offered 0.05 of 1.50 concurrency"
    assert row["offered_concurrency"] == 0.05 and row["model_id"] is None


def test_deferred_when_the_forecast_desires_no_replica_of_the_model() -> None:
    # Admitted onto coder, but this tick's targets leave coder out (intentionally omitted):
    # its demand and concurrency stay on the row.
    row = one(mk([CODER], [host("h1")]), fc(admitted("coding", "coder")))
    assert (row["state"], row["reason"]) == (ws.DEFERRED, ws.NOT_PLANNED)
    assert (row["desired"], row["planned"], row["ready"], row["missing"]) == (0, 0, 0, 0)
    assert row["offered_concurrency"] == 0.8 and row["replicas"] == 1


def test_deferred_by_the_plans_bounded_wave() -> None:
    target = want("coder", 1, "direct")
    old = prof("old", 4_000, min_replicas=1, max_replicas=1, priority=-5)
    inp = mk([CODER, old], [host("h1", 5_000, residencies=(res("old"),))], [target],
             policy=Policy(max_evictions=0))
    row = one(inp, fc(admitted("coding", "coder"), targets=(target,)))
    assert (row["state"], row["reason"]) == (ws.DEFERRED, R.EVICTION_BUDGET)


def test_capacity_contended_when_other_work_holds_the_room() -> None:
    # Workload demand alone is inferred: it waits for room rather than preempting anything.
    target = want("coder", 1, "inferred")
    big = prof("big", 4_000, min_replicas=1, priority=5)
    inp = mk([CODER, big], [host("h1", 5_000, residencies=(res("big"),))], [target])
    row = one(inp, fc(admitted("coding", "coder"), targets=(target,)))
    assert (row["state"], row["reason"]) == (ws.CAPACITY_CONTENDED, R.INSUFFICIENT_MEMORY)
    assert (row["desired"], row["planned"], row["ready"], row["missing"], row["eligible_hosts"]) == (1, 0, 0, 1, 1)
    assert "insufficient_memory" in row["detail"]


def _fenced(occupant: ResidencyView, **profile) -> dict:
    target = want("coder", 1, "direct")
    profile = {"min_replicas": 1, "max_replicas": 1, **profile}
    old = prof("old", 4_000, priority=-5, **profile)
    inp = mk([CODER, old], [host("h1", 5_000, residencies=(occupant,))], [target])
    p = make_plan(inp)
    assert not p.preemptions and not any(x.model_id == "coder" for x in p.placements)
    return one(inp, fc(admitted("coding", "coder"), targets=(target,)))


def test_blocked_by_residency_behind_a_pinned_occupant() -> None:
    row = _fenced(res("old", pinned=True))
    assert (row["state"], row["reason"]) == (ws.BLOCKED_BY_RESIDENCY, ws.PINNED)
    assert row["detail"] == "old on h1"


def test_blocked_by_residency_behind_an_occupant_inside_its_minimum_residency() -> None:
    row = _fenced(res("old", loaded_at=NOW - 10.0), min_residency_seconds=300.0)
    assert (row["state"], row["reason"]) == (ws.BLOCKED_BY_RESIDENCY, MIN_RESIDENCY)


def test_blocked_by_residency_behind_a_short_models_last_ready_replica() -> None:
    row = _fenced(res("old"), min_replicas=2, max_replicas=2)
    assert (row["state"], row["reason"]) == (ws.BLOCKED_BY_RESIDENCY, LAST_REPLICA)


def test_a_preemptable_occupant_is_staged_not_blocked() -> None:
    target = want("coder", 1, "direct")
    old = prof("old", 4_000, min_replicas=1, max_replicas=1, priority=-5)
    inp = mk([CODER, old], [host("h1", 5_000, residencies=(res("old"),))], [target])
    p = make_plan(inp)
    assert any(pe.beneficiary_model == "coder" for pe in p.preemptions)
    row = one(inp, fc(admitted("coding", "coder"), targets=(target,)))
    assert (row["state"], row["reason"]) == (ws.CAPACITY_CONTENDED, R.PREEMPTION_STAGED)


def test_blocked_by_residency_when_the_staged_drain_waits_for_minimum_residency() -> None:
    target = want("coder", 1, "direct")
    inp = mk([CODER], [host("h1", 5_000)], [target])
    base = make_plan(inp)
    # The plan's recorded staging: the victim's drain is fenced until its minimum residency ends.
    staged = "1 replica(s) wait for staged drain on h1"
    p = msgspec.structs.replace(
        base, placements=(),
        shortfalls=(Shortfall(model_id="coder", wanted=1, placed=0, reason=R.PREEMPTION_STAGED, detail=staged),),
        explanations=tuple(msgspec.structs.replace(ex, chosen=(), placed=0, shortfall_reason=R.PREEMPTION_STAGED)
                           for ex in base.explanations),
        preemptions=(Preemption(host_id="h1", victim_model="old", beneficiary_model="coder",
                                reason=R.MODEL_LIMIT_CONVERGENCE, not_before=NOW + 120.0),))
    (row,) = rows_for(inp, fc(admitted("coding", "coder"), targets=(target,)), p).values()
    assert (row["state"], row["reason"]) == (ws.BLOCKED_BY_RESIDENCY, MIN_RESIDENCY)
    assert "old on h1 drains not before" in row["detail"]


def test_infeasible_when_no_host_is_eligible_or_no_model_suits() -> None:
    vllm = prof("coder", 4_000, min_replicas=0, max_replicas=1, runtimes=("vllm",))
    target = want("coder", 1, "inferred")
    inp = mk([vllm], [host("h1")], [target])
    rows = rows_for(inp, fc(admitted("coding", "coder"), WorkloadForecast(workload="video",
                                                                          status=WORKLOAD_NO_CANDIDATE),
                            targets=(target,)))
    assert (rows["coding"]["state"], rows["coding"]["reason"]) == (ws.INFEASIBLE, R.NO_ELIGIBLE_HOST)
    assert rows["coding"]["eligible_hosts"] == 0 and rows["coding"]["missing"] == 1
    assert (rows["video"]["state"], rows["video"]["reason"]) == (ws.INFEASIBLE, WORKLOAD_NO_CANDIDATE)


def test_awaiting_plan_without_a_plan_a_stale_plan_or_a_model_the_plan_never_saw() -> None:
    target = want("coder", 1, "inferred")
    inp = mk([CODER], [host("h1")], [target])
    forecast = fc(admitted("coding", "coder"), targets=(target,))
    (row,) = ws.workload_rows(forecast, None, {})
    assert (row["state"], row["reason"], row["eligible_hosts"]) == (ws.AWAITING_PLAN, ws.NO_PLAN, None)
    stale = fc(admitted("coding", "coder"), targets=(target,), now=NOW + 60.0)
    assert one(inp, stale)["reason"] == ws.PLAN_PREDATES_FORECAST
    newer = fc(admitted("coding", "fresh"), targets=(want("fresh", 1, "inferred"),))
    row = one(inp, newer)
    assert (row["state"], row["reason"]) == (ws.AWAITING_PLAN, ws.MODEL_NOT_IN_PLAN)


def test_idle_workloads_get_no_row_and_no_forecast_no_rows() -> None:
    assert ws.workload_rows(fc(WorkloadForecast(workload="design", status=WORKLOAD_IDLE)), None, {}) == []
    assert ws.workload_rows(None, None, {}) == []


# --- property: the rows partition the active workloads ---------------------------------------

MODELS = ("m0", "m1", "m2")
RES_STATES = ("ready", "loading", "warming", "cached", "draining", "failed")


@st.composite
def scenarios(draw) -> tuple[Forecast, Plan | None, PlannerInput]:
    profiles = [ModelProfile(model_id=m, memory_mb=draw(st.sampled_from((1_000, 3_000, 6_000))),
                             min_replicas=draw(st.integers(0, 1)), max_replicas=draw(st.integers(1, 3)),
                             priority=draw(st.integers(-2, 2)), pins=draw(st.sampled_from(((), ("h0",)))),
                             runtimes=draw(st.sampled_from((("llama.cpp",), ("llama.cpp",), ("vllm",)))),
                             min_residency_seconds=300.0)
                for m in draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=3, unique=True))]
    hosts = []
    for i in range(draw(st.integers(1, 3))):
        residencies = tuple(ResidencyView(model_id=m, memory_mb=1_000, state=draw(st.sampled_from(RES_STATES)),
                                          loaded_at=draw(st.sampled_from((None, NOW - 10.0, NOW - 10_000.0))),
                                          pinned=draw(st.booleans()), managed=draw(st.booleans()))
                            for m in draw(st.lists(st.sampled_from(MODELS), max_size=2, unique=True)))
        hosts.append(host(f"h{i}", draw(st.sampled_from((2_000, 5_000, 12_000))), residencies=residencies,
                          limit=draw(st.integers(0, 2))))
    targets = tuple(DemandTarget(model_id=m, replicas=draw(st.integers(1, 3)),
                                 evidence=draw(st.sampled_from(("inferred", "direct"))))
                    for m in draw(st.lists(st.sampled_from(MODELS), max_size=3, unique=True)))
    inp = mk(profiles, hosts, targets)
    # Mostly admitted onto a demanded model, so most rows reach the plan-driven states.
    statuses = (WORKLOAD_ADMITTED,) * 4 + (WORKLOAD_BELOW_GATE, WORKLOAD_NO_CANDIDATE, WORKLOAD_IDLE)
    demanded = tuple(t.model_id for t in targets)
    workloads = tuple(WorkloadForecast(workload=f"w{i}", status=(s := draw(st.sampled_from(statuses))),
                                       model_id=draw(st.sampled_from(demanded * 4 + (None, *MODELS, "unknown")))
                                       if s == WORKLOAD_ADMITTED else None,
                                       replicas=draw(st.integers(0, 3)))
                      for i in range(draw(st.integers(0, 5))))
    forecast = fc(*workloads, targets=targets, now=NOW + draw(st.sampled_from((0.0,) * 5 + (30.0,))))
    plan = draw(st.sampled_from((None,) + ("plan",) * 5))
    return forecast, (make_plan(inp) if plan else None), inp


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_rows_partition_the_active_workloads(case: tuple[Forecast, Plan | None, PlannerInput]) -> None:
    forecast, plan, inp = case
    ready = ready_of(inp.hosts)
    rows = ws.workload_rows(forecast, plan, ready, inp.hosts, {p.model_id: p for p in inp.profiles}, inp.timings)
    active = sorted(w.workload for w in forecast.workloads if w.status != WORKLOAD_IDLE)
    assert [r["workload"] for r in rows] == active  # each active workload exactly one row
    for r in rows:
        assert r["state"] in ws.STATES and r["reason"]
        assert r["missing"] == max(0, r["desired"] - r["ready"])
        assert r["planned"] == sum(1 for p in (plan.placements if plan else ()) if p.model_id == r["model_id"])
        if r["state"] == ws.READY:
            assert 0 < r["ready"] and r["missing"] == 0
        if r["state"] == ws.UNDERSUPPLIED:
            assert 0 < r["ready"] < r["desired"]
        if r["state"] in (ws.PLANNED, ws.STARTING):
            assert r["planned"] > 0
        if r["state"] in (ws.CAPACITY_CONTENDED, ws.BLOCKED_BY_RESIDENCY):
            assert r["ready"] == 0 and r["desired"] > 0
