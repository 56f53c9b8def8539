"""Reconciler table tests: one per rule of the pure reconciler."""

from __future__ import annotations

import msgspec

from grid.controller import reconcile as rc
from grid.controller.governor import ARTIFACT_FANOUT, GLOBAL_LIMIT, HOST_LIMIT, Limits
from grid.controller.reconcile import Guards
from grid.fleet.planning import Preemption, Shortfall
from grid.fleet.reasons import RELOCATION

from tests.unit.controller.ctlkit import (
    NOW, SHA_A, SHA_B, History, host, kinds, mkplan, placement, profile, profiles, reasons, reconcile_hosts, res,
)

M = profiles(profile("m"))


def run(plan, hosts, history=None, profs=M, **kw):  # type: ignore[no-untyped-def]
    return reconcile_hosts(plan, hosts, (history or History()).state, profs, NOW, **kw)


def test_missing_replica_loads_then_warms_after_the_load_and_ids_are_stable() -> None:
    plan = mkplan(placement("m", "h1"))
    r1 = run(plan, [host("h1")])
    assert kinds(r1) == [("load", "h1", "m")]
    load = r1.actions[0]
    assert load.reason == rc.LOAD_FOR_PLACEMENT
    # The warm waits for its load (issued on a later tick, so its lease TTL is not spent queueing).
    assert reasons(r1)[("warm", "h1", "m")] == rc.AWAITING_DEPENDENCY
    # Same intent, same ids: a retried tick reproduces the result byte for byte.
    r2 = run(plan, [host("h1")])
    assert msgspec.json.encode(r1) == msgspec.json.encode(r2)
    # Load finished (ack newer than the heartbeat): warm now, without a second load.
    h = History().issue(load, at=NOW - 3).ack(load, at=NOW - 2)
    r3 = reconcile_hosts(plan, [host("h1", hb_at=NOW - 2.5)], h.state, M, NOW)
    assert kinds(r3) == [("warm", "h1", "m")] and r3.actions[0].reason == rc.WARM_FOR_PLACEMENT


def test_cached_artifact_warms_without_load() -> None:
    profs = profiles(profile("m", artifact_sha256=SHA_A))
    r = run(mkplan(placement("m", "h1")), [host("h1", cached=[("m", SHA_A)])], profs=profs)
    assert kinds(r) == [("warm", "h1", "m")]
    assert r.actions[0].dependencies == ()
    # A cached copy of a different revision does not count.
    r = run(mkplan(placement("m", "h1")), [host("h1", cached=[("m", SHA_B)])], profs=profs)
    assert kinds(r) == [("load", "h1", "m")]


def test_deferred_load_defers_its_warm() -> None:
    plan = mkplan(placement("m", "h1"))
    first = run(plan, [host("h1")])
    load = first.actions[0]
    h = History().issue(load, at=NOW - 5).ack(load, "failed", at=NOW - 4)
    r = run(plan, [host("h1")], h)
    assert r.actions == ()
    rs = reasons(r)
    assert rs[("load", "h1", "m")] == rc.BACKOFF
    assert rs[("warm", "h1", "m")] == rc.DEPENDENCY_DEFERRED


