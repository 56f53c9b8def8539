"""diff_plans: which placements, preemptions and shortfalls differ, with each side's explanation."""

from __future__ import annotations

from grid.fleet.planning import HostVerdict, ModelExplanation, Placement, Plan, Preemption, Shortfall
from replay.diff import describe, diff_plans


def _plan(placements=(), preemptions=(), shortfalls=(), explanations=()) -> Plan:
    return Plan(planner_version="v", inputs_digest="d", now=1.0, placements=tuple(placements),
                preemptions=tuple(preemptions), shortfalls=tuple(shortfalls), explanations=tuple(explanations))


def _pl(model: str, host: str, status: str = "existing", memory: int = 1000, reason: str = "") -> Placement:
    return Placement(model_id=model, host_id=host, runtime="llama.cpp", memory_mb=memory, status=status, reason=reason)


def test_identical_plans_have_no_differences() -> None:
    a = _plan([_pl("m", "h1"), _pl("m", "h2")], shortfalls=[Shortfall(model_id="x", wanted=2, placed=1, reason="capacity")])
    assert diff_plans(a, a) == []


def test_scores_and_reasons_alone_are_not_decisions() -> None:
    a = _plan([_pl("m", "h1", reason="sticky")])
    b = _plan([Placement(model_id="m", host_id="h1", runtime="llama.cpp", memory_mb=1000, status="existing",
                         score=55.0, reason="best_fit")])
    assert diff_plans(a, b) == []


def test_added_removed_changed_with_explanations() -> None:
    rec_exp = ModelExplanation(model_id="m", wanted=2, evidence="direct", eligible_hosts=("h1", "h2"),
                               chosen=(_pl("m", "h1"), _pl("m", "h2")))
    rep_exp = ModelExplanation(model_id="m", wanted=2, evidence="direct", eligible_hosts=("h1", "h3"),
                               rejected=(HostVerdict(host_id="h2", eligible=False, reason="insufficient_memory"),),
                               chosen=(_pl("m", "h1"), _pl("m", "h3")))
    recorded = _plan(
        [_pl("m", "h1"), _pl("m", "h2"), _pl("k", "h1", memory=500)],
        preemptions=[Preemption(host_id="h4", victim_model="low", beneficiary_model="m", reason="priority")],
        shortfalls=[Shortfall(model_id="z", wanted=1, placed=0, reason="capacity")],
        explanations=[rec_exp],
    )
    replayed = _plan(
        [_pl("m", "h1"), _pl("m", "h3", status="new"), _pl("k", "h1", memory=700)],
        shortfalls=[Shortfall(model_id="z", wanted=1, placed=0, reason="failure_domains")],
        explanations=[rep_exp],
    )
    diffs = {(d.kind, d.key): d for d in diff_plans(recorded, replayed)}
    assert set(diffs) == {
        ("placement", "k@h1"), ("placement", "m@h2"), ("placement", "m@h3"),
        ("preemption", "low@h4->m"), ("shortfall", "z"),
    }
    moved = diffs[("placement", "m@h2")]
    assert moved.change == "removed" and moved.recorded is not None and moved.replayed is None
    assert "h2 rejected: insufficient_memory" in moved.replayed_explanation
    assert "chosen h1,h2" in moved.recorded_explanation
    assert diffs[("placement", "m@h3")].change == "added"
    resized = diffs[("placement", "k@h1")]
    assert resized.change == "changed" and resized.fields == ("memory_mb",)
    assert describe(resized) == "memory_mb 500 -> 700"
    assert diffs[("preemption", "low@h4->m")].change == "removed"
    assert diffs[("shortfall", "z")].fields == ("reason",)


def test_two_replicas_on_one_host_are_distinct_items() -> None:
    a = _plan([_pl("m", "h1"), _pl("m", "h1")])
    b = _plan([_pl("m", "h1")])
    [d] = diff_plans(a, b)
    assert d.key == "m@h1#2" and d.change == "removed"
