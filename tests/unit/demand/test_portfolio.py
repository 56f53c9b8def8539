"""The joint portfolio search (grid.demand.portfolio): real demand fold, forecast and planner."""

from __future__ import annotations

from collections.abc import Mapping

from grid.demand import fold
from grid.demand import portfolio as pm
from grid.demand.forecast import Forecast, forecast
from grid.events.control import ModelProfile
from grid.events.requests import RequestBatch, RequestFeatures
from grid.fleet.planning import PlannerInput
from grid.fleet.views import ResidencyView
from grid.planner import plan as planner_plan
from tests.unit.planner import builders

NOW = 1_800_000_000.0


def _demand(rates: Mapping[str, int], configured: frozenset[str]) -> fold.DemandState:
    """Ten minutes of steady `auto` traffic, `rates[w]` requests a minute per workload."""
    state = fold.initial()
    for minute in range(10):
        t = NOW - 600 + minute * 60 + 30
        records = tuple(
            RequestFeatures(endpoint="chat", requested_model="auto", auto=True, workload=w, service_seconds=3.0,
                            finished_at=t)
            for w in sorted(rates) for _ in range(rates[w]))
        state = fold.apply(state, RequestBatch(event_id=f"b{minute}", at=t, source="t", records=records), t,
                           configured)
    return state


def host(hid: str, cap: int, **kw):
    return builders.host(hid, cap, hb=NOW - 1.0, **kw)


def _p(mid: str, scores: dict[str, float], mem: int = 5_000, **kw) -> ModelProfile:
    kw.setdefault("max_replicas", 2)
    kw.setdefault("replica_concurrency", 4)
    return ModelProfile(model_id=mid, memory_mb=mem, workload_scores=scores, **kw)


SPECIALISTS_AND_GENERALIST = (
    _p("coder", {"coding": 0.95}),
    _p("general", {"coding": 0.6, "marketing": 0.6, "general": 0.8}),
    _p("writer", {"marketing": 0.9}),
)


def _run(profiles, hosts, rates, *, ready: Mapping[str, int] = {}):
    demand = _demand(rates, frozenset(p.model_id for p in profiles))
    base = PlannerInput(now=NOW, profiles=tuple(profiles), hosts=tuple(hosts))
    calls: list[Mapping[str, str]] = []

    def counterfactual(mapping: Mapping[str, str] | None = None) -> Forecast:
        if mapping is not None:
            calls.append(dict(mapping))
        return forecast(demand, profiles, NOW, ready_replicas=ready, portfolio=mapping)

    fc = counterfactual()
    result, chosen = pm.search(fc, base, counterfactual, planner_plan.plan, ready=ready)
    plan = planner_plan.plan(PlannerInput(now=NOW, profiles=tuple(profiles), hosts=tuple(hosts),
                                          demand=chosen.targets))
    return result, chosen, plan, calls


def test_a_shared_generalist_beats_two_specialists_when_one_model_slot_is_free() -> None:
    # One host with one model slot; coding and marketing both active. Independently each
    # workload picks its specialist, the planner can place only one of them and the other
    # workload is left without a model. Jointly, both go to the generalist.
    result, chosen, plan, _ = _run(SPECIALISTS_AND_GENERALIST, [host("h1", 24_000, limit=1)],
                                   {"coding": 20, "marketing": 20})
    assert result.independent == {"coding": "coder", "marketing": "writer"}
    assert result.mapping == {"coding": "general", "marketing": "general"}
    assert result.reason == pm.REASON_IMPROVED
    assert result.independent_score is not None and result.independent_score.coverage == 1
    assert result.score is not None and result.score.coverage == 2
    assert [p.model_id for p in plan.placements] == ["general"]
    rows = {w.workload: w for w in chosen.workloads}
    assert rows["coding"].model_id == "general" and rows["coding"].independent_model_id == "coder"
    assert rows["coding"].joint and rows["marketing"].joint


def test_a_roomy_fleet_keeps_the_independent_choices_after_one_evaluation() -> None:
    result, chosen, plan, calls = _run(SPECIALISTS_AND_GENERALIST, [host("h1", 64_000)],
                                       {"coding": 20, "marketing": 20})
    assert result.reason == pm.REASON_COMPLETE
    assert result.mapping == result.independent == {"coding": "coder", "marketing": "writer"}
    assert result.evaluations == 1 and calls == []
    assert sorted(p.model_id for p in plan.placements) == ["coder", "writer"]
    assert not any(w.joint for w in chosen.workloads)


