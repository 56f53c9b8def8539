"""The pure "loading" vs "cannot be placed" verdict."""

from __future__ import annotations

from grid.events.control import ModelProfile
from grid.events.host import CachedArtifact, HostResources
from grid.fleet import reasons as R
from grid.fleet.placeability import ARTIFACT_UNKNOWN, unplaceable
from grid.fleet.planning import ModelExplanation, Plan, Shortfall
from grid.fleet.views import HostView

NOW = 1000.0
SHA = "cd" * 32


def host(at: float = NOW - 1, cached: tuple[CachedArtifact, ...] = ()) -> HostView:
    return HostView(host_id="h", state="accepting", resources=HostResources(capacity_mb=1000), cached=cached,
                        heartbeat_at=at)


def plan(reason: str, placed: int = 0) -> Plan:
    return Plan(planner_version="t", inputs_digest="d", now=NOW,
                shortfalls=(Shortfall(model_id="m", wanted=1, placed=placed, reason=reason),),
                explanations=(ModelExplanation(model_id="m", wanted=1, rejected_counts={R.INSUFFICIENT_MEMORY: 1}),))


def test_artifact_unknown_only_with_a_fresh_fleet_that_lacks_it() -> None:
    ghost = ModelProfile(model_id="m", memory_mb=10)
    assert unplaceable(ghost, [host()], None, plan_current=False, now=NOW).reason == ARTIFACT_UNKNOWN  # type: ignore[union-attr]
    assert unplaceable(ghost, [], None, plan_current=False, now=NOW) is None  # nothing known yet
    assert unplaceable(ghost, [host(at=NOW - 3600)], None, plan_current=False, now=NOW) is None  # stale host
    by_id = host(cached=(CachedArtifact(model_id="m", sha256=SHA, size_bytes=1),))
    assert unplaceable(ghost, [by_id], None, plan_current=False, now=NOW) is None
    with_sha = ModelProfile(model_id="m", memory_mb=10, artifact_sha256=SHA.upper())
    assert unplaceable(with_sha, [by_id], None, plan_current=False, now=NOW) is None
    other = ModelProfile(model_id="m", memory_mb=10, artifact_sha256="ef" * 32)
    assert unplaceable(other, [by_id], None, plan_current=False, now=NOW).reason == ARTIFACT_UNKNOWN  # type: ignore[union-attr]
    sourced = ModelProfile(model_id="m", memory_mb=10, artifact_sha256="ef" * 32, artifact_source="hf://a/b/c.gguf",
                           artifact_size_mb=1)
    assert unplaceable(sourced, [by_id], None, plan_current=False, now=NOW) is None  # it can be fetched


def test_only_static_shortfalls_of_a_current_plan_count() -> None:
    p = ModelProfile(model_id="m", memory_mb=10, artifact_sha256=SHA)
    hosts = [host(cached=(CachedArtifact(model_id="x", sha256=SHA, size_bytes=1),))]
    verdict = unplaceable(p, hosts, plan(R.NO_ELIGIBLE_HOST), plan_current=True, now=NOW)
    assert verdict is not None and verdict.reason == R.NO_ELIGIBLE_HOST and "insufficient_memory on 1" in verdict.detail
    assert unplaceable(p, hosts, plan(R.NO_ELIGIBLE_HOST), plan_current=False, now=NOW) is None
    assert unplaceable(p, hosts, plan(R.PIN_UNSATISFIED), plan_current=True, now=NOW) is not None
    for dynamic in (R.INSUFFICIENT_MEMORY, R.PREEMPTION_STAGED, R.PLACEMENT_BUDGET, R.NOT_PLACED):
        assert unplaceable(p, hosts, plan(dynamic), plan_current=True, now=NOW) is None
    assert unplaceable(p, hosts, plan(R.NO_ELIGIBLE_HOST, placed=1), plan_current=True, now=NOW) is None
