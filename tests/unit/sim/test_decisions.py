"""Issue 28 decision fixes, each with the example that failed before."""

from __future__ import annotations

import msgspec

from grid.controller import reconcile as rc
from grid.fleet.planning import ModelBasis, Shortfall
from grid.planner.plan import plan as planner_plan

from tests.unit.controller.ctlkit import NOW, History, host, mkplan, placement, profile, profiles, reasons, \
    reconcile_hosts, res
from tests.unit.planner import builders as pb


def _named_short(evidence: str, memory_mb: int):  # type: ignore[no-untyped-def]
    """A plan that keeps one `general` copy on h2 (the h1 copy is surplus) while `named` is short."""
    plan = mkplan(placement("general", "h2", status="existing", memory=6000), placement("embed", "h1", status="existing"),
                  shortfalls=[Shortfall(model_id="named", wanted=1, placed=0, reason="insufficient_memory")])
    plan = msgspec.structs.replace(plan, basis=(
        ModelBasis(model_id="general", evidence="direct", eligible_holders=("h1", "h2")),
        ModelBasis(model_id="named", evidence=evidence),
    ))
    profs = profiles(profile("general", memory_mb=6000, scale_down_cooldown_seconds=600.0),
                     profile("embed"), profile("named", memory_mb=memory_mb))
    # h1: 16 GB with the surplus general copy (used 30 s ago) and the embedder: 9 GB free.
    hosts = [host("h1", res("general", memory=6000, used_age=30), res("embed")),
             host("h2", res("general", memory=6000))]
    return reconcile_hosts(plan, hosts, History().state, profs, NOW)


def test_a_copy_held_only_by_the_cooldown_gives_way_to_short_named_demand() -> None:
    # 12 GB of named demand fits on h1 once the surplus general copy is gone. Before, the
    # scale-down cooldown kept that copy for ten minutes while the named model stayed short.
    r = _named_short("direct", 12_000)
    assert ("drain", "h1", "general") in [(a.kind, a.host_id, a.model_id) for a in r.actions]
    assert reasons(r).get(("drain", "h1", "general")) is None


def test_the_cooldown_still_holds_for_inferred_demand_or_demand_that_would_not_fit() -> None:
    assert reasons(_named_short("inferred", 12_000))[("drain", "h1", "general")] == rc.SCALE_DOWN_COOLDOWN
    # 16 GB would not fit on h1 even with the surplus copy gone: no point giving it up.
    assert reasons(_named_short("direct", 16_000))[("drain", "h1", "general")] == rc.SCALE_DOWN_COOLDOWN


def test_no_preemption_of_a_models_only_ready_replica_while_that_model_is_short() -> None:
    # `research` wants 3 replicas and has its one ready copy on the only host. Before, direct
    # demand for the higher-priority `image` staged a preemption of that only ready copy, and
    # `research` lost all service while short.
    old = pb.NOW - 10_000
    hosts = [pb.host("h1", 10_000, residencies=(pb.res("research", 8000, loaded_at=old),))]
    profiles = [pb.prof("research", 8000, priority=0, max_replicas=3), pb.prof("image", 8000, priority=5)]
    p = planner_plan(pb.mk(profiles, hosts, [pb.want("research", 3), pb.want("image", 1)]))
    assert [x.victim_model for x in p.preemptions] == []
    assert pb.on(p, "research") == ["h1"]
    assert pb.count(p, "image") == 0
    # Without a target of its own it is not short: the higher-priority model may take its place.
    p = planner_plan(pb.mk(profiles, hosts, [pb.want("image", 1)]))
    assert [x.victim_model for x in p.preemptions] == ["research"]


def _research_and_image(h2_state: str = "accepting", h2_heartbeat: float = pb.NOW - 1.0):  # type: ignore[no-untyped-def]
    """Two one-model hosts, each with a ready `research` copy; `research` wants 3 replicas and
    the higher-priority `image` has direct demand for 2."""
    old = pb.NOW - 10_000
    hosts = [pb.host("h1", 10_000, residencies=(pb.res("research", 8000, loaded_at=old),)),
             pb.host("h2", 10_000, state=h2_state, hb=h2_heartbeat,
                     residencies=(pb.res("research", 8000, loaded_at=old),))]
    profiles = [pb.prof("research", 8000, priority=0, max_replicas=3),
                pb.prof("image", 8000, priority=5, min_replicas=2, max_replicas=2)]
    return planner_plan(pb.mk(profiles, hosts, [pb.want("research", 3), pb.want("image", 2)]))


def test_one_plan_never_stages_both_of_a_short_models_last_two_ready_replicas() -> None:
    # Before, each victim set counted the other copy as a survivor: one plan staged the drain
    # of both `research` copies and left a model that wants 3 replicas with none.
    p = _research_and_image()
    assert [(x.host_id, x.victim_model) for x in p.preemptions] == [("h1", "research")]
    assert pb.on(p, "research") == ["h2"]


def test_a_copy_on_a_stale_or_draining_host_does_not_make_another_copy_a_victim() -> None:
    # The h2 copy is not coming back (an operator drain, or a heartbeat an hour old), so the h1
    # copy is the only one that keeps serving: before, both plans staged its preemption.
    for p in (_research_and_image(h2_state="draining"), _research_and_image(h2_heartbeat=pb.NOW - 3600)):
        assert [x.victim_model for x in p.preemptions] == []
        assert "h1" in pb.on(p, "research")
