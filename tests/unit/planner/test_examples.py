"""Worked examples from the seed's placement section."""

from __future__ import annotations

import hashlib

from grid.events.codec import encode_value
from grid.events.host import CachedArtifact
from grid.fleet import reasons as R
from grid.fleet.planning import PendingPlacement, Policy, TimingSample, decode_plan, encode_plan
from grid.planner.digest import inputs_digest
from grid.planner.explain import render_explanation
from grid.planner.plan import PLANNER_VERSION, build_plan, explain_model, plan

from .builders import (
    GB,
    NOW,
    count,
    explanation,
    host,
    mk,
    on,
    prof,
    res,
    shortfall_reasons,
    want,
)


def test_plan_identity_and_roundtrip():
    inp = mk(
        [prof("a", 4000, min_replicas=2, max_replicas=2)], [host("h1"), host("h2")]
    )
    p = plan(inp)
    assert p.planner_version == PLANNER_VERSION
    assert (
        p.inputs_digest
        == hashlib.sha256(encode_value(inp)).hexdigest()
        == inputs_digest(inp)
    )
    b = encode_plan(p)
    assert encode_plan(plan(inp)) == b
    assert decode_plan(b) == p
    assert p.now == NOW


def test_max_min_fair_among_equal_priority_models():
    # Five 4 GB slots (two hosts of 10 GB hold two each, one of 5 GB holds one) and four
    # equal models that each want three replicas: everyone gets one before anyone gets two.
    hosts = [
        host("h1", 10_000, domain="a"),
        host("h2", 10_000, domain="b"),
        host("h3", 5_000, domain="c"),
    ]
    profiles = [
        prof(m, 4000, min_replicas=0, max_replicas=3) for m in ("m1", "m2", "m3", "m4")
    ]
    demand = [want(m, 3) for m in ("m1", "m2", "m3", "m4")]
    p = plan(
        mk(profiles, hosts, demand, policy=Policy(admission_headroom_fraction=0.0))
    )
    counts = sorted(count(p, m) for m in ("m1", "m2", "m3", "m4"))
    assert counts == [1, 1, 1, 2]
    assert sum(counts) == 5


def test_partial_round_goes_to_greater_harm_not_model_id():
    hosts = [host("h1", 8_000), host("h2", 4_000)]
    profiles = [
        prof("aaa", 4000, min_replicas=0, max_replicas=2),
        prof("zzz", 4000, min_replicas=0, max_replicas=2),
    ]
    pol = Policy(admission_headroom_fraction=0.0)
    p = plan(
        mk(
            profiles,
            hosts,
            [want("aaa", 2, queue=1), want("zzz", 2, queue=5)],
            policy=pol,
        )
    )
    assert (count(p, "aaa"), count(p, "zzz")) == (1, 2)
    # Rename: the scarce slot follows the harm, not the id.
    p = plan(
        mk(
            profiles,
            hosts,
            [want("aaa", 2, queue=5), want("zzz", 2, queue=1)],
            policy=pol,
        )
    )
    assert (count(p, "aaa"), count(p, "zzz")) == (2, 1)


def test_baseline_then_direct_then_inferred_within_a_class():
    hosts = [host("h1", 8_000)]
    profiles = [
        prof("a-inferred", 4000, min_replicas=0),
        prof("b-direct", 4000, min_replicas=0),
        prof("c-base", 4000, min_replicas=1),
    ]
    pol = Policy(admission_headroom_fraction=0.0)
    p = plan(
        mk(
            profiles,
            hosts,
            [want("a-inferred", 1, "inferred"), want("b-direct", 1, "direct")],
            policy=pol,
        )
    )
    assert on(p, "c-base") == ["h1"] and on(p, "b-direct") == ["h1"]
    assert count(p, "a-inferred") == 0


def test_higher_priority_classes_fill_first():
    hosts = [host("h1", 8_000)]
    profiles = [prof("aaa", 6000, priority=0), prof("zzz", 6000, priority=5)]
    p = plan(mk(profiles, hosts))
    assert on(p, "zzz") == ["h1"] and count(p, "aaa") == 0


def test_higher_priority_preempts_lower_with_staged_drain():
    old = NOW - 10_000
    h = host("h1", 10_000, residencies=(res("low", 8000, loaded_at=old),))
    profiles = [prof("low", 8000, priority=0), prof("high", 8000, priority=5)]
    p = plan(mk(profiles, [h]))
    assert [
        (x.host_id, x.victim_model, x.beneficiary_model, x.reason)
        for x in p.preemptions
    ] == [("h1", "low", "high", R.PRIORITY_PREEMPTION)]
    assert p.preemptions[0].priority == 5
    # The beneficiary is not placed until a later snapshot proves the memory free.
    assert count(p, "high") == 0 and count(p, "low") == 0
    assert R.PREEMPTION_STAGED in shortfall_reasons(p, "high")
    # Later heartbeat: the victim is draining -> still waiting, no second eviction.
    h2 = host(
        "h1", 10_000, residencies=(res("low", 8000, state="draining", loaded_at=old),)
    )
    p2 = plan(mk(profiles, [h2]))
    assert not p2.preemptions and count(p2, "high") == 0
    assert R.AWAITING_RELEASE in shortfall_reasons(p2, "high")
    # Memory proven free: the beneficiary is placed.
    p3 = plan(mk(profiles, [host("h1", 10_000)]))
    assert on(p3, "high") == ["h1"] and count(p3, "low") == 0


