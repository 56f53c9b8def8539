import pytest

from grid.demand import outcomes as oc
from grid.demand.forecast import (
    GATE_CONCURRENCY, GATE_OBSERVATIONS, REASON_CANARY, WORKLOAD_BELOW_GATE, forecast,
)
from grid.demand import fold as dm

from tests.unit.demand.fc_helpers import T0, at, auto, fold, profile, rec, row, target, wrow

CONF = frozenset({"coder", "generalist", "painter", "video"})
DAY = 86_400.0


def catalog(**over):
    base = [
        profile("coder", workload_scores={"coding": 0.9, "general": 0.3}, artifact_sha256="c1"),
        profile("generalist", workload_scores={"coding": 0.5, "general": 0.8, "research": 0.7}),
        profile("video", workload_scores={"video": 0.9}, expected_service_seconds=60.0, artifact_sha256="v1"),
    ]
    return base


def test_three_observations_admit_workload_demand_onto_the_best_model():
    s = fold(dm.initial(), at(0), [auto("coding", served="generalist") for _ in range(2)], CONF)
    fc = forecast(s, catalog(), at(0, 50.0))
    assert wrow(fc, "coding").status == WORKLOAD_BELOW_GATE and fc.targets == ()
    s = fold(s, at(0, 40.0), [auto("coding", served="generalist")], CONF)
    fc = forecast(s, catalog(), at(0, 50.0))
    w = wrow(fc, "coding")
    assert (w.status, w.gate, w.model_id) == ("admitted", GATE_OBSERVATIONS, "coder")
    t = target(fc, "coder")
    assert (t.replicas, t.evidence, t.canary) == (1, "inferred", False)
    assert "workload:coding" in t.reason
    # The router's fallback choice ("generalist") got outcome evidence, never demand.
    assert target(fc, "generalist") is None
    assert oc.view(s.outcomes, "generalist", "coding", None, at(0, 50.0)).samples == pytest.approx(3.0, rel=1e-3)
    assert fc.evidence_observations == 3 and fc.evidence_concurrency == 1.5


def test_one_short_request_stays_below_the_gate():
    s = fold(dm.initial(), at(0), [auto("coding")], CONF)
    fc = forecast(s, catalog(), at(0, 30.0))
    assert wrow(fc, "coding").status == WORKLOAD_BELOW_GATE and fc.targets == ()


def test_queued_long_job_crosses_the_concurrency_gate_as_a_one_replica_canary():
    job = auto("video", outcome="unavailable", status_code=503, service_seconds=0.0, queue_depth=2)
    s = fold(dm.initial(), at(0), [job], CONF)
    fc = forecast(s, catalog(), at(0, 30.0))
    w = wrow(fc, "video")
    assert w.gate == GATE_CONCURRENCY and w.offered_concurrency >= 1.5 and w.canary
    t = target(fc, "video")
    assert (t.replicas, t.canary, t.evidence) == (1, True, "inferred") and REASON_CANARY in t.reason
    # The unserved workload queue is not the model's projected concurrency.
    assert w.projected_concurrency < w.offered_concurrency


def test_weak_evidence_is_capped_until_validated_by_a_fresh_success():
    heavy = [auto("video", service_seconds=240.0) for _ in range(2)]
    s = fold(dm.initial(), at(0), heavy, CONF)
    t = target(forecast(s, catalog(), at(0, 30.0)), "video")
    assert (t.replicas, t.canary) == (1, True)  # raw concurrency asks for many more
    # A success of that exact model/workload/artifact validates the canary.
    s = fold(s, at(0, 20.0), [auto("video", served="video", artifact_sha256="v1", service_seconds=1.0)], CONF)
    t = target(forecast(s, catalog(), at(0, 30.0)), "video")
    assert t.canary is False and t.replicas > 1
    # A success of a different artifact (or a stale one) does not.
    s2 = fold(dm.initial(), at(0), heavy, CONF)
    oc.record(s2.outcomes, "video", "video", "old", ok=True, latency_seconds=1.0, evaluation=False, at=at(0, 20.0))
    oc.record(s2.outcomes, "video", "video", "v1", ok=True, latency_seconds=1.0, evaluation=False,
              at=at(0, 20.0) - oc.VALIDATION_SECONDS - 1.0)
    t2 = target(forecast(s2, catalog(), at(0, 30.0)), "video")
    assert (t2.replicas, t2.canary) == (1, True)


