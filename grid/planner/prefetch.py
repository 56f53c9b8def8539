"""Predictive cache: cache-only advisories and the expiry of unused predictive downloads.

Run once at the end of planning, over the finished ledger (the plan's placements and staged
reservations have already charged their disk), so a speculative transfer can never take disk a
demanded placement needed.

Advisories. A model whose demand is correlation-only (evidence ``inferred``) and whose next
predicted replica got no serving slot in this plan may have its exact artifact fetched and
verified on a future-compatible host that holds no replica of it: no model slot, no memory,
never a warm, never an eviction of anything.
A host qualifies when it is eligible now, statically compatible with the model, advertises the
``load`` actuator, reports authenticated free disk (missing disk telemetry never authorizes a
transfer), does not already hold the artifact, and keeps at least
``policy.predictive_disk_reserve_bytes`` free after this plan's placements and the transfer.
The profile must name the exact source, SHA-256 and declared size. A prediction whose missing
replicas already have as many spare cached hosts (eligible, compatible, holding the artifact but
no replica) gets no further transfer: a persistent prediction must not copy its artifact onto
every host one plan at a time. Candidates are ranked by
cold-start value per artifact MB: the predicted concurrency (the forecaster's correlation rate
is already confidence-weighted; a canary counts half) times the load seconds the transfer would
save on that host (learned, else the profile's). After each choice the disk ledger changed, so
every value is recomputed before the next; at most ``policy.max_prefetch_per_plan`` per plan and
one host per model. A model's host is the one nearest to taking its replica (the largest share
of its memory free in this plan's desired footprint), then the most valuable; a host that
already has the same transfer open (pending) is kept first, so a long download is not re-aimed
while it runs.

Expiry. An artifact a predictive prefetch downloaded and nothing has warmed since
(``CachedArtifact.predictive``), at least ``policy.predictive_cache_ttl_seconds`` old, on a host
that advertises the ``evict`` actuator, whose model has no demand left (no target and no
replica in this plan) and nothing resident on that host, is planned for eviction of exactly that
SHA. Operator caches, entries of unknown age and hosts without the actuator are never touched.
"""

from __future__ import annotations

from msgspec import UNSET

from grid.fleet import reasons as R
from grid.fleet.planning import CacheEviction, PrefetchAdvisory
from grid.planner import scoring as S
from grid.planner.feasibility import artifact_cached
from grid.planner.ledger import Ledger
from grid.planner.state import HostState, ModelState

MB = 1 << 20
# A canary target is weak evidence (one replica at most): its predicted value counts half.
CANARY_WEIGHT = 0.5
LOAD_CAPABILITY = "load"
EVICT_CAPABILITY = "evict"


def advisories(led: Ledger) -> tuple[PrefetchAdvisory, ...]:
    """The cache-only advisories of this plan, in the order they were chosen."""
    budget = max(0, int(led.policy.max_prefetch_per_plan))
    if budget == 0:
        return ()
    models = [ms for ms in led.models if _wants_prefetch(led, ms)]
    # A prediction already staged on as many spare hosts as it lacks replicas needs no more.
    models = [ms for ms in models if _spare_caches(led, ms) < ms.wanted - ms.progress]
    if not models:
        return ()
    hosts = [hs for hs in led.hosts if _host_can_fetch(hs)]
    # Bytes this plan's advisories already took, per host index.
    taken: dict[int, int] = {}
    out: list[PrefetchAdvisory] = []
    while len(out) < budget and models:
        best: tuple[tuple, PrefetchAdvisory, ModelState] | None = None
        for ms in models:
            c = _best_for(led, ms, hosts, taken)
            if c is None:
                continue
            key, adv = c
            if best is None or key < best[0]:
                best = (key, adv, ms)
        if best is None:
            break
        _, adv, ms = best
        out.append(adv)
        hs = led.fleet.by_id[adv.host_id]
        taken[hs.idx] = taken.get(hs.idx, 0) + adv.size_bytes
        models.remove(ms)
    return tuple(out)


def _wants_prefetch(led: Ledger, ms: ModelState) -> bool:
    d = ms.demand
    p = ms.profile
    return (
        d is not None
        and d.evidence == "inferred"
        and d.replicas > 0
        and 0 < ms.wanted
        and ms.progress < ms.wanted
        and ms.tier_of(ms.progress) == "inferred"
        and ms.req.model_id not in led.held_models
        and bool(p.artifact_source)
        and ms.req.sha is not None
        and ms.req.disk_bytes is not None
    )


def _spare_caches(led: Ledger, ms: ModelState) -> int:
    """Eligible, compatible hosts holding the exact artifact but no replica of the model: where
    its next replica could start without a transfer."""
    mid = ms.req.model_id
    return sum(
        1
        for hs in led.hosts
        if hs.eligible
        and mid not in hs.desired
        and artifact_cached(hs.snap, ms.req)
        and led.host_static(hs, ms) is None
    )