def test_inferred_demand_never_preempts():
    h = host("h1", 10_000, residencies=(res("low", 8000),))
    profiles = [
        prof("low", 8000, priority=0),
        prof("high", 8000, priority=5, min_replicas=0),
    ]
    p = plan(mk(profiles, [h], [want("high", 1, "inferred")]))
    assert not p.preemptions
    assert on(p, "low") == ["h1"]
    assert count(p, "high") == 0
    assert shortfall_reasons(p, "high") == {R.INSUFFICIENT_MEMORY}
    # Direct evidence of the same size does preempt.
    p = plan(mk(profiles, [h], [want("high", 1, "direct")]))
    assert [x.victim_model for x in p.preemptions] == ["low"]


def test_protected_work_is_never_a_victim():
    profiles = [
        prof("low", 8000, priority=0, min_residency_seconds=600),
        prof("high", 8000, priority=5),
    ]
    cases = {
        "external": res("low", 8000, managed=False),
        "operator-pinned": res("low", 8000, pinned=True),
        "min-residency": res("low", 8000, loaded_at=NOW - 60),
    }
    for name, r in cases.items():
        p = plan(mk(profiles, [host("h1", 10_000, residencies=(r,))]))
        assert not p.preemptions, name
        assert count(p, "high") == 0, name
    # A victim pinned by its own profile to this host is not preempted either.
    pinned = [
        prof("low", 8000, priority=0, pins=("h1",)),
        prof("high", 8000, priority=5),
    ]
    p = plan(mk(pinned, [host("h1", 10_000, residencies=(res("low", 8000),))]))
    assert not p.preemptions


def test_equal_priority_never_preempts():
    profiles = [prof("a", 8000), prof("b", 8000)]
    p = plan(mk(profiles, [host("h1", 10_000, residencies=(res("a", 8000),))]))
    assert not p.preemptions and on(p, "a") == ["h1"]


def test_preemption_prefers_idle_and_cheap_victims():
    old = NOW - 10_000
    hosts = [
        host(
            "h1",
            10_000,
            residencies=(res("busy", 8000, active_requests=3, loaded_at=old),),
        ),
        host(
            "h2",
            10_000,
            residencies=(res("idle", 8000, active_requests=0, loaded_at=old),),
        ),
    ]
    profiles = [prof("busy", 8000), prof("idle", 8000), prof("vip", 8000, priority=9)]
    p = plan(mk(profiles, hosts))
    assert [(x.host_id, x.victim_model) for x in p.preemptions] == [("h2", "idle")]
    # Among idle victims, the lowest learned warm-back cost goes first.
    hosts = [
        host("h1", 10_000, residencies=(res("slow", 8000, loaded_at=old),)),
        host("h2", 10_000, residencies=(res("fast", 8000, loaded_at=old),)),
    ]
    profiles = [
        prof("slow", 8000, load_seconds=300),
        prof("fast", 8000, load_seconds=5),
        prof("vip", 8000, priority=9),
    ]
    p = plan(mk(profiles, hosts))
    assert [(x.host_id, x.victim_model) for x in p.preemptions] == [("h2", "fast")]


def test_lowest_priority_sufficient_victim_set():
    old = NOW - 10_000
    hosts = [
        host("h1", 10_000, residencies=(res("p1", 8000, loaded_at=old),)),
        host("h2", 10_000, residencies=(res("p3", 8000, loaded_at=old),)),
    ]
    profiles = [
        prof("p1", 8000, priority=1),
        prof("p3", 8000, priority=3),
        prof("vip", 8000, priority=9),
    ]
    p = plan(mk(profiles, hosts))
    assert [(x.host_id, x.victim_model) for x in p.preemptions] == [("h1", "p1")]
    # The evicted model then looks for another home; it cannot take p3's slot (higher priority).
    assert count(p, "p1") == 0 and on(p, "p3") == ["h2"]


def test_eviction_budget_bounds_each_plan():
    old = NOW - 10_000
    hosts = [
        host(f"h{i}", 10_000, residencies=(res(f"low{i}", 8000, loaded_at=old),))
        for i in range(3)
    ]
    profiles = [prof(f"low{i}", 8000) for i in range(3)] + [
        prof("vip", 8000, priority=9, min_replicas=3, max_replicas=3)
    ]
    p = plan(mk(profiles, hosts, policy=Policy(max_evictions=2)))
    assert len(p.preemptions) == 2
    assert R.EVICTION_BUDGET in shortfall_reasons(p, "vip")
    assert R.PREEMPTION_STAGED in shortfall_reasons(p, "vip")


