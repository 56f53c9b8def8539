"""Compile a ``PlannerInput`` into a fresh ``Ledger`` (step one of placement, when a ``Placer`` is built).

Profiles become ``ModelState``s (wanted replicas, tiers, harm order, concurrency boost); hosts
are grouped into ``HostClass``es (hosts indistinguishable to every compatibility check and
class-level scorer) and, within a class, buckets of equal load level and throttling. Each
model's "special" hosts (anything model-specific: residency, cached weights, measurements,
learned timings, pending commands, explicit host lists) are scored one by one; every other host is scored
through its class. Static eligibility is computed once per (class, requirement signature).
"""

from __future__ import annotations

import math

from grid.events.control import ModelProfile
from grid.fleet.planning import DemandTarget, PlannerInput, Policy, TimingSample
from grid.fleet.qualification import qualified_hosts
from grid.fleet.quarantine import quarantined
from grid.fleet.views import HostView
from grid.planner import scoring as S
from grid.planner.feasibility import (
    CHAIN,
    Bucket,
    HostClass,
    ModelReq,
    load_level,
    new_work_allocatable_mb,
    tier_index,
)
from grid.planner.ledger import Ledger
from grid.planner.state import PlacementFleet, HostState, ModelState


def compile_input(inp: PlannerInput, *, reference_scan: bool = False) -> Ledger:
    now = float(inp.now)
    policy = inp.policy
    profiles: dict[str, ModelProfile] = {}
    # A later duplicate wins (input order is part of the input bytes).
    for p in inp.profiles:
        profiles[p.model_id] = p
    ids = sorted(profiles)
    excl = _exclusions(profiles, ids)
    models = _models(inp, profiles, ids, excl)

    # Timing samples: (host, model) -> sample with the most samples (then later input).
    timings: dict[tuple[str, str], TimingSample] = {}
    for t in inp.timings:
        k = (t.host_id, t.model_id)
        prev = timings.get(k)
        if prev is None or t.samples >= prev.samples:
            timings[k] = t

    # Hosts, sorted by id (a later duplicate snapshot of the same id wins).
    snaps: dict[str, HostView] = {}
    for h in inp.hosts:
        snaps[h.host_id] = h
    max_bw = max(
        (float(s.resources.memory_bandwidth_gbps or 0.0) for s in snaps.values()),
        default=0.0,
    )
    max_gf = max(
        (float(s.resources.compute_gflops or 0.0) for s in snaps.values()),
        default=0.0,
    )
    hosts, classes = _hosts(snaps, now, policy, max_bw, max_gf)
    held_models = _quarantine(hosts, inp)
    led = Ledger(
        now=now,
        policy=policy,
        hosts=hosts,
        classes=classes,
        fleet=PlacementFleet(hosts, classes),
        models=models,
        excl=excl,
        timings=timings,
        max_bw=max_bw,
        max_gf=max_gf,
        reference_scan=reference_scan,
        held_models=held_models,
    )
    led.pending = frozenset((p.host_id, p.model_id) for p in inp.pending)
    _special_hosts(led, ids)
    led.count_eligible()
    return led


def _exclusions(
    profiles: dict[str, ModelProfile], ids: list[str]
) -> dict[str, frozenset[str]]:
    """Symmetric co-location exclusions: declared by either profile, enforced both ways."""
    excl: dict[str, set[str]] = {m: set() for m in ids}
    for m in ids:
        for x in profiles[m].colocation_excludes:
            if x == m:
                continue
            excl[m].add(x)
            excl.setdefault(x, set()).add(m)
    return {k: frozenset(v) for k, v in excl.items()}


def _models(
    inp: PlannerInput,
    profiles: dict[str, ModelProfile],
    ids: list[str],
    excl: dict[str, frozenset[str]],
) -> list[ModelState]:
    retired = set(inp.retired)
    demand: dict[str, DemandTarget] = {}
    for d in inp.demand:
        if d.model_id in profiles and d.model_id not in retired:
            prev = demand.get(d.model_id)
            if prev is None or d.replicas > prev.replicas:
                demand[d.model_id] = d
    models: list[ModelState] = []
    for i, m in enumerate(ids):
        p = profiles[m]
        req = ModelReq.compile(p, excl.get(m, frozenset()), qualified_hosts(p, inp.hosts))
        d = demand.get(m)
        is_retired = m in retired
        n_pins = len(req.pins)
        if is_retired:
            wanted = 0
        else:
            dr = 0
            if d is not None:
                dr = max(0, int(d.replicas))
                if d.canary:
                    dr = min(dr, 1)
            base = max(int(p.min_replicas), dr)
            wanted = max(0, min(base, int(p.max_replicas)))
            wanted = max(wanted, n_pins)
        if d is not None and d.evidence == "baseline":
            n_base = wanted
        else:
            n_base = min(wanted, max(int(p.min_replicas), n_pins))
        tail = d.evidence if d is not None else "baseline"
        if n_pins:
            label = "pin"
        elif n_base >= wanted > 0:
            label = "baseline"
        elif d is not None:
            label = d.evidence
        else:
            label = "none"
        h = d.harm if d is not None else None
        harm_key = (
            (-h.queue, -h.latency_ratio, -h.errors, -h.concurrency, -h.rate)
            if h is not None
            else (0.0, 0.0, 0.0, 0.0, 0.0)
        )
        harm_key = tuple(float(x) if math.isfinite(x) else 0.0 for x in harm_key)
        models.append(
            ModelState(
                idx=i,
                req=req,
                profile=p,
                priority=int(p.priority),
                retired=is_retired,
                wanted=wanted,
                n_base=n_base,
                tail_evidence=tail,
                evidence_label=label,
                demand=d,
                harm_key=harm_key,
                boost=S.concurrency_boost(p, d),
            )
        )
    return models