def test_failure_backoff_is_per_kind_host_model_and_exponential() -> None:
    profs = profiles(profile("m", artifact_sha256=SHA_A))
    hosts = [host("h1", cached=[("m", SHA_A)]), host("h2", cached=[("m", SHA_A)])]
    plan = mkplan(placement("m", "h1"), placement("m", "h2"))
    r0 = run(plan, hosts, profs=profs)
    w1 = next(a for a in r0.actions if a.host_id == "h1")
    h = History().issue(w1, at=NOW - 20).ack(w1, "failed", at=NOW - 10)
    r = run(plan, hosts, h, profs=profs)
    # h1's warm backs off (base 15 s); the healthy target elsewhere is not blocked.
    assert kinds(r) == [("warm", "h2", "m")]
    d = next(d for d in r.deferred if d.host_id == "h1")
    assert d.reason == rc.BACKOFF and d.not_before == NOW - 10 + 15
    # After the backoff the retry is a new lifecycle with a new id.
    later = reconcile_hosts(plan, [host("h1", cached=[("m", SHA_A)], hb_at=NOW + 19), hosts[1]], h.state, profs, NOW + 20)
    retry = next(a for a in later.actions if a.host_id == "h1")
    assert retry.action_id != w1.action_id
    # A second failure doubles the wait.
    h.issue(retry, at=NOW + 20).ack(retry, "failed", at=NOW + 21)
    r = reconcile_hosts(plan, [host("h1", cached=[("m", SHA_A)], hb_at=NOW + 40)], h.state, profs, NOW + 41)
    d = next(d for d in r.deferred if d.host_id == "h1")
    assert d.reason == rc.BACKOFF and d.not_before == NOW + 21 + 30


def test_global_and_per_host_mutation_limits() -> None:
    profs = profiles(*(profile(f"m{i}") for i in range(4)))
    plan = mkplan(*(placement(f"m{i}", "h1") for i in range(4)), placement("m0", "h2"))
    r = run(plan, [host("h1"), host("h2")], profs=profs, limits=Limits(max_global_mutations=3, max_host_mutations=2))
    assert len(r.actions) == 3
    per_host = {h: sum(1 for a in r.actions if a.host_id == h) for h in ("h1", "h2")}
    assert per_host["h1"] <= 2
    assert {d.reason for d in r.deferred} >= {HOST_LIMIT}
    # Open commands hold their slots.
    h = History().issue(*r.actions)
    r2 = run(plan, [host("h1"), host("h2")], h, profs=profs, limits=Limits(max_global_mutations=3, max_host_mutations=2))
    assert r2.actions == ()
    assert GLOBAL_LIMIT in {d.reason for d in r2.deferred} or HOST_LIMIT in {d.reason for d in r2.deferred}


def test_exact_artifact_fanout_limit_is_two() -> None:
    profs = profiles(profile("m", artifact_sha256=SHA_A), profile("n", artifact_sha256=SHA_B))
    hosts = [host(f"h{i}") for i in range(4)]
    plan = mkplan(*(placement("m", f"h{i}") for i in range(3)), placement("n", "h3"))
    r = run(plan, hosts, profs=profs)
    loads_m = [a for a in r.actions if a.kind == "load" and a.model_id == "m"]
    assert len(loads_m) == 2
    rs = reasons(r)
    assert rs[("load", "h2", "m")] == ARTIFACT_FANOUT
    assert rs[("warm", "h2", "m")] == rc.DEPENDENCY_DEFERRED
    # A different artifact uses the remaining budget.
    assert ("load", "h3", "n") in kinds(r)
    # Pending loads count toward the limit on the next tick too.
    h = History().issue(*loads_m)
    r2 = run(plan, hosts, h, profs=profs)
    assert reasons(r2)[("load", "h2", "m")] == ARTIFACT_FANOUT


def test_minimum_residency_protects_a_new_incumbent() -> None:
    profs = profiles(profile("m", min_residency_seconds=300))
    plan = mkplan(placement("m", "h2", status="existing"))
    hosts = [host("h1", res("m", loaded_age=60)), host("h2", res("m"))]
    r = run(plan, hosts, profs=profs)
    assert r.actions == ()
    assert reasons(r)[("drain", "h1", "m")] == rc.MIN_RESIDENCY
    hosts = [host("h1", res("m", loaded_age=400)), host("h2", res("m"))]
    assert kinds(run(plan, hosts, profs=profs)) == [("drain", "h1", "m")]


