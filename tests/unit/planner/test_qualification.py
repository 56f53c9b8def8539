"""A profile that requires qualification places only on hosts with a passing qualification."""

from __future__ import annotations

import msgspec

from grid.events.codec import encode_value
from grid.fleet import reasons as R
from grid.fleet.qualification import qualified_hosts, why_not
from grid.fleet.views import QualificationView
from grid.planner.fleet_scan import placeable_models
from grid.planner.plan import plan

from .builders import NOW, count, explanation, host, mk, on, prof, res

SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
OTHER_SHA = "0" * 64


def qual(model: str = "m", *, passed: bool = True, sha: str | None = SHA, runtime: str = "llama.cpp",
         step: str | None = None) -> QualificationView:
    return QualificationView(runtime=runtime, model_id=model, artifact_sha256=sha, passed=passed,
                             failed_step=step, reason="" if passed else "inference_failed", recorded_at=NOW - 60)


def qualified(hid: str, *quals: QualificationView, **kw):
    return msgspec.structs.replace(host(hid, **kw), qualifications=quals)


def test_places_only_on_hosts_with_a_passing_qualification_for_the_model_and_digest():
    hosts = [
        host("h0"),  # never qualified
        qualified("h1", qual()),  # passed
        qualified("h2", qual(passed=False, step="inference")),  # failed
        qualified("h3", qual(sha=OTHER_SHA)),  # passed, on another artifact
        qualified("h4", qual(model="other")),  # passed, for another model
        qualified("h5", qual(runtime="vllm")),  # passed, on another runtime
        qualified("h6", qual()),  # passed
    ]
    p = plan(mk([prof("m", 2000, min_replicas=3, max_replicas=3, artifact_sha256=SHA, require_qualified=True)],
                hosts))
    assert on(p, "m") == ["h1", "h6"]
    e = explanation(p, "m")
    rejected = {v.host_id: v.reason for v in e.rejected}
    assert {h: rejected.get(h) for h in ("h0", "h2", "h3", "h4", "h5")} == dict.fromkeys(
        ("h0", "h2", "h3", "h4", "h5"), R.NOT_QUALIFIED)
    assert any(s.model_id == "m" and s.placed == 2 for s in p.shortfalls)


def test_no_qualified_host_places_nothing_and_says_why():
    p = plan(mk([prof("m", 2000, require_qualified=True)], [host("h0"), host("h1")]))
    assert count(p, "m") == 0
    assert {v.reason for v in explanation(p, "m").rejected} == {R.NOT_QUALIFIED}
    assert placeable_models([prof("m", 2000, require_qualified=True)], [host("h0")]) == frozenset()
    assert placeable_models([prof("m", 2000, require_qualified=True)], [qualified("h0", qual(sha=None))]) == {"m"}


def test_a_profile_without_a_digest_accepts_any_passing_qualification_of_the_model():
    hosts = [qualified("h1", qual(sha=OTHER_SHA)), host("h2")]
    assert qualified_hosts(prof("m", require_qualified=True), hosts) == {"h1"}
    assert qualified_hosts(prof("m"), hosts) is None
    assert "failed at inference" in why_not(qualified("h2", qual(passed=False, step="inference")),
                                            prof("m", require_qualified=True))


def test_an_incumbent_on_an_unqualified_host_moves_as_one_outside_an_allow_list_does():
    """Make before break: the replacement is placed on the qualified host while the incumbent
    keeps serving, exactly as for an incumbent outside an allow list."""
    hosts = [host("h0", residencies=(res("m", 2000),)), qualified("h1", qual(sha=None))]
    p = plan(mk([prof("m", 2000, require_qualified=True)], hosts))
    allowed = plan(mk([prof("m", 2000, allow_hosts=("h1",))], hosts))
    assert on(p, "m", "new") == on(allowed, "m", "new") == ["h1"]
    assert on(p, "m", "existing") == on(allowed, "m", "existing")


def test_without_the_flag_qualifications_change_nothing_and_plans_are_deterministic():
    hosts = [host("h0"), qualified("h1", qual(passed=False)), host("h2")]
    profiles = [prof("m", 2000, min_replicas=2, max_replicas=2)]
    bare = plan(mk(profiles, [host("h0"), host("h1"), host("h2")]))
    with_quals = plan(mk(profiles, hosts))
    assert on(bare, "m") == on(with_quals, "m")
    required = mk([prof("m", 2000, min_replicas=2, max_replicas=2, require_qualified=True)],
                  [qualified("h0", qual(sha=None)), host("h1"), qualified("h2", qual(sha=None))])
    assert encode_value(plan(required)) == encode_value(plan(required))
    assert on(plan(required), "m") == ["h0", "h2"]