def test_model_ceiling_lowered_below_live_inventory_converges():
    h = host("h1", 32_000, limit=1, residencies=(res("a", 4000), res("b", 4000)))
    profiles = [prof("a", 4000, priority=1), prof("b", 4000, priority=0)]
    p = plan(mk(profiles, [h]))
    assert on(p, "a") == ["h1"] and count(p, "b") == 0
    assert [(x.victim_model, x.beneficiary_model, x.reason) for x in p.preemptions] == [
        ("b", "a", R.MODEL_LIMIT_CONVERGENCE)
    ]
    # Beyond the eviction budget the violation is kept and reported, converging later.
    p = plan(mk(profiles, [h], policy=Policy(max_evictions=0)))
    assert on(p, "b") == ["h1"] and not p.preemptions
    assert R.EVICTION_BUDGET in shortfall_reasons(p, "b")


def test_tightened_colocation_converges_with_residency_fence():
    h = host(
        "h1", 32_000, residencies=(res("a", 4000), res("b", 4000, loaded_at=NOW - 100))
    )
    profiles = [
        prof("a", 4000, priority=1, max_colocated_models=1),
        prof("b", 4000, min_residency_seconds=300),
    ]
    p = plan(mk(profiles, [h]))
    assert on(p, "a") == ["h1"]
    (pe,) = p.preemptions
    assert (pe.victim_model, pe.beneficiary_model, pe.reason) == (
        "b",
        "a",
        R.COLOCATION_CONVERGENCE,
    )
    assert pe.not_before == NOW - 100 + 300


def test_pins_reserved_first_and_exact():
    hosts = [host("big", 64_000, domain="a"), host("small", 8_000, domain="b")]
    profiles = [
        prof("pinned", 6000, pins=("small",), priority=0),
        prof("vip", 6000, priority=9),
    ]
    p = plan(mk(profiles, hosts))
    assert on(p, "pinned") == ["small"]
    assert next(x for x in p.placements if x.model_id == "pinned").reason == R.PIN
    assert on(p, "vip") == ["big"]


def test_pin_on_unavailable_host_is_a_shortfall():
    hosts = [host("h1"), host("h2", state="paused")]
    p = plan(mk([prof("m", 4000, pins=("h2", "ghost"))], hosts))
    assert count(p, "m") == 0
    details = sorted(s.detail for s in p.shortfalls if s.reason == R.PIN_UNSATISFIED)
    assert details[0].startswith("ghost: " + R.UNKNOWN_HOST)
    assert details[1].startswith("h2: " + R.HOST_NOT_ELIGIBLE_STATE)


def test_missing_pin_preempts_only_on_its_exact_host():
    old = NOW - 10_000
    hosts = [
        host("h1", 10_000, residencies=(res("low1", 8000, loaded_at=old),)),
        host("h2", 10_000, residencies=(res("low2", 8000, loaded_at=old),)),
    ]
    profiles = [
        prof("low1", 8000),
        prof("low2", 8000),
        prof("pinned", 8000, pins=("h2",), priority=3),
    ]
    p = plan(mk(profiles, hosts))
    assert [(x.host_id, x.victim_model) for x in p.preemptions] == [("h2", "low2")]


def test_failure_domain_spread_and_shortfall():
    hosts = [host("a1", domain="a"), host("a2", domain="a"), host("b1", domain="b")]
    p = plan(
        mk(
            [prof("m", 4000, min_replicas=2, max_replicas=2, min_failure_domains=2)],
            hosts,
        )
    )
    assert on(p, "m") in (["a1", "b1"], ["a2", "b1"])
    # Only one domain feasible: replicas still placed, the spread shortfall is reported.
    hosts = [
        host("a1", domain="a"),
        host("a2", domain="a"),
        host("b1", domain="b", state="paused"),
    ]
    p = plan(
        mk(
            [prof("m", 4000, min_replicas=2, max_replicas=2, min_failure_domains=2)],
            hosts,
        )
    )
    assert on(p, "m") == ["a1", "a2"]
    assert shortfall_reasons(p, "m") == {R.FAILURE_DOMAIN}


def test_domain_spread_moves_a_clustered_incumbent_make_before_break():
    hosts = [
        host("a1", domain="a", residencies=(res("m", 4000),)),
        host("a2", domain="a", residencies=(res("m", 4000),)),
        host("b1", domain="b"),
    ]
    profile = prof("m", 4000, min_replicas=2, max_replicas=2, min_failure_domains=2)
    p = plan(mk([profile], hosts))
    statuses = {(x.host_id, x.status, x.reason) for x in p.placements}
    assert ("b1", "new", R.BASELINE) in statuses
    assert ("a1", "existing", R.INCUMBENT) in statuses
    assert ("a2", "existing", R.RETAINED_UNTIL_REPLACED) in statuses
    # Replacement ready: the clustered copy is no longer desired.
    hosts[2] = host("b1", domain="b", residencies=(res("m", 4000),))
    p = plan(mk([profile], hosts))
    assert on(p, "m") == ["a1", "b1"] and not p.shortfalls