def test_scale_down_cooldown_applies_to_recently_used_replicas() -> None:
    profs = profiles(profile("m", scale_down_cooldown_seconds=600))
    plan = mkplan(placement("m", "h2", status="existing"))
    hosts = [host("h1", res("m", used_age=30)), host("h2", res("m"))]
    r = run(plan, hosts, profs=profs)
    assert reasons(r)[("drain", "h1", "m")] == rc.SCALE_DOWN_COOLDOWN
    hosts = [host("h1", res("m", used_age=700)), host("h2", res("m"))]
    r = run(plan, hosts, profs=profs)
    assert kinds(r) == [("drain", "h1", "m")] and r.actions[0].reason == rc.DRAIN_SCALE_DOWN


def test_make_before_break_waits_for_every_desired_replacement() -> None:
    plan = mkplan(placement("m", "h2"), placement("m", "h3"))
    hosts = [host("h1", res("m")), host("h2", res("m")), host("h3", res("m", "warming"))]
    r = run(plan, hosts)
    assert reasons(r)[("drain", "h1", "m")] == rc.AWAITING_REPLACEMENT
    assert not [a for a in r.actions if a.destructive]
    hosts[2] = host("h3", res("m"))
    r = run(plan, hosts)
    assert kinds(r) == [("drain", "h1", "m")]
    # Relocation away from an operator-drained host is not a scale-down.
    hosts[0] = host("h1", res("m"), state="draining")
    r = run(plan, hosts)
    assert kinds(r) == [("drain", "h1", "m")] and r.actions[0].reason == rc.DRAIN_OBSOLETE
    # A replacement on a host that is not routable does not count as ready.
    hosts[2] = host("h3", res("m"), state="paused")
    assert reasons(run(plan, hosts))[("drain", "h1", "m")] == rc.AWAITING_REPLACEMENT


def test_last_replica_is_protected_when_the_plan_has_a_shortfall() -> None:
    plan = mkplan(shortfalls=[Shortfall(model_id="m", wanted=1, placed=0, reason="no_eligible_host")])
    hosts = [host("h1", res("m"), state="paused")]
    r = run(plan, hosts)
    assert r.actions == ()
    assert reasons(r)[("drain", "h1", "m")] == rc.LAST_REPLICA


def test_drain_before_unload_and_only_when_idle() -> None:
    plan = mkplan()
    # A ready obsolete copy is drained, never unloaded directly.
    assert kinds(run(plan, [host("h1", res("m"))])) == [("drain", "h1", "m")]
    r = run(plan, [host("h1", res("m", "draining", active=2))])
    assert r.actions == () and reasons(r)[("unload", "h1", "m")] == rc.REQUESTS_IN_FLIGHT
    r = run(plan, [host("h1", res("m", "draining", active=0))])
    assert kinds(r) == [("unload", "h1", "m")] and r.actions[0].reason == rc.UNLOAD_DRAINED


def test_staged_preemption_drains_victim_first_and_prefetches_beneficiary() -> None:
    profs = profiles(
        profile("low", priority=0, min_residency_seconds=300),
        profile("high", priority=10, artifact_sha256=SHA_A, artifact_source="hf://o/r/x.gguf", artifact_size_mb=10),
    )
    pre = Preemption(host_id="h1", victim_model="low", beneficiary_model="high", reason="priority")
    plan = mkplan(preemptions=[pre], shortfalls=[Shortfall(model_id="high", wanted=1, placed=0, reason="capacity")])
    r = reconcile_hosts(plan, [host("h1", res("low"))], History().state, profs, NOW, limits=Limits(max_host_mutations=2))
    assert set(kinds(r)) == {("drain", "h1", "low"), ("load", "h1", "high")}
    drain = next(a for a in r.actions if a.kind == "drain")
    assert drain.reason == rc.DRAIN_PREEMPTION and drain.preemption_for == "high" and drain.priority == 10
    load = next(a for a in r.actions if a.kind == "load")
    assert load.reason == rc.PREFETCH_FOR_PREEMPTION
    assert not [a for a in r.actions if a.kind == "warm"]
    # Minimum residency is never bypassed by a preemption.
    r = reconcile_hosts(plan, [host("h1", res("low", loaded_age=10))], History().state, profs, NOW)
    assert reasons(r)[("drain", "h1", "low")] == rc.MIN_RESIDENCY