def test_one_workload_is_not_searched() -> None:
    result, _, _, calls = _run(SPECIALISTS_AND_GENERALIST, [host("h1", 24_000, limit=1)], {"coding": 20})
    assert result.reason == pm.REASON_SINGLE and result.evaluations == 0 and calls == []


def test_a_cold_switch_needs_more_gain_than_the_transition_penalty() -> None:
    # "ready" serves both workloads and is resident; "fresh" is two points better per workload
    # but cold (both take four minutes to start); the specialists are too large to start
    # beside the resident model. Both shared portfolios cover both workloads with one model:
    # only utility minus the transition penalty separates them, and the incumbent stays.
    profiles = (
        _p("spec-a", {"research": 0.9}, mem=8_000), _p("spec-b", {"sales": 0.9}, mem=8_000),
        _p("ready", {"research": 0.6, "sales": 0.6}, load_seconds=180.0, warm_seconds=60.0),
        _p("fresh", {"research": 0.62, "sales": 0.62}, load_seconds=180.0, warm_seconds=60.0),
    )
    resident = ResidencyView(model_id="ready", memory_mb=5_000, state="ready", loaded_at=NOW - 3600)
    hosts = [host("h1", 12_000, limit=2, residencies=(resident,))]
    result, _, plan, _ = _run(profiles, hosts, {"research": 20, "sales": 20}, ready={"ready": 1})
    assert result.independent == {"research": "spec-a", "sales": "spec-b"}
    assert result.mapping == {"research": "ready", "sales": "ready"}
    assert [p.model_id for p in plan.placements] == ["ready"]
    # Without a resident incumbent (one slot, everything cold) the better-suited model wins.
    cold, _, _, _ = _run(profiles, [host("h1", 12_000, limit=1)], {"research": 20, "sales": 20})
    assert cold.mapping == {"research": "fresh", "sales": "fresh"}


def test_the_search_is_bounded_and_deterministic() -> None:
    # Nine workloads, nine models suitable for all of them, one slot: at most four candidates
    # per workload and 64 evaluated portfolios, and the same inputs give the same answer.
    workloads = ["coding", "design", "embedding", "general", "image", "marketing", "research", "sales", "video"]
    # m<i> is the specialist for workload i and suits the next two; "shared" suits all nine.
    profiles = tuple(_p(f"m{i}", {workloads[(i + k) % 9]: 0.9 - 0.1 * k for k in range(3)}) for i in range(9))
    profiles += (_p("shared", {w: 0.5 for w in workloads}),)
    rates = {w: 10 for w in workloads}
    first, chosen, _, calls = _run(profiles, [host("h1", 24_000, limit=1)], rates)
    again, _, _, _ = _run(profiles, [host("h1", 24_000, limit=1)], rates)
    assert first == again
    assert 1 < first.evaluations <= pm.MAX_PORTFOLIOS
    assert len(calls) <= pm.MAX_PORTFOLIOS
    per_workload: dict[str, set[str]] = {}
    for mapping in calls:
        for w, m in mapping.items():
            per_workload.setdefault(w, set()).add(m)
    assert all(len(ms) <= pm.MAX_CANDIDATES for ms in per_workload.values())
    assert first.score is not None and first.score.coverage == 9  # one shared model serves them all
    assert set(first.mapping.values()) == {"shared"}


def test_baseline_and_direct_service_come_before_workload_coverage() -> None:
    # The objective's order: protected (baseline/direct) replicas, then workload coverage,
    # pressure, fewer missing replicas, fewer models, utility.
    keep = pm.Score(protected=2, coverage=1, pressure=0.0, missing=3, models=3, utility=0.0)
    trade = pm.Score(protected=1, coverage=5, pressure=9.0, missing=0, models=1, utility=500.0)
    assert keep.key() > trade.key()
    # With a configured baseline on one of two slots, the chosen portfolio keeps it placed.
    profiles = (
        _p("ops", {"research": 0.3, "sales": 0.3}, min_replicas=1),
        _p("spec-a", {"research": 0.9}), _p("spec-b", {"sales": 0.9}),
        _p("shared", {"research": 0.7, "sales": 0.7}),
    )
    result, _, plan, _ = _run(profiles, [host("h1", 24_000, limit=2)], {"research": 20, "sales": 20})
    assert "ops" in {p.model_id for p in plan.placements}
    assert result.score is not None and result.score.protected == 1 and result.score.coverage == 2