def test_throttled_host_offers_its_fraction():
    hosts = [host("h1", 16_000, state="throttled", throttle=0.5)]
    assert count(plan(mk([prof("m", 7000)], hosts)), "m") == 1
    assert count(plan(mk([prof("m", 9000)], hosts)), "m") == 0
    # Throttling lowers a candidate's score.
    hosts = [host("h1", 16_000, state="throttled"), host("h2", 16_000)]
    assert on(plan(mk([prof("m", 4000)], hosts)), "m") == ["h2"]


def test_throttled_over_capacity_incumbent_moves_make_before_break():
    profile = prof("m", 10_000)
    hosts = [
        host("h1", 16_000, state="throttled", residencies=(res("m", 10_000),)),
        host("h2", 16_000),
    ]
    p = plan(mk([profile], hosts))
    assert {(x.host_id, x.status, x.reason) for x in p.placements} == {
        ("h1", "existing", R.RETAINED_UNTIL_REPLACED),
        ("h2", "new", R.BASELINE),
    }
    assert not p.shortfalls
    # Replacement still warming: the old copy stays.
    hosts[1] = host(
        "h2", 16_000, residencies=(res("m", 10_000, state="warming", loaded_at=None),)
    )
    p = plan(mk([profile], hosts))
    assert on(p, "m") == ["h1", "h2"]
    # Replacement ready: old copy dropped (obsolete -> the reconciler drains it).
    hosts[1] = host("h2", 16_000, residencies=(res("m", 10_000),))
    p = plan(mk([profile], hosts))
    assert on(p, "m") == ["h2"]


def test_an_incumbent_is_charged_what_its_profile_declares_now():
    # The copy on h1 loaded when the model was declared 512 MB; the operator has since declared
    # it 200 MB. A busy (throttled) h1 offers 512 MB, 472 after other processes: the copy fits
    # the declaration in force and stays (charged at that declaration, it once moved to h2).
    hosts = [
        host("h1", 1_024, state="throttled", unmanaged=40, residencies=(res("m", 512),)),
        host("h2", 5_120),
    ]
    p = plan(mk([prof("m", 200)], hosts))
    assert [(x.host_id, x.status, x.reason, x.memory_mb) for x in p.placements] == [
        ("h1", "existing", R.INCUMBENT, 200)
    ]
    # Raised beyond what h1 offers, the declaration moves it (make-before-break).
    p = plan(mk([prof("m", 600)], hosts))
    assert {(x.host_id, x.status, x.reason) for x in p.placements} == {
        ("h1", "existing", R.RETAINED_UNTIL_REPLACED),
        ("h2", "new", R.BASELINE),
    }
    # What the process was admitted with still counts as live memory: nothing new fits beside
    # it on h1 (472 - 512 < 0), whatever the declaration.
    p = plan(mk([prof("m", 200), prof("n", 100)], hosts[:1]))
    assert on(p, "m") == ["h1"] and on(p, "n") == []


def test_incumbent_kept_in_residency_rank_order():
    # Three live copies of a one-replica model: the most useful copy (ready, then warming,
    # then loading: grid.fleet.RESIDENCY_STATE_RANK) is kept whatever its host id.
    copies = {"h1": "loading", "h2": "warming", "h3": "ready"}
    hosts = [host(h, residencies=(res("m", 4000, state=s),)) for h, s in copies.items()]
    p = plan(mk([prof("m", 4000)], hosts))
    assert [(x.host_id, x.reason) for x in p.placements] == [("h3", R.INCUMBENT)]
    hosts[2] = host("h3")
    p = plan(mk([prof("m", 4000)], hosts))
    assert [(x.host_id, x.reason) for x in p.placements] == [("h2", R.INCUMBENT)]


def test_duplicate_residencies_on_one_host_described_by_the_most_useful():
    dup = (res("m", 4000, state="loading"), res("m", 4000, state="ready"))
    p = plan(mk([prof("m", 4000)], [host("h1", residencies=dup)]))
    (kept,) = p.placements
    assert kept.reason == R.INCUMBENT and kept.scores["resident"] == 100.0


def test_last_replica_preserved_and_reported_without_peer():
    p = plan(
        mk(
            [prof("m", 10_000)],
            [host("h1", 16_000, state="throttled", residencies=(res("m", 10_000),))],
        )
    )
    assert [(x.host_id, x.reason) for x in p.placements] == [
        ("h1", R.RETAINED_UNTIL_REPLACED)
    ]
    assert R.RETAINED_NONCOMPLIANT in shortfall_reasons(p, "m")


