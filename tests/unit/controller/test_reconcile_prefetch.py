"""Reconciling the predictive cache: advisories become prefetch loads, expiries exact evicts."""

from __future__ import annotations

import msgspec

from grid.controller import reconcile as rc
from grid.controller.governor import GLOBAL_LIMIT, Limits
from grid.events.commands import PREDICTIVE_PREFETCH
from grid.events.host import CachedArtifact
from grid.fleet import reasons as R
from grid.fleet.planning import CacheEviction, PrefetchAdvisory
from grid.fleet.views import HostView

from tests.unit.controller.ctlkit import (
    NOW, SHA_A, SHA_B, History, host, kinds, mkplan, placement, profile, profiles, reasons, reconcile_hosts, res,
)

SRC = "https://models.example/p.gguf"
P = profiles(profile("p", artifact_sha256=SHA_B, artifact_source=SRC, artifact_size_mb=3000),
             profile("m", artifact_sha256=SHA_A, artifact_source=SRC, artifact_size_mb=1000))


def advice(host_id: str = "h1", model: str = "p", sha: str = SHA_B) -> PrefetchAdvisory:
    return PrefetchAdvisory(host_id=host_id, model_id=model, artifact_sha256=sha, size_bytes=3000 << 20,
                            reason=R.PREDICTIVE_PREFETCH, value_per_mb=0.01, load_seconds=30.0, concurrency=1.0)


def expiry(host_id: str = "h1", model: str = "p", sha: str = SHA_B) -> CacheEviction:
    return CacheEviction(host_id=host_id, model_id=model, artifact_sha256=sha, size_bytes=3000 << 20,
                         reason=R.PREDICTIVE_CACHE_EXPIRED, age_seconds=30_000.0)


def with_plan(*placements, prefetch=(), evictions=()):  # type: ignore[no-untyped-def]
    return msgspec.structs.replace(mkplan(*placements), prefetch=tuple(prefetch), evictions=tuple(evictions))


def predictive_host(host_id: str = "h1", *, predictive: bool = True, sha: str = SHA_B, hb_at: float = NOW - 1.0,
                    **kw) -> HostView:  # type: ignore[no-untyped-def]
    h = host(host_id, hb_at=hb_at, **kw)
    entry = CachedArtifact(model_id="p", sha256=sha, size_bytes=3000 << 20, predictive=predictive,
                           cached_age_seconds=30_000.0)
    return msgspec.structs.replace(h, cached=h.cached + (entry,))


def run(plan, hosts, history=None, **kw):  # type: ignore[no-untyped-def]
    return reconcile_hosts(plan, hosts, (history or History()).state, P, NOW, **kw)


# --- advisories -------------------------------------------------------------------------------


def test_advisory_becomes_a_prefetch_load_never_a_warm() -> None:
    r = run(with_plan(prefetch=[advice()]), [host("h1")])
    assert kinds(r) == [("load", "h1", "p")]
    load = r.actions[0]
    assert load.reason == PREDICTIVE_PREFETCH and load.artifact_sha256 == SHA_B and load.artifact_source == SRC
    assert not any(d.kind == "warm" for d in r.deferred)
    # An open prefetch is not withdrawn as "not desired" while the plan still advises it...
    h = History().issue(load)
    again = run(with_plan(prefetch=[advice()]), [host("h1")], h)
    assert again.withdrawals == () and reasons(again)[("load", "h1", "p")] == rc.IN_FLIGHT
    # ...and is, while undelivered, once the advisory is gone.
    gone = run(with_plan(), [host("h1")], h)
    assert [(w.action_id, w.reason) for w in gone.withdrawals] == [(load.action_id, rc.WITHDRAW_NOT_DESIRED)]


def test_advisory_already_cached_or_desired_or_stale_is_not_loaded() -> None:
    assert run(with_plan(prefetch=[advice()]), [host("h1", cached=[("p", SHA_B)])]).actions == ()
    # A real placement there: the placement's own load (and warm) does the work.
    r = run(with_plan(placement("p", "h1"), prefetch=[advice()]), [host("h1")])
    assert [(a.kind, a.reason) for a in r.actions] == [("load", rc.LOAD_FOR_PLACEMENT)]
    # The profile changed revision since the plan: not acted on.
    r = run(with_plan(prefetch=[advice(sha=SHA_A)]), [host("h1")])
    assert r.actions == () and reasons(r)[("load", "h1", "p")] == rc.ADVISORY_STALE