def _host_can_fetch(hs: HostState) -> bool:
    snap = hs.snap
    return (
        hs.eligible
        and not hs.flap_quarantined
        and LOAD_CAPABILITY in snap.actuator_capabilities
        and snap.disk_free_bytes is not None
    )


def _free_after_plan(led: Ledger, hs: HostState, taken: dict[int, int]) -> int:
    """Authenticated free disk less this plan's placements and advisories on the host."""
    return int(hs.snap.disk_free_bytes or 0) - hs.disk_used - taken.get(hs.idx, 0)


def _load_seconds(led: Ledger, hs: HostState, ms: ModelState) -> float:
    """The load phase a cached artifact skips on this host (learned, else the profile's)."""
    sample = led.timings.get((hs.host_id, ms.req.model_id))
    cold = S.startup_seconds(ms.profile, sample, False, ms.req.sha)
    warm = S.startup_seconds(ms.profile, sample, True, ms.req.sha)
    return max(0.0, cold - warm)


def _best_for(
    led: Ledger, ms: ModelState, hosts: list[HostState], taken: dict[int, int]
) -> tuple[tuple, PrefetchAdvisory] | None:
    """The model's best host now: (rank key, advisory), or None when no host qualifies."""
    d = ms.demand
    assert d is not None and ms.req.disk_bytes is not None and ms.req.sha is not None
    size = ms.req.disk_bytes
    mid = ms.req.model_id
    weight = max(0.0, float(d.offered_concurrency)) * (CANARY_WEIGHT if d.canary else 1.0)
    reserve = max(0, int(led.policy.predictive_disk_reserve_bytes))
    best: tuple[tuple, PrefetchAdvisory] | None = None
    for hs in hosts:
        if mid in hs.desired or hs.snap.host_id in ms.req.deny:
            continue
        if led.host_static(hs, ms) is not None or artifact_cached(hs.snap, ms.req):
            continue
        after = _free_after_plan(led, hs, taken) - size
        if after < reserve:
            continue
        load = _load_seconds(led, hs, ms)
        value = round(weight * load / (size / MB), 9)
        pending = (hs.host_id, mid) in led.pending
        # The host nearest to taking the replica (the most of its memory free in this plan's
        # desired footprint) is where a later placement is likeliest to use the cache.
        near = round(min(1.0, max(0, hs.free_b) / max(1, int(ms.profile.memory_mb))), 6)
        key = (0 if pending else 1, -near, -value, mid, hs.host_id)
        if best is None or key < best[0]:
            best = (
                key,
                PrefetchAdvisory(
                    host_id=hs.host_id,
                    model_id=mid,
                    artifact_sha256=ms.req.sha,
                    size_bytes=size,
                    reason=R.PREDICTIVE_PREFETCH,
                    value_per_mb=value,
                    load_seconds=round(load, 6),
                    concurrency=round(weight, 6),
                    disk_free_after_bytes=after,
                ),
            )
    if best is None:
        return None
    # Across models only the value ranks (the host preferences are the model's own).
    key, adv = best
    return (key[2:], adv)


def expiries(led: Ledger, advised: tuple[PrefetchAdvisory, ...]) -> tuple[CacheEviction, ...]:
    """Unused predictive cache entries past the TTL whose demand has gone, by host and model."""
    ttl = float(led.policy.predictive_cache_ttl_seconds)
    demanded = {ms.req.model_id for ms in led.models if ms.wanted > 0 or ms.entries or ms.retained}
    keep = {(a.host_id, a.model_id) for a in advised}
    pins = {(h, ms.req.model_id) for ms in led.models for h in ms.req.pins}
    out: list[CacheEviction] = []
    for hs in sorted(led.hosts, key=lambda h: h.host_id):
        snap = hs.snap
        if EVICT_CAPABILITY not in snap.actuator_capabilities:
            continue
        # A "cached" residency is the same artifact on disk, not a running engine.
        resident = {r.model_id for r in snap.residencies if r.state != "cached"}
        for art in sorted(snap.cached, key=lambda a: (a.model_id, a.sha256)):
            age = art.cached_age_seconds
            if not art.predictive or age is UNSET or not art.sha256:
                continue
            mid = art.model_id
            if (
                float(age) < ttl  # type: ignore[arg-type]
                or mid in demanded
                or mid in resident
                or mid in hs.desired
                or (hs.host_id, mid) in keep
                or (hs.host_id, mid) in pins
            ):
                continue
            out.append(
                CacheEviction(
                    host_id=hs.host_id,
                    model_id=mid,
                    artifact_sha256=art.sha256.lower(),
                    size_bytes=max(0, int(art.size_bytes)),
                    reason=R.PREDICTIVE_CACHE_EXPIRED,
                    age_seconds=float(age),  # type: ignore[arg-type]
                )
            )
    return tuple(out)