def test_retirement_drains_managed_copies_and_withdraws_availability_work() -> None:
    profs = profiles(profile("m", min_residency_seconds=300))
    plan = mkplan(placement("m", "h2"))
    first = reconcile_hosts(plan, [host("h1"), host("h2")], History().state, profs, NOW)
    load_h2 = first.actions[0]
    h = History().issue(load_h2)
    # Profile removed: tombstone in `retired`, no profile, no placement.
    r = reconcile_hosts(mkplan(), [host("h1", res("m", loaded_age=5)), host("h2")], h.state, {}, NOW, retired=["m"])
    assert kinds(r) == [("drain", "h1", "m")] and r.actions[0].reason == rc.DRAIN_RETIRED
    assert [(w.action_id, w.reason) for w in r.withdrawals] == [(load_h2.action_id, rc.WITHDRAW_RETIRED)]
    # A managed copy that reappears later (offline host returns) is drained too.
    r = reconcile_hosts(mkplan(), [host("h3", res("m"))], h.state, {}, NOW, retired=["m"])
    assert ("drain", "h3", "m") in kinds(r)


def test_unmanaged_and_pinned_residencies_are_never_actuated() -> None:
    hosts = [host("h1", res("m", managed=False)), host("h2", res("m", pinned=True)),
             host("h3", res("m", "draining", managed=False))]
    r = run(mkplan(), hosts)
    assert r.actions == ()
    assert {(i.host_id, i.reason) for i in r.ignored} == {
        ("h1", rc.IGNORED_UNMANAGED), ("h2", rc.IGNORED_PINNED), ("h3", rc.IGNORED_UNMANAGED)}
    # An unmanaged ready copy satisfies a placement without any action.
    r = run(mkplan(placement("m", "h1", status="existing")), [host("h1", res("m", managed=False))])
    assert r.actions == () and r.satisfied == 1


def test_observe_mode_records_drift_as_deferred() -> None:
    r = run(mkplan(placement("m", "h1")), [host("h1")], mode="observe")
    assert r.actions == ()
    assert [(d.kind, d.reason) for d in r.deferred] == [("load", rc.OBSERVE_ONLY), ("warm", rc.AWAITING_DEPENDENCY)]


def test_pending_equivalents_are_suppressed() -> None:
    plan = mkplan(placement("m", "h1"))
    load = run(plan, [host("h1")]).actions[0]
    h = History().issue(load).ack(load, at=NOW - 0.5)
    warm = reconcile_hosts(plan, [host("h1", hb_at=NOW - 0.7)], h.state, M, NOW).actions[0]
    h.issue(warm)
    r = reconcile_hosts(plan, [host("h1", hb_at=NOW - 0.7)], h.state, M, NOW)
    assert r.actions == ()
    assert reasons(r)[("warm", "h1", "m")] == rc.IN_FLIGHT
    assert r.in_flight == (warm.action_id,)
    # Duplicate and conflicting later acks are harmless: the first terminal ack stands.
    h.ack(load, "succeeded", at=NOW).ack(load, "failed", at=NOW + 1)
    assert h.state.actions[load.action_id].status == "succeeded"
    assert reconcile_hosts(plan, [host("h1", hb_at=NOW - 0.7)], h.state, M, NOW) == r


def test_warm_waits_while_its_load_is_open() -> None:
    plan = mkplan(placement("m", "h1"))
    load = run(plan, [host("h1")]).actions[0]
    h = History().issue(load)
    r = run(plan, [host("h1")], h)
    assert r.actions == ()
    rs = reasons(r)
    assert rs[("warm", "h1", "m")] == rc.AWAITING_DEPENDENCY