def test_healthy_incumbents_keep_their_slot():
    # A much faster empty host does not cause a migration.
    hosts = [
        host("slow", 16_000, bw=100, residencies=(res("m", 4000),)),
        host("fast", 64_000, bw=800),
    ]
    p = plan(mk([prof("m", 4000)], hosts, [want("m", 1, offered_concurrency=50.0)]))
    assert [(x.host_id, x.status) for x in p.placements] == [("slow", "existing")]


def test_incumbent_on_ineligible_host_is_replaced():
    hosts = [host("h1", state="paused", residencies=(res("m", 4000),)), host("h2")]
    p = plan(mk([prof("m", 4000)], hosts))
    assert [(x.host_id, x.status) for x in p.placements] == [("h2", "new")]


def test_reciprocal_colocation():
    # 'solo' wants exclusive serving: nothing joins it, and it joins nothing.
    hosts = [
        host("h1", 32_000, residencies=(res("solo", 4000),)),
        host("h2", 32_000, residencies=(res("other", 4000),)),
    ]
    profiles = [
        prof("solo", 4000, max_colocated_models=1),
        prof("other", 4000),
        prof("new", 4000),
    ]
    p = plan(mk(profiles, hosts))
    assert on(p, "new") == ["h2"]
    hosts = [host("h1", 32_000, residencies=(res("other", 4000),)), host("h2", 32_000)]
    p = plan(
        mk([prof("other", 4000), prof("solo", 4000, max_colocated_models=1)], hosts)
    )
    assert on(p, "solo") == ["h2"]
    # An exclusion declared by one profile binds both placement orders.
    hosts = [host("h1", 32_000, residencies=(res("x", 4000),)), host("h2", 8_000)]
    p = plan(mk([prof("x", 4000), prof("y", 4000, colocation_excludes=("x",))], hosts))
    assert on(p, "y") == ["h2"]
    hosts = [host("h1", 32_000, residencies=(res("y", 4000),)), host("h2", 8_000)]
    p = plan(
        mk(
            [
                prof("x", 4000, min_replicas=1),
                prof("y", 4000, colocation_excludes=("x",)),
            ],
            hosts,
        )
    )
    assert on(p, "x") == ["h2"]


def test_disk_ledger_is_cumulative():
    # 9 GB free, 1 GB reserve: two 5 GB artifacts fit independently but not together.
    hosts = [host("h1", 64_000, disk_free=9 * GB)]
    profiles = [
        prof("a", 4000, artifact_size_mb=5 * 1024, artifact_sha256="a" * 64),
        prof("b", 4000, artifact_size_mb=5 * 1024, artifact_sha256="b" * 64),
    ]
    p = plan(mk(profiles, hosts))
    assert count(p, "a") + count(p, "b") == 1
    loser = "a" if count(p, "b") else "b"
    assert shortfall_reasons(p, loser) == {R.INSUFFICIENT_DISK}


def test_predictive_transfer_keeps_the_larger_disk_reserve():
    hosts = [host("h1", 64_000, disk_free=6 * GB)]
    prof_a = prof(
        "a", 4000, min_replicas=0, artifact_size_mb=2048, artifact_sha256="a" * 64
    )
    assert count(plan(mk([prof_a], hosts, [want("a", 1, "direct")])), "a") == 1
    p = plan(mk([prof_a], hosts, [want("a", 1, "inferred")]))
    assert count(p, "a") == 0
    assert shortfall_reasons(p, "a") == {R.INSUFFICIENT_DISK}


def test_cached_artifact_pays_nothing():
    sha = "c" * 64
    hosts = [
        host(
            "h1",
            64_000,
            disk_free=2 * GB,
            cached=(CachedArtifact(model_id="a", sha256=sha, size_bytes=5 * GB),),
        )
    ]
    profiles = [
        prof("a", 4000, artifact_size_mb=5 * 1024, artifact_sha256=sha),
        prof("b", 4000, artifact_size_mb=512, artifact_sha256="d" * 64),
    ]
    p = plan(mk(profiles, hosts))
    assert on(p, "a") == ["h1"] and on(p, "b") == ["h1"]
    # A different revision is not the exact artifact.
    hosts = [
        host(
            "h1",
            64_000,
            disk_free=2 * GB,
            cached=(CachedArtifact(model_id="a", sha256="e" * 64, size_bytes=5 * GB),),
        )
    ]
    assert count(plan(mk(profiles[:1], hosts)), "a") == 0


def test_cached_weights_preferred_at_light_demand():
    sha = "c" * 64
    hosts = [
        host("cold-fast", 64_000, bw=900, gflops=900),
        host(
            "warm-slow",
            64_000,
            bw=100,
            gflops=100,
            cached=(CachedArtifact(model_id="m", sha256=sha, size_bytes=GB),),
        ),
    ]
    p = plan(mk([prof("m", 4000, artifact_sha256=sha)], hosts))
    assert on(p, "m") == ["warm-slow"]