def test_demanded_work_is_served_first_within_the_mutation_budget() -> None:
    plan = with_plan(placement("m", "h2"), prefetch=[advice()])
    r = run(plan, [host("h1"), host("h2")], limits=Limits(max_global_mutations=1))
    assert [(a.kind, a.model_id, a.reason) for a in r.actions] == [("load", "m", rc.LOAD_FOR_PLACEMENT)]
    assert reasons(r)[("load", "h1", "p")] == GLOBAL_LIMIT


def test_prefetched_artifact_is_a_cache_hit_for_a_later_placement() -> None:
    r = run(with_plan(placement("p", "h1")), [predictive_host()])
    assert [(a.kind, a.reason) for a in r.actions] == [("warm", rc.WARM_FOR_PLACEMENT)]


# --- expiries ---------------------------------------------------------------------------------


def test_expiry_becomes_an_exact_sha_evict() -> None:
    r = run(with_plan(evictions=[expiry()]), [predictive_host()])
    assert kinds(r) == [("evict", "h1", "p")]
    ev = r.actions[0]
    assert ev.reason == rc.EVICT_PREDICTIVE_EXPIRED and ev.artifact_sha256 == SHA_B and ev.destructive
    assert ev.memory_mb == 0


def test_expiry_is_revalidated_against_the_latest_heartbeat() -> None:
    plan = with_plan(evictions=[expiry()])
    cases = [
        predictive_host(predictive=False),  # warmed since: no longer an unused predictive entry
        predictive_host(sha=SHA_A),  # another revision on disk: not the exact SHA
        host("h1"),  # already gone
        msgspec.structs.replace(predictive_host(), residencies=(res("p"),)),  # running
    ]
    for h in cases:
        r = run(plan, [h])
        assert not any(a.kind == "evict" for a in r.actions), h
        assert reasons(r)[("evict", "h1", "p")] == rc.CACHE_ENTRY_CHANGED
    # The model is wanted on that host again, or advised there.
    r = run(with_plan(placement("p", "h1"), evictions=[expiry()]), [predictive_host()])
    assert not any(a.kind == "evict" for a in r.actions)
    r = run(with_plan(prefetch=[advice()], evictions=[expiry()]), [predictive_host()])
    assert r.actions == ()


def test_evict_needs_the_actuator_and_respects_restart_grace() -> None:
    no_evict = predictive_host(caps=("load", "warm", "drain", "unload"))
    r = run(with_plan(evictions=[expiry()]), [no_evict])
    assert r.actions == () and reasons(r)[("evict", "h1", "p")] == rc.NO_CAPABILITY
    r = run(with_plan(evictions=[expiry()]), [predictive_host()], guards=rc.Guards(destructive_not_before=NOW + 60))
    assert r.actions == () and reasons(r)[("evict", "h1", "p")] == rc.RESTART_GRACE


def test_open_evict_is_withdrawn_when_the_entry_is_used_and_cleared_when_gone() -> None:
    plan = with_plan(evictions=[expiry()])
    ev = run(plan, [predictive_host()]).actions[0]
    h = History().issue(ev, at=NOW)
    # Still valid: in flight, no duplicate.
    r = run(plan, [predictive_host()], h)
    assert r.actions == () and r.withdrawals == () and reasons(r)[("evict", "h1", "p")] == rc.IN_FLIGHT
    # A placement warmed it meanwhile (the entry is no longer predictive): withdrawn.
    used = predictive_host(predictive=False, hb_at=NOW + 1)
    r = reconcile_hosts(with_plan(placement("p", "h1")), [used], h.state, P, NOW + 2)
    assert [(w.action_id, w.reason) for w in r.withdrawals] == [(ev.action_id, rc.WITHDRAW_UNSAFE_DESTRUCTIVE)]
    h.withdraw(ev, at=NOW + 2)
    # The warmed entry proves the withdrawn evict can no longer run: not blocked.
    r = reconcile_hosts(with_plan(placement("p", "h1")), [used], h.state, P, NOW + 3)
    assert r.blocked == () and r.cleared_withdrawals == (ev.action_id,)
