"""Staged relocation: an incumbent moves make-before-break so a blocked replica fits.

The fleet of these tests: B (12 GB) runs only on llama.cpp hosts h1 and h2 and wants a second
replica; h1 already has B, h2 is full with A (12 GB); A also runs on h3 (vllm only), which is
empty. Before relocation B stayed at one replica for as long as A sat on h2.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from grid.fleet import reasons as R
from grid.fleet.planning import DemandTarget, Policy, encode_plan
from grid.planner.plan import build_plan, plan

from tests.unit.planner.builders import NOW, count, host, mk, on, prof, res, shortfall_reasons, want

OLD = NOW - 10_000
PROFILES = [
    prof("A", 12_000, runtimes=("llama.cpp", "vllm"), min_replicas=0, max_replicas=2),
    prof("B", 12_000, min_replicas=0, max_replicas=2),
]


def fleet(a_h2: str | None = "ready", a_h3: str | None = None, *, a_loaded: float = OLD):
    return [
        host("h1", 16_000, residencies=(res("B", 12_000, loaded_at=OLD),)),
        host("h2", 16_000, residencies=(res("A", 12_000, a_h2, loaded_at=a_loaded),) if a_h2 else ()),
        host("h3", 16_000, runtimes=("vllm",),
             residencies=(res("A", 12_000, a_h3, runtime="vllm", loaded_at=OLD),) if a_h3 else ()),
    ]


def demand(b_offered: float = 1.2, b_evidence: str = "direct"):
    return [want("A", 1, offered_concurrency=0.3), want("B", 2, b_evidence, offered_concurrency=b_offered)]


def test_an_incumbent_moves_make_before_break_and_the_blocked_replica_follows():
    # 1. Start: A's new copy goes to h3; A on h2 stays desired until it is ready there.
    p = plan(mk(PROFILES, fleet(), demand()))
    assert [(x.host_id, x.reason) for x in p.placements if x.model_id == "A"] == [
        ("h2", R.RETAINED_UNTIL_REPLACED), ("h3", R.RELOCATED)]
    assert p.preemptions == ()
    assert on(p, "B") == ["h1"] and shortfall_reasons(p, "B") == {R.RELOCATION_STAGED}
    # 2. A is loading on h3: the same course (the loading copy is kept, nothing drains yet).
    p = plan(mk(PROFILES, fleet(a_h3="loading"), demand()))
    assert on(p, "A", "existing") == ["h2", "h3"] and p.preemptions == ()
    assert shortfall_reasons(p, "B") == {R.RELOCATION_STAGED}
    # 3. A is ready on h3: the old copy drains as a relocation naming B.
    p = plan(mk(PROFILES, fleet(a_h3="ready"), demand()))
    assert on(p, "A") == ["h3"]
    assert [(x.host_id, x.victim_model, x.beneficiary_model, x.reason) for x in p.preemptions] == [
        ("h2", "A", "B", R.RELOCATION)]
    # 4. Draining: B waits for the memory; no second relocation.
    p = plan(mk(PROFILES, fleet(a_h2="draining", a_h3="ready"), demand()))
    assert p.preemptions == () and on(p, "A") == ["h3"]
    assert shortfall_reasons(p, "B") == {R.AWAITING_RELEASE}
    # 5. Memory free: B's second replica is placed on h2.
    p = plan(mk(PROFILES, fleet(a_h2=None, a_h3="ready"), demand()))
    assert on(p, "B") == ["h1", "h2"] and shortfall_reasons(p, "B") == set()


def test_the_indexed_search_and_the_reference_scan_agree():
    for hosts in (fleet(), fleet(a_h3="loading"), fleet(a_h3="ready")):
        inp = mk(PROFILES, hosts, demand())
        assert encode_plan(build_plan(inp, reference_scan=True)) == encode_plan(plan(inp))


def test_a_small_gain_does_not_buy_a_relocation():
    # B's second replica would carry min(0.7, 0.8 - 0.7) = 0.1 < 0.25 x 0.7 of offered concurrency.
    p = plan(mk(PROFILES, fleet(), demand(b_offered=0.8)))
    assert on(p, "A") == ["h2"] and p.preemptions == ()
    assert R.RELOCATION_STAGED not in shortfall_reasons(p, "B")


def test_prediction_alone_never_relocates_but_workload_demand_does():
    correlation = DemandTarget(model_id="B", replicas=2, evidence="inferred", offered_concurrency=1.2,
                               reason="correlation:A")
    p = plan(mk(PROFILES, fleet(), [want("A", 1, offered_concurrency=0.3), correlation]))
    assert on(p, "A") == ["h2"]
    workload = DemandTarget(model_id="B", replicas=2, evidence="inferred", offered_concurrency=1.2,
                            reason="workload:image")
    p = plan(mk(PROFILES, fleet(), [want("A", 1, offered_concurrency=0.3), workload]))
    assert on(p, "A") == ["h2", "h3"] and shortfall_reasons(p, "B") == {R.RELOCATION_STAGED}


def test_protected_and_more_important_incumbents_stay():
    # Inside its minimum residency (loaded a minute ago), pinned to its host, or more important.
    assert on(plan(mk(PROFILES, fleet(a_loaded=NOW - 60), demand())), "A") == ["h2"]
    pinned_here = [prof("A", 12_000, runtimes=("llama.cpp", "vllm"), min_replicas=0, pins=("h2",)), PROFILES[1]]
    more_important = [prof("A", 12_000, runtimes=("llama.cpp", "vllm"), min_replicas=0, priority=1), PROFILES[1]]
    for profiles in (pinned_here, more_important):
        p = plan(mk(profiles, fleet(), demand()))
        assert on(p, "A") == ["h2"] and count(p, "B") == 1


def test_no_destination_no_relocation():
    hosts = fleet()[:2] + [host("h3", 8_000, runtimes=("vllm",))]
    p = plan(mk(PROFILES, hosts, demand()))
    assert on(p, "A") == ["h2"] and p.preemptions == ()
    assert shortfall_reasons(p, "B") == {R.INSUFFICIENT_MEMORY}


A_STATES = [None, "loading", "warming", "ready", "draining"]


@settings(max_examples=200, deadline=None)
@given(
    a_h2=st.sampled_from(A_STATES), a_h3=st.sampled_from(A_STATES), b_h2=st.sampled_from([None, "loading", "ready"]),
    cap3=st.sampled_from([8_000, 16_000, 30_000]), a_mem=st.sampled_from([6_000, 12_000]),
    b_offered=st.sampled_from([0.0, 0.8, 1.2, 3.0]), a_wants=st.integers(1, 2), young=st.booleans(),
)
def test_relocation_states_never_break_a_replica_or_overcommit(a_h2, a_h3, b_h2, cap3, a_mem, b_offered, a_wants,
                                                                young):
    """Any mix of an in-progress relocation's copies: a drain only of a copy whose model is
    ready elsewhere, never a new copy where the old one stays, no host over its capacity, and
    the indexed and reference searches agree."""
    profiles = [prof("A", a_mem, runtimes=("llama.cpp", "vllm"), min_replicas=0, max_replicas=2),
                PROFILES[1]]
    loaded = NOW - 60 if young else OLD
    h2 = tuple(r for r in (
        res("A", a_mem, a_h2, loaded_at=loaded) if a_h2 else None,
        res("B", 12_000, b_h2, loaded_at=OLD) if b_h2 else None) if r is not None)
    hosts = [
        host("h1", 16_000, residencies=(res("B", 12_000, loaded_at=OLD),)),
        host("h2", 16_000, residencies=h2),
        host("h3", cap3, runtimes=("vllm",),
             residencies=(res("A", a_mem, a_h3, runtime="vllm", loaded_at=OLD),) if a_h3 else ()),
    ]
    inp = mk(profiles, hosts, [want("A", a_wants, offered_concurrency=0.3),
                               want("B", 2, offered_concurrency=b_offered)])
    p = plan(inp)
    assert encode_plan(build_plan(inp, reference_scan=True)) == encode_plan(p)
    ready = {(h.host_id, r.model_id) for h in hosts for r in h.residencies if r.state == "ready"}
    for pe in p.preemptions:
        assert pe.reason == R.RELOCATION
        assert any(x.model_id == pe.victim_model and x.host_id != pe.host_id and (x.host_id, x.model_id) in ready
                   for x in p.placements), pe
    caps = {h.host_id: h.resources.capacity_mb for h in hosts}
    for hid, cap in caps.items():
        # (a copy retained until its replacement is ready may be over: it is leaving)
        assert sum(x.memory_mb for x in p.placements
                   if x.host_id == hid and x.reason != R.RETAINED_UNTIL_REPLACED) <= cap
        mine = [x.model_id for x in p.placements if x.host_id == hid]
        assert len(mine) == len(set(mine))


def test_the_eviction_budget_bounds_relocations_too():
    p = plan(mk(PROFILES, fleet(), demand(), policy=Policy(max_evictions=0)))
    assert on(p, "A") == ["h2"] and p.preemptions == ()
    assert R.RELOCATION_STAGED not in shortfall_reasons(p, "B")