def test_at_most_one_unproven_model_enters_a_portfolio_per_tick() -> None:
    # Two one-slot hosts, four workloads with a specialist each (the leaders) and two unproven
    # generalists that would cover all four together. Only one model may differ from the
    # leaders because of uncertainty, so the search covers three workloads, not four.
    profiles = (
        _p("spec-c", {"coding": 0.9}), _p("spec-m", {"marketing": 0.9}),
        _p("spec-r", {"research": 0.9}), _p("spec-s", {"sales": 0.9}),
        _p("gen-1", {"coding": 0.6, "research": 0.6}), _p("gen-2", {"marketing": 0.6, "sales": 0.6}),
    )
    hosts = [host("h1", 6_000, limit=1), host("h2", 6_000, limit=1, domain="d1")]
    result, _, _, calls = _run(profiles, hosts, {"coding": 20, "marketing": 20, "research": 20, "sales": 20})
    assert result.score is not None and result.score.coverage == 3
    assert result.exploring in ("gen-1", "gen-2")
    leaders = set(result.independent.values())
    assert all(len({m for m in mapping.values() if m not in leaders}) <= 1 for mapping in calls)


def test_a_mapping_to_a_model_that_is_not_a_candidate_keeps_the_leader() -> None:
    demand = _demand({"coding": 20, "marketing": 20}, frozenset(p.model_id for p in SPECIALISTS_AND_GENERALIST))
    fc = forecast(demand, SPECIALISTS_AND_GENERALIST, NOW, portfolio={"coding": "writer", "marketing": "nope"})
    rows = {w.workload: w for w in fc.workloads}
    assert rows["coding"].model_id == "coder" and not rows["coding"].joint
    assert rows["marketing"].model_id == "writer" and not rows["marketing"].joint


def test_a_served_workload_is_not_moved_when_the_router_already_serves_the_other() -> None:
    # Two slots: the baseline "ops" (which also suits marketing) and the coder serving coding.
    # The writer cannot fit beside them, but marketing is still served: the router's `auto`
    # choice falls back to "ops". Moving coding and marketing onto the generalist would place
    # both workloads' own model, yet cover nothing new: it would only drain the coder. The
    # search projects marketing onto "ops" instead (placed, no new model) and keeps the coder.
    profiles = (
        _p("coder", {"coding": 0.95}),
        _p("generalist", {"coding": 0.6, "marketing": 0.6}),
        _p("ops", {"marketing": 0.3}, min_replicas=1),
        _p("writer", {"marketing": 0.9}, mem=8_000),
    )
    result, _, plan, _ = _run(profiles, [host("h1", 12_000, limit=2)], {"coding": 20, "marketing": 20})
    assert result.independent == {"coding": "coder", "marketing": "writer"}
    assert result.independent_score is not None and result.independent_score.coverage == 2
    assert result.mapping == {"coding": "coder", "marketing": "ops"}
    assert sorted(p.model_id for p in plan.placements) == ["coder", "ops"]


def test_a_workload_served_by_its_own_model_keeps_it_when_another_fits_beside() -> None:
    # One host holds the writer and one 4 GB model, not the coder too. Coding can go to the
    # generalist beside the writer, or both workloads can share the generalist (one slot
    # fewer): the search keeps the writer that already serves marketing and adds the generalist.
    profiles = (
        _p("coder", {"coding": 0.95}),
        _p("generalist", {"coding": 0.6, "marketing": 0.6}, mem=4_000),
        _p("writer", {"marketing": 0.9}, mem=8_000),
    )
    result, _, plan, _ = _run(profiles, [host("h1", 13_000, limit=2)], {"coding": 20, "marketing": 20})
    assert result.independent_score is not None and result.independent_score.served == ("marketing",)
    assert result.mapping == {"coding": "generalist", "marketing": "writer"}
    assert sorted(p.model_id for p in plan.placements) == ["generalist", "writer"]