def test_observation_time_fencing() -> None:
    profs = profiles(profile("m", artifact_sha256=SHA_A))
    plan = mkplan(placement("m", "h1"))
    hosts = [host("h1", cached=[("m", SHA_A)], hb_at=NOW - 10)]
    warm = reconcile_hosts(plan, hosts, History().state, profs, NOW).actions[0]
    h = History().issue(warm, at=NOW - 8).ack(warm, "succeeded", at=NOW - 5)
    # The heartbeat predates the successful ack: no duplicate warm.
    r = reconcile_hosts(plan, hosts, h.state, profs, NOW)
    assert r.actions == () and reasons(r)[("warm", "h1", "m")] == rc.AWAITING_OBSERVATION
    # A genuinely newer heartbeat that still shows no residency starts a new lifecycle.
    newer = [host("h1", cached=[("m", SHA_A)], hb_at=NOW - 1)]
    r = reconcile_hosts(plan, newer, h.state, profs, NOW)
    assert kinds(r) == [("warm", "h1", "m")] and r.actions[0].action_id != warm.action_id
    # A load that succeeded after the heartbeat counts as cached: warm without a second load.
    plan2 = mkplan(placement("m", "h2"))
    load = reconcile_hosts(plan2, [host("h2", hb_at=NOW - 10)], History().state, profs, NOW).actions[0]
    h2 = History().issue(load, at=NOW - 8).ack(load, "succeeded", at=NOW - 5)
    r = reconcile_hosts(plan2, [host("h2", hb_at=NOW - 10)], h2.state, profs, NOW)
    assert kinds(r) == [("warm", "h2", "m")] and r.actions[0].dependencies == ()


def test_unsafe_destructive_batch_is_withdrawn_and_blocks_until_proven() -> None:
    plan = mkplan(placement("m", "h2"), placement("m", "h3"))
    ready = [host("h1", res("m")), host("h2", res("m")), host("h3", res("m")), host("h4", res("m"))]
    r = run(plan, ready, limits=Limits(max_global_mutations=8))
    drains = [a for a in r.actions if a.kind == "drain"]
    assert {a.host_id for a in drains} == {"h1", "h4"}
    h = History().issue(*drains, at=NOW)
    h.ack(drains[0], "accepted", at=NOW + 0.5)
    # Fresh evidence: the replacement on h3 stopped being ready -> withdraw the whole batch.
    later = NOW + 2
    hosts = [host("h1", res("m"), hb_at=later), host("h2", res("m"), hb_at=later),
             host("h3", res("m", "warming"), hb_at=later), host("h4", res("m"), hb_at=later)]
    r = reconcile_hosts(plan, hosts, h.state, M, later + 1)
    assert {w.action_id for w in r.withdrawals} == {a.action_id for a in drains}
    assert all(w.reason == rc.WITHDRAW_UNSAFE_DESTRUCTIVE for w in r.withdrawals)
    assert next(w for w in r.withdrawals if w.host_id == "h1").delivered
    for a in drains:
        h.withdraw(a, at=later + 1)
    # h3 is ready again, but destructive work for m stays blocked (no wall-clock timeout)...
    hosts = [host(x.host_id, *x.residencies, hb_at=later + 499) for x in hosts]
    hosts[2] = host("h3", res("m"), hb_at=later + 499)
    r = reconcile_hosts(plan, hosts, h.state, M, later + 500)
    assert [b.model_id for b in r.blocked] == ["m"]
    assert not [a for a in r.actions if a.destructive]
    assert {reasons(r)[("drain", x, "m")] for x in ("h1", "h4")} == {rc.DESTRUCTIVE_BLOCKED}
    # ...until a terminal ack (h1) and a heartbeat proving the postcondition (h4: draining).
    h.ack(drains[0], "cancelled", at=later + 501)
    hosts = [host(x.host_id, *x.residencies, hb_at=later + 502) for x in hosts]
    hosts[3] = host("h4", res("m", "draining"), hb_at=later + 502)
    r = reconcile_hosts(plan, hosts, h.state, M, later + 503)
    assert r.blocked == () and r.cleared_withdrawals == (drains[1].action_id,)
    assert ("drain", "h1", "m") in kinds(r)
    # The new drain of h1 is a new lifecycle (the withdrawn one is its basis).
    assert next(a for a in r.actions if a.host_id == "h1").action_id != drains[0].action_id