def test_hot_demand_amortizes_a_measured_faster_host():
    sha = "c" * 64
    hosts = [
        host("fast", 64_000, tps={"m": 200.0}),
        host(
            "cached",
            64_000,
            tps={"m": 20.0},
            cached=(CachedArtifact(model_id="m", sha256=sha, size_bytes=GB),),
        ),
    ]
    light = plan(
        mk(
            [prof("m", 4000, artifact_sha256=sha)],
            hosts,
            [want("m", 1, offered_concurrency=0.5)],
        )
    )
    assert on(light, "m") == ["cached"]
    hot = plan(
        mk(
            [prof("m", 4000, artifact_sha256=sha)],
            hosts,
            [want("m", 1, offered_concurrency=100.0)],
        )
    )
    assert on(hot, "m") == ["fast"]


def test_learned_startup_time_breaks_ties():
    hosts = [host("h1"), host("h2")]
    timings = (
        TimingSample(
            host_id="h1", model_id="m", load_seconds=200.0, warm_seconds=60.0, samples=8
        ),
        TimingSample(
            host_id="h2", model_id="m", load_seconds=5.0, warm_seconds=2.0, samples=8
        ),
    )
    p = plan(mk([prof("m", 4000)], hosts, timings=timings))
    assert on(p, "m") == ["h2"]


def test_stale_and_future_heartbeats_get_nothing():
    hosts = [
        host("stale", hb=NOW - 500),
        host("future", hb=NOW + 60),
        host("silent", hb=None),
    ]
    p = plan(mk([prof("m", 4000)], hosts))
    assert count(p, "m") == 0
    assert explanation(p, "m").rejected_counts == {
        R.HEARTBEAT_FUTURE: 1,
        R.HEARTBEAT_MISSING: 1,
        R.HEARTBEAT_STALE: 1,
    }


def test_runtime_memory_uses_largest_matching_estimate():
    profile = prof(
        "m",
        4000,
        runtimes=("llama.cpp", "vllm", "mlx"),
        runtime_memory_mb={"llama.cpp": 5000, "vllm": 9000, "mlx": 20000},
    )
    p = plan(mk([profile], [host("h1", 32_000, runtimes=("llama.cpp", "vllm"))]))
    (pl,) = p.placements
    assert (pl.runtime, pl.memory_mb) == ("vllm", 9000)
    # The largest matching estimate must fit.
    p = plan(mk([profile], [host("h1", 8_000, runtimes=("llama.cpp", "vllm"))]))
    assert count(p, "m") == 0
    p = plan(mk([profile], [host("h1", 8_000, runtimes=("llama.cpp",))]))
    assert [(x.runtime, x.memory_mb) for x in p.placements] == [("llama.cpp", 5000)]


def test_retired_models_want_zero():
    hosts = [host("h1", residencies=(res("m", 4000),))]
    p = plan(
        mk(
            [prof("m", 4000, min_replicas=2, max_replicas=2)],
            hosts,
            [want("m", 2)],
            retired=("m",),
        )
    )
    assert count(p, "m") == 0 and not p.shortfalls
    assert explanation(p, "m").wanted == 0


def test_desired_replicas_clamp():
    hosts = [host(f"h{i}") for i in range(6)]
    p = plan(
        mk([prof("m", 1000, min_replicas=1, max_replicas=3)], hosts, [want("m", 10)])
    )
    assert count(p, "m") == 3
    p = plan(
        mk([prof("m", 1000, min_replicas=2, max_replicas=3)], hosts, [want("m", 0)])
    )
    assert count(p, "m") == 2


def test_bounded_repair_fixes_greedy_fragmentation():
    # 'x' (baseline) prefers the idle host a; 'y' (direct demand) then needs all of a.
    hosts = [host("a", 10_000), host("b", 10_000, unmanaged=3000, queue=50)]
    profiles = [prof("x", 6000), prof("y", 10_000, min_replicas=0)]
    pol = Policy(admission_headroom_fraction=0.0)
    p = plan(mk(profiles, hosts, [want("y", 1)], policy=pol))
    assert on(p, "y") == ["a"] and on(p, "x") == ["b"]
    assert next(x for x in p.placements if x.model_id == "x").reason == R.REPAIRED
    # Without a repair budget the greedy result stands and the shortfall is honest.
    p = plan(
        mk(
            profiles,
            hosts,
            [want("y", 1)],
            policy=Policy(admission_headroom_fraction=0.0, max_repair_steps=0),
        )
    )
    assert on(p, "x") == ["a"] and count(p, "y") == 0
    assert shortfall_reasons(p, "y") == {R.INSUFFICIENT_MEMORY}


def test_repair_lower_bound_fails_fast_on_saturated_fleet():
    from grid.planner.placement import Placer

    hosts = [host(f"h{i}", 8_000) for i in range(8)]
    profiles = [prof(f"m{i}", 4000, min_replicas=0, max_replicas=4) for i in range(6)]
    inp = mk(
        profiles,
        hosts,
        [want(f"m{i}", 4) for i in range(6)],
        policy=Policy(admission_headroom_fraction=0.0),
    )
    placer = Placer(inp)
    placer.run()
    assert sum(len(ms.entries) for ms in placer.models) == 16
    assert placer.ledger.repair_steps == 0


