"""The full 8-hour lab day and the graduate matrix's churn baseline (issue 28, the lab part)."""

from __future__ import annotations

import pytest

from grid.controller import reconcile as rc
from grid.events.control import ProfileSet
from grid.sim import graduate
from grid.sim.report import to_json
from grid.sim.run import run
from grid.sim.scenario import ScenarioConfig, prepare
from grid.sim.strategies import GREEDY, SMART
from grid.sim.traffic import AUTO
from grid.sim.workday import FULL_DAY, FULL_DAY_MINUTES, LUNCH, OUTAGE, RAMP, SURGE

FULL = ScenarioConfig(machines=4, models=8, users=50, minutes=FULL_DAY_MINUTES, seed=3, day=FULL_DAY)


@pytest.fixture(scope="module")
def full():
    return prepare(FULL)


def test_the_full_day_has_its_phases_in_office_order_and_a_long_evening(full) -> None:
    phases = {p.name: p for p in full.day.phases}
    assert phases[RAMP].start == 0
    assert phases[RAMP].end <= phases[SURGE].start < phases[SURGE].end <= phases[LUNCH].start
    assert phases[LUNCH].end <= phases[OUTAGE].start
    # The evening is the last 1.5 of 8 hours, and demand falls in it for every workload.
    assert full.day.evening_start() == int(0.8125 * FULL_DAY_MINUTES)
    for curve in full.day.curves.values():
        assert max(curve[full.day.evening_start():]) < min(curve[phases[SURGE].start:phases[LUNCH].start])
    assert any(i.kind == OUTAGE for i in full.day.incidents)


def test_the_long_tail_names_its_models_briefly_and_all_day(full) -> None:
    image_minutes = sorted({r.minute for bucket in full.requests for r in bucket if r.model == "image-xl"})
    research_minutes = {r.minute for bucket in full.requests for r in bucket if r.model == "research-32b"}
    # The image model is named only in a short afternoon span (well under an hour and a half)...
    assert image_minutes and image_minutes[-1] - image_minutes[0] < 90
    assert image_minutes[0] > full.day.evening_start() // 2
    # ...the research model by a few users through the whole day.
    assert min(research_minutes) < 30 and max(research_minutes) > full.day.evening_start()
    tail = [p for p in full.users if p.name in ("illustrator", "scientist")]
    assert 0 < len(tail) < len(full.users) // 5
    assert len(full.users) == FULL.users
    assert any(r.model == AUTO for bucket in full.requests for r in bucket)


def test_the_full_day_is_deterministic_and_the_classic_day_has_no_long_tail(full) -> None:
    a = to_json(run(full, SMART).report())
    b = to_json(run(prepare(FULL), SMART).report())
    assert a == b
    classic = prepare(ScenarioConfig(machines=4, models=8, users=50, minutes=120, seed=3))
    assert classic.trace_digest != full.trace_digest
    assert not any(p.window for p in classic.users)
    assert {p.name for p in classic.users}.isdisjoint({"illustrator", "scientist"})


def test_greedy_is_fenced_by_minimum_residency_only() -> None:
    # The seed's lab: every strategy meets the reconciler's minimum-residency fence, while the
    # scale-down cooldown is smart's own policy. Greedy's drains are never held by the cooldown.
    sc = prepare(ScenarioConfig(machines=4, models=8, users=30, minutes=60, seed=2))
    for strategy, fenced_by_cooldown in ((GREEDY, False), (SMART, True)):
        cooldowns = []
        held: list[str] = []

        def on_event(stream, event) -> None:  # type: ignore[no-untyped-def]
            if isinstance(event, ProfileSet):
                cooldowns.append(event.profile.scale_down_cooldown_seconds)

        def on_tick(minute, pin, plan, result) -> None:  # type: ignore[no-untyped-def]
            held.extend(d.model_id for d in result.deferred if d.reason == rc.SCALE_DOWN_COOLDOWN)

        report = run(sc, strategy, on_tick=on_tick, on_event=on_event).report()
        assert cooldowns and all((c > 0) == fenced_by_cooldown for c in cooldowns), strategy
        if not fenced_by_cooldown:
            assert held == []
            assert report.drains > 0


def test_churn_after_first_starts_counts_re_placements_and_unloads_only() -> None:
    sc = prepare(ScenarioConfig(machines=4, models=8, users=30, minutes=60, seed=2))
    report = run(sc, GREEDY, timeline=True).report()
    warms = [line.split()[2:5:2] for line in report.timeline if line.split()[1] == "warm"]
    first = len({(host, model) for model, host in warms})
    assert report.churn == report.loads + report.unloads
    assert report.churn_excluding_first == report.churn - first
    assert 0 <= report.churn_excluding_first < report.churn


def test_seeds_parse_as_a_count_or_explicit_values() -> None:
    assert graduate.parse_seeds("3") == (1, 2, 3)
    assert graduate.parse_seeds("42,") == (42,)
    assert graduate.parse_seeds("7, 3-5,7") == (7, 3, 4, 5)
    assert graduate.parse_days("classic,full") == ("classic", "full")
    assert graduate.day_minutes("full", 30) == FULL_DAY_MINUTES and graduate.day_minutes("classic", 30) == 30
    for bad in ("0", "51", "5-3", "a,b", ","):
        with pytest.raises(ValueError):
            graduate.parse_seeds(bad)