def test_direct_demand_removes_the_canary_cap():
    s = fold(dm.initial(), at(0), [auto("video", service_seconds=240.0) for _ in range(2)]
             + [rec("video", service_seconds=60.0)], CONF)
    t = target(forecast(s, catalog(), at(0, 30.0)), "video")
    assert (t.evidence, t.canary) == ("direct", False) and t.replicas > 1
    assert "workload:video" in t.reason


def test_outcome_confidence_ramps_and_decays_independently():
    o: oc.Outcomes = {}
    for i in range(10):
        oc.record(o, "m", "coding", "s1", ok=True, latency_seconds=1.0, evaluation=False, at=T0 + i)
    v = oc.view(o, "m", "coding", "s1", T0 + 10)
    assert v.confidence == pytest.approx(0.5, rel=1e-3) and v.bonus == pytest.approx(3.0, rel=1e-2)
    for i in range(10):
        oc.record(o, "m", "coding", "s1", ok=True, latency_seconds=1.0, evaluation=False, at=T0 + 10 + i)
    assert oc.view(o, "m", "coding", "s1", T0 + 20).confidence == pytest.approx(1.0, rel=1e-3)
    for i in range(8):
        oc.record(o, "m", "coding", "s1", ok=True, latency_seconds=1.0, evaluation=True, at=T0 + 20 + i)
    v = oc.view(o, "m", "coding", "s1", T0 + 30)
    assert v.quality_confidence == pytest.approx(1.0, rel=1e-3) and v.quality == 1.0
    # Seven days later both halves halve.
    later = T0 + 30 + 7 * DAY
    v = oc.view(o, "m", "coding", "s1", later)
    assert v.samples == pytest.approx(10.0, rel=1e-3) and v.quality_samples == pytest.approx(4.0, rel=1e-3)
    # A fresh latency-only request cannot revive stale quality.
    oc.record(o, "m", "coding", "s1", ok=True, latency_seconds=1.0, evaluation=False, at=later)
    v2 = oc.view(o, "m", "coding", "s1", later)
    assert v2.samples == pytest.approx(11.0, rel=1e-3)
    assert v2.quality_samples == pytest.approx(4.0, rel=1e-3) and v2.quality_age_seconds >= 7 * DAY
    # Keyed by artifact: a new sha starts uncertain.
    fresh = oc.view(o, "m", "coding", "s2", later)
    assert fresh.samples == 0.0 and fresh.bonus == oc.OPTIMISM_BONUS


def test_artifact_revisions_are_bounded():
    o: oc.Outcomes = {}
    for i in range(20):
        oc.record(o, "m", "coding", f"sha{i}", ok=True, latency_seconds=1.0, evaluation=False, at=T0 + i)
    assert sorted(o["m"]["coding"]) == sorted(f"sha{i}" for i in range(16, 20))


def test_optimism_bonus_earns_a_canary_only_between_equals():
    equal = [
        profile("a", workload_scores={"research": 0.8}),
        profile("b", workload_scores={"research": 0.8}),
    ]
    # "a" is proven with 20 fresh successes; "b" is cold: the 6-point bonus ranks "b" first,
    # which earns "b" the single exploration canary while "a" keeps the demand.
    records = [auto("research", served="a") for _ in range(20)]
    s = fold(dm.initial(), at(0), records, frozenset({"a", "b"}))
    fc = forecast(s, equal, at(0, 50.0))
    w = wrow(fc, "research")
    assert (w.model_id, w.explore_model_id, w.exploring) == ("a", "b", True)
    assert [c.model_id for c in w.candidates] == ["b", "a"]
    assert w.candidates[0].bonus == pytest.approx(6.0) and w.candidates[1].bonus == pytest.approx(0.0, abs=1e-3)
    tb = target(fc, "b")
    assert (tb.replicas, tb.canary, tb.evidence, tb.reason) == (1, True, "inferred", "explore:research+canary")
    assert target(fc, "a").reason == "workload:research" and not target(fc, "a").canary
    # Ten suitability points outweigh the bonus.
    unequal = [profile("a", workload_scores={"research": 0.8}), profile("b", workload_scores={"research": 0.7})]
    fc = forecast(s, unequal, at(0, 50.0))
    assert wrow(fc, "research").model_id == "a" and wrow(fc, "research").explore_model_id is None
    assert target(fc, "b") is None


