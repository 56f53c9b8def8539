"""Predictive prefetch in the lab: the full day's campaign workflows, the scorecard and its gate."""

from __future__ import annotations

import msgspec
import pytest

from grid.events.commands import PREDICTIVE_PREFETCH
from grid.sim import graduate
from grid.sim.report import render
from grid.sim.run import run
from grid.sim.scenario import ScenarioConfig, prepare
from grid.sim.strategies import REACTIVE, SMART
from grid.sim.traffic import AUTO
from grid.sim.workday import FULL_DAY, FULL_DAY_MINUTES

FULL = ScenarioConfig(machines=4, models=8, users=50, minutes=FULL_DAY_MINUTES, seed=3, day=FULL_DAY)


@pytest.fixture(scope="module")
def full():
    return prepare(FULL)


def test_campaign_projects_are_image_then_video_under_their_own_key(full) -> None:
    campaign = {u for u, p in enumerate(full.users) if p.workflow}
    assert campaign
    by_key: dict[str, list] = {}
    for bucket in full.requests:
        for r in bucket:
            if r.user in campaign:
                by_key.setdefault(r.affinity, []).append(r)
    assert len(by_key) > 20
    for reqs in by_key.values():
        assert all(r.model == AUTO for r in reqs)
        assert [r.workload for r in reqs] in (["image", "video"], ["image"])
        if len(reqs) == 2:
            assert reqs[1].minute - reqs[0].minute == 2


@pytest.fixture(scope="module")
def days(full):  # type: ignore[no-untyped-def]
    loads: list[tuple[str, str, str]] = []
    warmed_advice: list[str] = []

    def on_tick(minute, pin, plan, result) -> None:  # type: ignore[no-untyped-def]
        placed = {(p.host_id, p.model_id) for p in plan.placements}
        for a in result.actions:
            if a.reason == PREDICTIVE_PREFETCH:
                if a.kind != "load" or (a.host_id, a.model_id) in placed:
                    warmed_advice.append(f"{a.kind} {a.model_id} on {a.host_id}")
                loads.append((a.host_id, a.model_id, a.artifact_sha256 or ""))

    smart = run(full, SMART, on_tick=on_tick).report()
    return smart, run(full, REACTIVE).report(), loads, warmed_advice


def test_smart_prefetches_and_a_later_placement_hits_the_cache_reactive_never_prefetches(days) -> None:
    smart, reactive, loads, warmed_advice = days
    assert smart.safety_violations == 0
    assert loads and smart.prefetch_downloads >= 1 and warmed_advice == []
    assert 1 <= smart.prefetch_hits <= smart.prefetch_downloads
    assert smart.avoided_load_seconds > 0 and smart.prefetch_lead_seconds > 0
    # Every download is accounted for: used by a placement, still unused on disk, or expired.
    assert smart.prefetch_unused == smart.prefetch_downloads - smart.prefetch_hits
    assert smart.prefetch_expired <= smart.prefetch_unused
    assert (reactive.prefetch_downloads, reactive.prefetch_hits, reactive.avoided_load_seconds) == (0, 0, 0.0)
    assert "predictive prefetch" in render(smart)


def _fleet(day: str, smart, reactive) -> graduate.FleetResult:  # type: ignore[no-untyped-def]
    return graduate.FleetResult(4, day, FULL_DAY_MINUTES, (3,), {SMART: (smart,), REACTIVE: (reactive,)}, None, True)


def test_the_startup_savings_gate_measures_savings_where_smart_prefetched(days) -> None:
    smart, reactive, _, _ = days
    gate = graduate.startup_savings_gate(_fleet(FULL_DAY, smart, reactive))
    assert gate.applies and gate.passed, gate.measured
    # Downloads nothing used: the gate fails (a predictor that only fills disk does not pass).
    unused = msgspec.structs.replace(smart, prefetch_hits=0, avoided_load_seconds=0.0)
    assert not graduate.startup_savings_gate(_fleet(FULL_DAY, unused, reactive)).passed
    # No prediction without a serving slot, so nothing downloaded: not applicable.
    none = msgspec.structs.replace(smart, prefetch_downloads=0, prefetch_hits=0, avoided_load_seconds=0.0)
    assert not graduate.startup_savings_gate(_fleet(FULL_DAY, none, reactive)).applies