def test_restart_grace_defers_destructive_work_only() -> None:
    plan = mkplan(placement("m", "h2"))
    hosts = [host("h1", res("m"), hb_at=NOW - 1), host("h2")]
    g = Guards(destructive_not_before=NOW + 10, fresh_after=NOW - 5)
    r = run(plan, hosts, guards=g)
    assert ("load", "h2", "m") in kinds(r)
    profs = profiles(profile("m"), profile("x"))
    r = reconcile_hosts(mkplan(), [host("h1", res("x"), hb_at=NOW - 1)], History().state, profs, NOW, guards=g)
    assert reasons(r)[("drain", "h1", "x")] == rc.RESTART_GRACE
    # After the grace, a heartbeat from before the restart is still not enough.
    g2 = Guards(destructive_not_before=NOW - 1, fresh_after=NOW - 0.5)
    r = reconcile_hosts(mkplan(), [host("h1", res("x"), hb_at=NOW - 1)], History().state, profs, NOW, guards=g2)
    assert reasons(r)[("drain", "h1", "x")] == rc.RESTART_GRACE
    r = reconcile_hosts(mkplan(), [host("h1", res("x"), hb_at=NOW - 0.1)], History().state, profs, NOW, guards=g2)
    assert kinds(r) == [("drain", "h1", "x")]


def test_availability_is_served_before_destructive_work() -> None:
    profs = profiles(profile("a"), profile("b"), profile("old"))
    plan = mkplan(placement("a", "h1"), placement("b", "h2"))
    hosts = [host("h1"), host("h2"), host("h3", res("old"))]
    r = reconcile_hosts(plan, hosts, History().state, profs, NOW, limits=Limits(max_global_mutations=2))
    assert [a.kind for a in r.actions] == ["load", "load"]
    assert reasons(r)[("drain", "h3", "old")] == GLOBAL_LIMIT


def test_stale_and_fenced_hosts_get_no_new_work() -> None:
    plan = mkplan(placement("m", "h1"), placement("m", "h2"), placement("m", "h3"))
    hosts = [host("h1", hb_at=NOW - 120), host("h2", state="paused"), host("h3", caps=("drain", "unload"))]
    r = run(plan, hosts)
    assert r.actions == ()
    rs = reasons(r)
    assert rs[("load", "h1", "m")] == rc.HOST_STALE
    assert rs[("load", "h2", "m")] == rc.HOST_NOT_ACCEPTING
    assert rs[("load", "h3", "m")] == rc.NO_CAPABILITY
    # A heartbeat from the future is not trusted either.
    assert reasons(run(plan[:0] if False else mkplan(placement("m", "h1")), [host("h1", hb_at=NOW + 60)]))[
        ("load", "h1", "m")] == rc.HOST_STALE


def test_warm_waits_for_free_memory() -> None:
    profs = profiles(profile("m", memory_mb=8000, artifact_sha256=SHA_A), profile("old"))
    plan = mkplan(placement("m", "h1", memory=8000))
    hosts = [host("h1", res("old", memory=9000), capacity=16_000, cached=[("m", SHA_A)])]
    r = reconcile_hosts(plan, hosts, History().state, profs, NOW)
    assert reasons(r)[("warm", "h1", "m")] == rc.INSUFFICIENT_FREE_MEMORY
    hosts = [host("h1", res("old", memory=7000), capacity=16_000, cached=[("m", SHA_A)])]
    assert ("warm", "h1", "m") in kinds(reconcile_hosts(plan, hosts, History().state, profs, NOW))