def test_only_one_exploration_canary_per_forecast():
    cat = [
        profile("a", workload_scores={"research": 0.8, "coding": 0.8}),
        profile("b", workload_scores={"research": 0.8}),
        profile("c", workload_scores={"coding": 0.8}),
    ]
    conf = frozenset({"a", "b", "c"})
    records = [auto("research", served="a") for _ in range(20)] + [auto("coding", served="a") for _ in range(30)]
    s = fold(dm.initial(), at(0), records, conf)
    fc = forecast(s, cat, at(0, 50.0))
    assert wrow(fc, "research").explore_model_id == "b" and wrow(fc, "coding").explore_model_id == "c"
    exploring = [w.workload for w in fc.workloads if w.exploring]
    assert exploring == ["coding"]  # the busier workload holds the budget
    assert target(fc, "c").canary and target(fc, "b") is None


def test_measured_failures_and_quality_move_the_choice():
    cat = [profile("a", workload_scores={"coding": 0.8}), profile("b", workload_scores={"coding": 0.75})]
    conf = frozenset({"a", "b"})
    bad = [auto("coding", served="a", outcome="error", status_code=500) for _ in range(20)]
    good = [auto("coding", served="b") for _ in range(20)]
    s = fold(dm.initial(), at(0), bad + good, conf)
    w = wrow(forecast(s, cat, at(0, 50.0)), "coding")
    assert w.model_id == "b"


def test_workload_and_direct_demand_stay_separate_series():
    s = fold(dm.initial(), at(0), [rec("coder") for _ in range(5)] + [auto("coding", served="coder")], CONF)
    assert s.models["coder"].by_index()[int(at(0) // 60)].count == 5
    assert s.workloads["coding"].by_index()[int(at(0) // 60)].count == 1
    r = row(forecast(s, catalog(), at(0, 50.0)), "coder")
    assert r.evidence == "direct"


def test_a_running_models_workload_scales_up_on_its_latest_minute():
    """Fast up, slow down: ten quiet minutes then a surge minute. The smoothed rate lags the
    surge (a lab image campaign lost minutes of work that way); a workload whose model already
    serves takes the latest complete minute and asks for more replicas. A model that is not
    running yet still starts from the smoothed rate, and once the surge passes the smoothed
    rate decides again."""
    s = dm.initial()
    for b in range(10):
        s = fold(s, at(b), [auto("coding", served="coder") for _ in range(10)], CONF)  # 0.33 offered
    s = fold(s, at(10), [auto("coding", served="coder") for _ in range(40)], CONF)  # 1.33 offered
    now = at(11, 0.0)
    running = forecast(s, catalog(), now, ready_replicas={"coder": 1})
    cold = forecast(s, catalog(), now, ready_replicas={})
    assert wrow(running, "coding").model_id == wrow(cold, "coding").model_id == "coder"
    assert wrow(running, "coding").observed_rate == pytest.approx(40 / 60.0)
    assert wrow(cold, "coding").observed_rate < 0.5 * 40 / 60.0
    assert target(running, "coder").replicas > target(cold, "coder").replicas
    # Quiet again: the latest minute is back to 10 requests and the smoothed rate decides.
    s = fold(s, at(11), [auto("coding", served="coder") for _ in range(10)], CONF)
    after = forecast(s, catalog(), at(12, 0.0), ready_replicas={"coder": 1})
    assert wrow(after, "coding").observed_rate < 40 / 60.0