def _hosts(
    snaps: dict[str, HostView],
    now: float,
    policy: Policy,
    max_bw: float,
    max_gf: float,
) -> tuple[list[HostState], list[HostClass]]:
    classes: dict[tuple, HostClass] = {}
    class_list: list[HostClass] = []
    buckets: dict[tuple[int, int, bool], Bucket] = {}
    hosts: list[HostState] = []
    for hi, hid in enumerate(sorted(snaps)):
        snap = snaps[hid]
        res = snap.resources
        life = CHAIN.host_lifecycle(snap, now, policy)
        if life is not None:
            key: tuple = (False, life[0])
            hw = 0.0
        else:
            hw = S.score_hardware(
                res.memory_bandwidth_gbps, res.compute_gflops, max_bw, max_gf
            )
            key = (
                True,
                tuple(sorted(set(res.runtimes))),
                tuple(sorted(set(res.backends))),
                tuple(sorted(set(res.tags))),
                res.data_tier,
                int(res.gpu_count),
                int(res.gpu_memory_mb),
                hw,
                snap.disk_free_bytes is not None,
            )
        cls = classes.get(key)
        if cls is None:
            ti = tier_index(res.data_tier)
            cls = HostClass(
                idx=len(class_list),
                key=key,
                resources=res,
                eligible=life is None,
                lifecycle_reason=None if life is None else life[0],
                hw_score=hw,
                disk_known=snap.disk_free_bytes is not None,
                runtime_set=frozenset(res.runtimes),
                backend_set=frozenset(res.backends),
                tag_set=frozenset(res.tags),
                tier=-1 if ti is None else ti,
            )
            classes[key] = cls
            class_list.append(cls)
        cap_new = new_work_allocatable_mb(res, snap.state)
        lvl = load_level(snap)
        bucket = None
        if life is None:
            bkey = (cls.idx, lvl, snap.state == "throttled")
            bucket = buckets.get(bkey)
            if bucket is None:
                bucket = Bucket(cls, lvl, snap.state == "throttled")
                buckets[bkey] = bucket
                cls.buckets.append(bucket)
            bucket.domains.add(res.failure_domain)
            cls.caps.append(cap_new)
        cls.hosts.append(hi)
        cls.domains.add(res.failure_domain)
        hosts.append(
            HostState(
                hi, snap, cls, bucket, life, cap_new, lvl, policy.disk_reserve_bytes
            )
        )
    for cls in class_list:
        cls.caps.sort()
        cls.buckets.sort(key=lambda b: (b.load_level, b.throttled))
    return hosts, class_list


def _quarantine(hosts: list[HostState], inp: PlannerInput) -> set[str]:
    """Mark flap-quarantined hosts and models before the placement index is built (a quarantined
    host is never open for new work); returns the quarantined models, one set every host shares
    (Placer lifts a model's hold while it places the model's only replica)."""
    held_models = set(quarantined(inp.flap_quarantines, "model"))
    held_hosts = quarantined(inp.flap_quarantines, "host")
    for hs in hosts:
        hs.flap_quarantined = hs.host_id in held_hosts
        hs.held_models = held_models
    return held_models


def _special_hosts(led: Ledger, ids: list[str]) -> None:
    """Per-model hosts that score differently from their class (see the module docstring)."""
    hosts = led.hosts
    by_id = led.fleet.by_id
    special: dict[str, set[int]] = {m: set() for m in ids}
    by_sha: dict[str, list[str]] = {}
    for m in ids:
        sha = led.by_model[m].req.sha
        if sha:
            by_sha.setdefault(sha, []).append(m)
    for hs in hosts:
        snap = hs.snap
        for r in snap.residencies:
            if r.model_id in special:
                special[r.model_id].add(hs.idx)
            if r.artifact_sha256:
                for m in by_sha.get(r.artifact_sha256.lower(), ()):
                    special[m].add(hs.idx)
        for a in snap.cached:
            if a.model_id in special:
                special[a.model_id].add(hs.idx)
            for m in by_sha.get(a.sha256.lower(), ()):
                special[m].add(hs.idx)
        for m, tps in snap.measured_tokens_per_second.items():
            if m in special and S.valid_tps(tps) is not None:
                special[m].add(hs.idx)
    for hid, m in (*led.timings, *led.pending):
        if m in special and hid in by_id:
            special[m].add(by_id[hid].idx)
    for ms in led.models:
        sp = special[ms.req.model_id]
        explicit_ids = ms.req.pins or (
            tuple(sorted(ms.req.allow)) if ms.req.allow is not None else ()
        )
        if not explicit_ids and ms.req.qualified is not None:
            explicit_ids = tuple(sorted(ms.req.qualified))
        if explicit_ids or ms.req.qualified is not None:
            ms.explicit = True
            for hid in explicit_ids:
                hs = by_id.get(hid)
                if hs is not None:
                    sp.add(hs.idx)
        ms.special = tuple(sorted(sp))
        ms.special_set = frozenset(sp)
        best = 0.0
        for hi in ms.special:
            t = S.valid_tps(hosts[hi].snap.measured_tokens_per_second.get(ms.req.model_id))
            if t is not None and t > best:
                best = t
        ms.max_tps = best