def test_placement_budget_is_reported():
    hosts = [host(f"h{i}") for i in range(4)]
    p = plan(
        mk(
            [prof("a", 1000, min_replicas=3, max_replicas=3)],
            hosts,
            policy=Policy(max_new_placements=2),
        )
    )
    assert count(p, "a") == 2
    assert shortfall_reasons(p, "a") == {R.PLACEMENT_BUDGET}


def test_explanations_cover_every_model_and_render():
    hosts = [
        host("h1", 8_000, tags=("gpu",)),
        host("h2", 8_000, state="paused"),
        host("h3", 2_000),
    ]
    profiles = [
        prof("a", 4000, required_tags=("gpu",)),
        prof("idle", 4000, min_replicas=0),
        prof("big", 9000),
    ]
    p = plan(mk(profiles, hosts))
    assert [e.model_id for e in p.explanations] == ["a", "big", "idle"]
    a = explanation(p, "a")
    assert a.eligible_hosts == ("h1",)
    assert a.rejected_counts == {
        R.HOST_NOT_ELIGIBLE_STATE: 1,
        R.MISSING_REQUIRED_TAG: 1,
    }
    assert a.chosen[0].host_id == "h1" and a.chosen[0].scores
    big = explanation(p, "big")
    assert big.shortfall_reason == R.NO_ELIGIBLE_HOST
    lines = render_explanation(p)
    assert any(line.startswith("a [priority 0") for line in lines)
    assert any("shortfall big: no_eligible_host" in line for line in lines)


def test_explain_host_limit_bounds_lists_but_not_counts():
    hosts = [host(f"h{i:02d}") for i in range(20)] + [
        host(f"p{i:02d}", state="paused") for i in range(20)
    ]
    inp = mk([prof("m", 4000)], hosts, policy=Policy(explain_host_limit=5))
    ex = explanation(plan(inp), "m")
    assert len(ex.eligible_hosts) == 5 and ex.eligible_count == 20
    assert len(ex.rejected) == 5 and ex.rejected_counts == {
        R.HOST_NOT_ELIGIBLE_STATE: 20
    }
    full = explain_model(inp, "m")
    assert len(full.eligible_hosts) == 20 and len(full.rejected) == 20


def test_reference_scan_matches_indexed_scan_on_examples():
    hosts = [
        host(f"h{i}", 8_000 + 4000 * (i % 3), domain=f"d{i % 2}", queue=i % 4)
        for i in range(12)
    ]
    profiles = [
        prof(
            f"m{i}",
            2000 + 1000 * i,
            min_replicas=1,
            max_replicas=3,
            min_failure_domains=2,
        )
        for i in range(5)
    ]
    inp = mk(profiles, hosts, [want(f"m{i}", 3) for i in range(5)])
    assert encode_plan(build_plan(inp, reference_scan=True)) == encode_plan(plan(inp))


def test_failure_domain_reserved_before_disruption_cost():
    old = NOW - 10_000
    hosts = [
        host("a1", 10_000, domain="a"),
        host("a2", 10_000, domain="a", residencies=(res("idle", 8000, loaded_at=old),)),
        host(
            "b1",
            10_000,
            domain="b",
            residencies=(res("busy", 8000, loaded_at=old, active_requests=4),),
        ),
    ]
    profiles = [
        prof("idle", 8000),
        prof("busy", 8000),
        prof(
            "vip",
            8000,
            priority=9,
            min_replicas=2,
            max_replicas=2,
            min_failure_domains=2,
        ),
    ]
    p = plan(mk(profiles, hosts))
    assert on(p, "vip") == ["a1"]
    # The cheaper idle victim is in the domain vip already uses: the busy one in b goes.
    assert [(x.host_id, x.victim_model) for x in p.preemptions] == [("b1", "busy")]


def test_sufficient_victim_set_on_one_host():
    old = NOW - 10_000
    hosts = [
        host(
            "h1",
            16_000,
            residencies=(res("x", 6000, loaded_at=old), res("y", 6000, loaded_at=old)),
        )
    ]
    profiles = [prof("x", 6000), prof("y", 6000), prof("big", 12_000, priority=5)]
    p = plan(mk(profiles, hosts))
    assert sorted(x.victim_model for x in p.preemptions) == ["x", "y"]
    assert all(x.beneficiary_model == "big" for x in p.preemptions)
    # Only as many victims as needed: a 9 GB beneficiary needs just one.
    profiles[2] = prof("big", 9_000, priority=5)
    p = plan(mk(profiles, hosts))
    assert len(p.preemptions) == 1