def test_undelivered_availability_work_no_longer_desired_is_withdrawn() -> None:
    plan = mkplan(placement("m", "h1"))
    load = run(plan, [host("h1"), host("h2")]).actions[0]
    h = History().issue(load)
    r = run(mkplan(placement("m", "h2")), [host("h1"), host("h2")], h)
    assert [(w.action_id, w.reason) for w in r.withdrawals] == [(load.action_id, rc.WITHDRAW_NOT_DESIRED)]
    # Once the node accepted it, it keeps running (no churn of delivered constructive work).
    h.ack(load, "accepted")
    r = run(mkplan(placement("m", "h2")), [host("h1"), host("h2")], h)
    assert r.withdrawals == ()


def test_desired_copy_left_draining_is_recycled() -> None:
    plan = mkplan(placement("m", "h1", status="existing"))
    r = run(plan, [host("h1", res("m", "draining"))])
    assert kinds(r) == [("unload", "h1", "m")]


def test_failed_obsolete_residency_is_drained_without_waiting_for_replacements() -> None:
    plan = mkplan(placement("m", "h2"))
    r = run(plan, [host("h1", res("m", "failed")), host("h2")])
    assert ("drain", "h1", "m") in kinds(r)
    assert next(a for a in r.actions if a.kind == "drain").reason == rc.DRAIN_FAILED


def test_preemption_budget_bounds_repeated_preemption_of_one_model() -> None:
    profs = profiles(profile("low", priority=0), profile("high", priority=10))
    pre = Preemption(host_id="h1", victim_model="low", beneficiary_model="high", reason="priority")
    plan = mkplan(placement("high", "h2"), preemptions=[pre],
                  shortfalls=[Shortfall(model_id="high", wanted=2, placed=1, reason="capacity")])
    hosts = [host("h1", res("low")), host("h2", res("high"))]
    first = reconcile_hosts(plan, hosts, History().state, profs, NOW)
    assert ("drain", "h1", "low") in kinds(first)
    drain = next(a for a in first.actions if a.kind == "drain")
    # "low" was preempted ten minutes ago (and came back): while "high" already serves from a
    # ready replica, a second preemption of "low" inside the window waits.
    h = History().issue(drain, at=NOW - 600).ack(drain, at=NOW - 599)
    again = reconcile_hosts(plan, hosts, h.state, profs, NOW)
    assert reasons(again)[("drain", "h1", "low")] == rc.PREEMPTION_BUDGET
    # After the window it may preempt again.
    window = rc.PREEMPTION_WINDOW_SECONDS
    old = History().issue(drain, at=NOW - window - 60).ack(drain, at=NOW - window - 59)
    assert ("drain", "h1", "low") in kinds(reconcile_hosts(plan, hosts, old.state, profs, NOW))
    # The beneficiary's first replica keeps strict priority.
    alone = reconcile_hosts(mkplan(preemptions=[pre], shortfalls=[Shortfall(model_id="high", wanted=1, placed=0,
                                                                         reason="capacity")]),
                      [host("h1", res("low")), host("h2")], h.state, profs, NOW)
    assert ("drain", "h1", "low") in kinds(alone)


def test_relocation_drains_only_while_another_copy_serves() -> None:
    """A relocation moves a replica: the old copy drains at once when the new one is ready (no
    scale-down cooldown: it was used a second ago), and waits while it is the last ready one."""
    profs = profiles(profile("a", scale_down_cooldown_seconds=600), profile("b"))
    pre = Preemption(host_id="h1", victim_model="a", beneficiary_model="b", reason=RELOCATION)
    plan = mkplan(placement("a", "h2", status="existing"), preemptions=[pre])
    moved = run(plan, [host("h1", res("a", used_age=1.0)), host("h2", res("a"))], profs=profs)
    drain = next(a for a in moved.actions if a.kind == "drain")
    assert (drain.host_id, drain.reason, drain.preemption_for) == ("h1", rc.DRAIN_PREEMPTION, "b")
    waiting = run(plan, [host("h1", res("a", used_age=1.0)), host("h2", res("a", "loading"))], profs=profs)
    assert reasons(waiting)[("drain", "h1", "a")] == rc.AWAITING_REPLACEMENT