def test_first_replica_needing_a_domain_searches_every_class_not_only_special_hosts():
    """Found by Hypothesis (test_deterministic_bytes_and_exact_index): with no failure domain
    used yet, the class index skipped every bucket when the first replica 'needed a new domain',
    so only the special host (one holding a cached residency of the model) was considered and
    h0 (no hardware score) beat h1 (hardware 60) that the full scan picks."""
    h0 = host(
        "h0",
        16_000,
        domain="a",
        residencies=(
            res("m0", 1_000, managed=True, pinned=True, loaded_at=None),
            res("m0", 1_000, managed=True, pinned=True, loaded_at=None),
            res("m4", 1_000, "cached", managed=False, pinned=True, loaded_at=None),
        ),
    )
    h1 = host("h1", 16_000, domain="a", bw=100.0)
    inp = mk(
        [
            prof("m0", 1_000, min_replicas=0, max_replicas=1),
            prof("m4", 1_000, min_replicas=1, max_replicas=1, artifact_sha256="4" * 64),
        ],
        [h0, h1],
    )
    p = plan(inp)
    assert encode_plan(build_plan(inp, reference_scan=True)) == encode_plan(p)
    (m4,) = [x for x in p.placements if x.model_id == "m4"]
    assert (m4.host_id, m4.scores.get("hardware")) == ("h1", 60.0)


def test_scale_down_with_a_preemption_keeps_the_surplus_ready_replica():
    """A has two ready replicas and now wants one; the seed keeps h1's and leaves h2's as
    surplus. B (higher priority) fits only on h1 and preempts A there. Before, A kept neither
    replica and reported AWAITING_RELEASE on h2, the host of its own ready copy (only the
    reconciler's last-replica rule hid the outage)."""
    inp = mk(
        [
            prof("A", 8_000, min_replicas=0, max_replicas=2),
            prof("B", 12_000, min_replicas=1, max_replicas=1, priority=1),
        ],
        [
            host("h1", 16_000, residencies=(res("A", 8_000),)),
            host("h2", 12_000, residencies=(res("A", 8_000),)),
        ],
        [want("A", 1)],
    )
    p = plan(inp)
    assert [(x.host_id, x.victim_model, x.beneficiary_model) for x in p.preemptions] == [("h1", "A", "B")]
    assert on(p, "A", "existing") == ["h2"]
    assert shortfall_reasons(p, "A") == set()
    assert shortfall_reasons(p, "B") == {R.PREEMPTION_STAGED}
    assert encode_plan(build_plan(inp, reference_scan=True)) == encode_plan(p)


def test_scale_up_preemption_weighs_the_victims_displaced_demand():
    """B (priority 1) has a replica and wants a second; the only room is A's last replica.
    A scale-up preempts only when B's unserved demand exceeds what A's replica serves now."""

    def inp(a_offered: float):
        return mk(
            [
                prof("A", 8_000, min_replicas=0, max_replicas=1),
                prof("B", 8_000, min_replicas=0, max_replicas=2, priority=1),
            ],
            [
                host("h1", 12_000, residencies=(res("A", 8_000),)),
                host("h2", 12_000, residencies=(res("B", 8_000),)),
            ],
            [want("A", 1, offered_concurrency=a_offered), want("B", 2, offered_concurrency=1.2)],
        )

    # B's second replica would serve min(0.7, 1.2 - 0.7) = 0.5 of offered concurrency.
    busy = plan(inp(0.9))
    assert busy.preemptions == ()
    assert on(busy, "A") == ["h1"]
    idle = plan(inp(0.2))
    assert [(x.host_id, x.victim_model) for x in idle.preemptions] == [("h1", "A")]
    # A model's first replica keeps strict priority whatever the victim serves.
    first = mk(
        [prof("A", 8_000, min_replicas=0, max_replicas=1), prof("B", 8_000, min_replicas=0, priority=1)],
        [host("h1", 12_000, residencies=(res("A", 8_000),))],
        [want("A", 1, offered_concurrency=5.0), want("B", 1, offered_concurrency=0.1)],
    )
    assert [(x.host_id, x.victim_model) for x in plan(first).preemptions] == [("h1", "A")]


def test_a_pending_placement_is_kept_over_an_equal_host_while_it_still_fits():
    hosts = [host("h1"), host("h2")]
    demand = [want("m", 1)]
    assert on(plan(mk([prof("m")], hosts, demand)), "m") == ["h1"]
    pending = (PendingPlacement(host_id="h2", model_id="m"),)
    p = plan(mk([prof("m")], hosts, demand, pending=pending))
    assert on(p, "m", "new") == ["h2"]
    assert explanation(p, "m") is not None
    # Both placers agree (the pending host is scored one by one, like a cached one).
    assert encode_plan(build_plan(mk([prof("m")], hosts, demand, pending=pending), reference_scan=True)) == \
        encode_plan(p)
    # No longer feasible there: the replica goes to the host that fits.
    full = [host("h1"), host("h2", unmanaged=14_000)]
    assert on(plan(mk([prof("m")], full, demand, pending=pending)), "m") == ["h1"]
