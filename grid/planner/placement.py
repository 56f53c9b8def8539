"""Deterministic placement: compile, seed incumbents, pins, fair priority rounds.

The engine (``Engine``) holds one plan's mutable state. Its phases, in order:

1. compile profiles into ``ModelReq`` and group hosts into ``HostClass``es; per-model static
   eligibility is computed once per (class, requirement signature);
2. ledgers start from live inventory; immovable residencies (external or operator-pinned) and
   unmanaged memory consume capacity first;
3. healthy live managed incumbents that still satisfy every hard constraint keep their slot
   (higher priority, then more constrained models first). An incumbent that no longer fits
   (capacity, policy, failure-domain spread) must move; one that breaks a lowered model
   ceiling or a tightened co-location rule is drained by a convergence preemption;
4. hard pins are reserved first, on their exact hosts;
5. priority classes fill from high to low; within a class, baseline replicas, then direct
   demand, then inferred-only prewarms, one replica per model per round (max-min fair) in
   the order: fewer eligible hosts, larger memory, greater attributable harm, model id;
   a replica that finds no host tries bounded repair (repair.py), then staged preemption
   (preemption.py; never for inferred-only demand);
6. make-before-break: a must-move incumbent stays in the desired set while the model would
   otherwise have fewer ready replicas than wanted.

Candidate selection is exact: it returns the host with the highest total score (ties: smaller
host id) as a full scan would, but scans per host class (see state.py) with an upper bound that
prunes classes that cannot win. ``Engine(naive=True)`` performs the plain full scan and is used
by tests to prove both give the same plan.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, field

from grid.events.control import ModelProfile
from grid.planner import reasons as R
from grid.planner import scoring as S
from grid.planner.feasibility import (
    CHAIN,
    DEFAULT_RUNTIMES,
    HEALTHY_STATES,
    LIVE_STATES,
    Bucket,
    HostClass,
    ModelReq,
    Rejection,
    artifact_cached,
    load_level,
    matching_runtimes,
    new_work_allocatable_mb,
    runtime_memory,
    tier_index,
)
from grid.planner.state import FleetState, HostState, Slot
from grid.planner.types import (
    DemandTarget,
    HostSnapshot,
    PlannerInput,
    Preemption,
    ResidencyView,
    TimingSample,
)

TIERS: tuple[str, ...] = ("baseline", "direct", "inferred")
TIER_REASON = {"baseline": R.BASELINE, "direct": R.DIRECT, "inferred": R.INFERRED}


@dataclass(slots=True, eq=False)
class Candidate:
    score: float
    host_id: str
    hidx: int
    runtime: str
    memory_mb: int
    disk_bytes: int
    values: tuple[float, ...]

    def beats(self, other: Candidate | None) -> bool:
        if other is None:
            return True
        if self.score != other.score:
            return self.score > other.score
        return self.host_id < other.host_id


@dataclass(slots=True, eq=False)
class MustMove:
    hidx: int
    residency: ResidencyView
    reason: str
    detail: str
    preempted: bool = False


@dataclass(slots=True, eq=False)
class Entry:
    """A compliant desired replica of a model (kept, immovable or new)."""

    hidx: int
    slot: Slot
    status: str  # existing | new
    reason: str
    managed: bool
    values: tuple[float, ...]
    score: float


@dataclass(slots=True, eq=False)
class ModelState:
    idx: int
    req: ModelReq
    profile: ModelProfile
    priority: int
    retired: bool
    wanted: int
    n_base: int
    tail_evidence: str
    evidence_label: str
    demand: DemandTarget | None
    harm_key: tuple[float, ...]
    boost: float
    # static eligibility
    class_mem: dict[int, tuple[str, int]] = field(default_factory=dict)
    class_order: list[tuple[float, int]] = field(default_factory=list)
    special: tuple[int, ...] = ()
    special_set: frozenset[int] = frozenset()
    explicit: bool = False
    eligible_count: int = 0
    max_tps: float = 0.0
    # dynamic
    entries: list[Entry] = field(default_factory=list)
    staged: int = 0  # replicas waiting for a staged preemption (victims drain first)
    awaiting: int = (
        0  # replicas waiting for obsolete residencies that are already leaving
    )
    staged_hosts: list[str] = field(default_factory=list)
    used_domains: Counter = field(default_factory=Counter)
    mustmove: list[MustMove] = field(default_factory=list)
    retained: list[MustMove] = field(default_factory=list)
    blocked: bool = False
    shortfalls: list[tuple[str, str]] = field(default_factory=list)
    budget_blocked: bool = (
        False  # a preemption was possible but policy.max_evictions was reached
    )
    placement_budget: bool = False  # policy.max_new_placements was reached

    @property
    def progress(self) -> int:
        return len(self.entries) + self.staged + self.awaiting

    def tier_of(self, index: int) -> str:
        return "baseline" if index < self.n_base else self.tail_evidence

    def domain_target(self) -> int:
        return max(0, min(int(self.profile.min_failure_domains), self.wanted))


def _valid_tps(x: float | None) -> float | None:
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0.0:
        return None
    return float(x)


class Engine:
    def __init__(self, inp: PlannerInput, *, naive: bool = False) -> None:
        self.inp = inp
        self.now = float(inp.now)
        self.policy = inp.policy
        self.headroom = max(0.0, float(inp.policy.admission_headroom_fraction))
        self.naive = naive
        self.preemptions: list[Preemption] = []
        self.evictions = 0
        self.repair_steps = 0
        self.new_count = 0
        # Extra bytes an uncached artifact must leave free for the replica being placed now.
        self.disk_extra = 0
        self.predictive_extra = max(
            0,
            int(inp.policy.predictive_disk_reserve_bytes)
            - int(inp.policy.disk_reserve_bytes),
        )
        # priority class -> host idx -> number of movable new placements (repair scope)
        self.movable: dict[int, Counter[int]] = {}
        # priority class -> sum over movable new placements of (memory - model's minimum memory)
        self.repair_slack: dict[int, int] = {}
        # host idx -> model ids of obsolete live residencies (released by the reconciler)
        self.leaving_models: dict[int, set[str]] = {}
        # host idx -> must-move residencies on that host (preemption victims)
        self.mustmove_on: dict[int, list[tuple[ModelState, MustMove]]] = {}
        self._compat_memo: dict[tuple[int, tuple], Rejection | None] = {}
        self._static_memo: dict[tuple[int, int], Rejection | None] = {}
        self._cached_memo: dict[tuple[int, int], bool] = {}
        self._class_values: dict[tuple[int, int], tuple[float, ...]] = {}
        self._domain_caps_memo: dict[int, dict[str, int]] = {}
        self._release: tuple[list[tuple[int, int]], set[int]] | None = None
        self._scarcity_index: dict[int, tuple[list[int], list[tuple]]] = {}
        self._compile()

    # ==================================================================================
    # Compilation
    # ==================================================================================
    def _compile(self) -> None:
        inp = self.inp
        profiles: dict[str, ModelProfile] = {}
        # A later duplicate wins (input order is part of the input bytes).
        for p in inp.profiles:
            profiles[p.model_id] = p
        self.profiles = profiles
        ids = sorted(profiles)
        # Symmetric co-location exclusions: declared by either profile, enforced both ways.
        excl: dict[str, set[str]] = {m: set() for m in ids}
        for m in ids:
            for x in profiles[m].colocation_excludes:
                if x == m:
                    continue
                excl[m].add(x)
                excl.setdefault(x, set()).add(m)
        self.excl = {k: frozenset(v) for k, v in excl.items()}
        retired = set(inp.retired)
        demand: dict[str, DemandTarget] = {}
        for d in inp.demand:
            if d.model_id in profiles and d.model_id not in retired:
                prev = demand.get(d.model_id)
                if prev is None or d.replicas > prev.replicas:
                    demand[d.model_id] = d
        self.models: list[ModelState] = []
        self.by_model: dict[str, ModelState] = {}
        for i, m in enumerate(ids):
            p = profiles[m]
            req = ModelReq.compile(p, self.excl.get(m, frozenset()))
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
            ms = ModelState(
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
            self.models.append(ms)
            self.by_model[m] = ms

        # Timing samples: (host, model) -> sample with the most samples (then later input).
        timings: dict[tuple[str, str], TimingSample] = {}
        for t in inp.timings:
            k = (t.host_id, t.model_id)
            prev = timings.get(k)
            if prev is None or t.samples >= prev.samples:
                timings[k] = t
        self.timings = timings

        # Hosts, sorted by id (a later duplicate snapshot of the same id wins).
        snaps: dict[str, HostSnapshot] = {}
        for h in inp.hosts:
            snaps[h.host_id] = h
        host_ids = sorted(snaps)
        # Fleet-wide hardware maxima for the hardware prior.
        self.max_bw = max(
            (float(s.resources.memory_bandwidth_gbps or 0.0) for s in snaps.values()),
            default=0.0,
        )
        self.max_gf = max(
            (float(s.resources.compute_gflops or 0.0) for s in snaps.values()),
            default=0.0,
        )
        classes: dict[tuple, HostClass] = {}
        class_list: list[HostClass] = []
        buckets: dict[tuple[int, int, bool], Bucket] = {}
        hosts: list[HostState] = []
        self.lifecycle_counts: Counter[str] = Counter()
        for hi, hid in enumerate(host_ids):
            snap = snaps[hid]
            res = snap.resources
            life = CHAIN.host_lifecycle(snap, self.now, self.policy)
            if life is not None:
                key: tuple = (False, life[0])
                hw = 0.0
            else:
                hw = S.score_hardware(
                    res.memory_bandwidth_gbps,
                    res.compute_gflops,
                    self.max_bw,
                    self.max_gf,
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
            if life is not None:
                self.lifecycle_counts[life[0]] += 1
            hosts.append(
                HostState(
                    hi,
                    snap,
                    cls,
                    bucket,
                    life,
                    cap_new,
                    lvl,
                    self.policy.disk_reserve_bytes,
                )
            )
        for cls in class_list:
            cls.caps.sort()
            cls.buckets.sort(key=lambda b: (b.load_level, b.throttled))
        self.fleet = FleetState(hosts, class_list)
        self.hosts = hosts
        self.classes = class_list
        # Best-fit normalisation: the largest new-work memory in the fleet.
        self.fit_scale = max((h.cap_new for h in hosts if h.eligible), default=1) or 1

        # Per-model "special" hosts: anything model-specific (residency, cached weights,
        # measurements, learned timings) makes a host score differently from its class.
        special: dict[str, set[int]] = {m: set() for m in ids}
        by_sha: dict[str, list[str]] = {}
        for m in ids:
            sha = self.by_model[m].req.sha
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
                if m in special and _valid_tps(tps) is not None:
                    special[m].add(hs.idx)
        for hid, m in timings:
            if m in special and hid in self.fleet.by_id:
                special[m].add(self.fleet.by_id[hid].idx)
        for ms in self.models:
            sp = special[ms.req.model_id]
            explicit_ids = ms.req.pins or (
                tuple(sorted(ms.req.allow)) if ms.req.allow is not None else ()
            )
            if explicit_ids:
                ms.explicit = True
                for hid in explicit_ids:
                    hs = self.fleet.by_id.get(hid)
                    if hs is not None:
                        sp.add(hs.idx)
            ms.special = tuple(sorted(sp))
            ms.special_set = frozenset(sp)
            best = 0.0
            for hi in ms.special:
                t = _valid_tps(
                    hosts[hi].snap.measured_tokens_per_second.get(ms.req.model_id)
                )
                if t is not None and t > best:
                    best = t
            ms.max_tps = best

        self._static_eligibility()

    # ----------------------------------------------------------------------------------
    def compat(self, cls: HostClass, req: ModelReq) -> Rejection | None:
        key = (cls.idx, req.compat_key)
        try:
            return self._compat_memo[key]
        except KeyError:
            r = CHAIN.class_compat(cls, req)
            self._compat_memo[key] = r
            return r

    def class_verdict(self, cls: HostClass, ms: ModelState) -> Rejection | None:
        """Class-level static verdict for an uncached host (policy and memory excluded)."""
        if not cls.eligible:
            return (cls.lifecycle_reason or "", "")
        r = self.compat(cls, ms.req)
        if r is not None:
            return r
        return CHAIN.class_disk(cls, ms.req)

    def cached(self, hs: HostState, ms: ModelState) -> bool:
        if hs.idx not in ms.special_set:
            return False
        key = (hs.idx, ms.idx)
        v = self._cached_memo.get(key)
        if v is None:
            v = artifact_cached(hs.snap, ms.req)
            self._cached_memo[key] = v
        return v

    def host_static(self, hs: HostState, ms: ModelState) -> Rejection | None:
        """Full static chain for one host: lifecycle, policy, compatibility, static capacity."""
        key = (hs.idx, ms.idx)
        if key in self._static_memo:
            return self._static_memo[key]
        cls = hs.cls
        r = hs.lifecycle
        if r is None:
            r = CHAIN.host_policy(hs.host_id, ms.req)
        if r is None:
            r = self.compat(cls, ms.req)
        if r is None:
            _, mem = self.runtime_for(cls, ms)
            r = CHAIN.host_capacity(cls, hs.cap_new, mem, ms.req, self.cached(hs, ms))
        self._static_memo[key] = r
        return r

    def runtime_for(self, cls: HostClass, ms: ModelState) -> tuple[str, int]:
        rm = ms.class_mem.get(cls.idx)
        if rm is None:
            rm = runtime_memory(ms.req, matching_runtimes(cls, ms.req))
            assert rm is not None
        return rm

    def _static_eligibility(self) -> None:
        # Group models by requirement signature: the class compatibility scan runs once each.
        passing: dict[tuple, list[HostClass]] = {}
        for ms in self.models:
            key = ms.req.compat_key
            lst = passing.get(key)
            if lst is None:
                lst = [
                    c
                    for c in self.classes
                    if c.eligible
                    and self.compat(c, ms.req) is None
                    and CHAIN.class_disk(c, ms.req) is None
                ]
                passing[key] = lst
            count = 0
            for cls in lst:
                rm = runtime_memory(ms.req, matching_runtimes(cls, ms.req))
                assert rm is not None
                ms.class_mem[cls.idx] = rm
                if not ms.explicit:
                    count += len(cls.caps) - bisect_left(cls.caps, rm[1])
            if not ms.explicit:
                for hid in sorted(ms.req.deny):
                    hs = self.fleet.by_id.get(hid)
                    if hs is not None and self._class_counts(hs, ms):
                        count -= 1
            for hi in ms.special:
                hs = self.hosts[hi]
                counted = (
                    (not ms.explicit)
                    and self._class_counts(hs, ms)
                    and hs.host_id not in ms.req.deny
                )
                if not counted and self.host_static(hs, ms) is None:
                    count += 1
            ms.eligible_count = count

    def _class_counts(self, hs: HostState, ms: ModelState) -> bool:
        """Is this host counted as eligible by the class path (ignoring deny lists)?"""
        rm = ms.class_mem.get(hs.cls.idx)
        return hs.eligible and rm is not None and hs.cap_new >= rm[1]

    def eligible_domains(self, ms: ModelState, limit: int, exclude=()) -> set[str]:
        """Up to `limit` failure domains, not in `exclude`, that hold a statically eligible host."""
        out: set[str] = set()
        if limit <= 0:
            return out
        for hi in ms.special:
            hs = self.hosts[hi]
            if (
                hs.domain not in exclude
                and hs.domain not in out
                and self.host_static(hs, ms) is None
            ):
                out.add(hs.domain)
                if len(out) >= limit:
                    return out
        if ms.explicit:
            return out
        if ms.req.deny:
            for ci in sorted(ms.class_mem):
                mem = ms.class_mem[ci][1]
                for hi in self.classes[ci].hosts:
                    hs = self.hosts[hi]
                    if (
                        hs.domain in exclude
                        or hs.domain in out
                        or hs.cap_new < mem
                        or hs.host_id in ms.req.deny
                    ):
                        continue
                    out.add(hs.domain)
                    if len(out) >= limit:
                        return out
            return out
        for ci in sorted(ms.class_mem):
            cls = self.classes[ci]
            mem = ms.class_mem[ci][1]
            if cls.caps[-1] < mem:
                continue
            for d, cap in self._domain_caps(cls).items():
                if cap >= mem and d not in exclude and d not in out:
                    out.add(d)
                    if len(out) >= limit:
                        return out
        return out

    def _domain_caps(self, cls: HostClass) -> dict[str, int]:
        v = self._domain_caps_memo.get(cls.idx)
        if v is None:
            v = {}
            for hi in cls.hosts:
                hs = self.hosts[hi]
                if hs.cap_new > v.get(hs.domain, -1):
                    v[hs.domain] = hs.cap_new
            self._domain_caps_memo[cls.idx] = v
        return v

    # ==================================================================================
    # Scoring
    # ==================================================================================
    def scarcity(self, cls: HostClass, ms: ModelState) -> float:
        """Penalty when a more constrained model of equal or higher priority needs this class."""
        idx = self._scarcity_index.get(cls.idx)
        if idx is None:
            entries = sorted(
                (
                    (-o.priority, o.eligible_count, o.idx)
                    for o in self.models
                    if o.wanted > 0 and cls.idx in o.class_mem
                ),
            )
            # prefix minima of the two smallest (eligible_count, idx) pairs
            keys: list[int] = []
            pref: list[tuple] = []
            a: tuple | None = None
            b: tuple | None = None
            for negp, e, i in entries:
                cand = (e, i)
                if a is None or cand < a:
                    a, b = cand, a
                elif b is None or cand < b:
                    b = cand
                keys.append(negp)
                pref.append((a, b))
            idx = (keys, pref)
            self._scarcity_index[cls.idx] = idx
        keys, pref = idx
        # entries with priority >= ms.priority are those with -priority <= -ms.priority
        j = bisect_right(keys, -ms.priority)
        if j == 0:
            return 0.0
        a, b = pref[j - 1]
        best = a if (a is not None and a[1] != ms.idx) else b
        if best is None:
            return 0.0
        return S.score_scarcity(best[0], ms.eligible_count)

    def class_values(self, cls: HostClass, ms: ModelState) -> tuple[float, ...]:
        """Scorer values for a plain (non-special) host of the class; domain, fit, load and
        throttling are placeholders (0) filled in per bucket and host."""
        key = (cls.idx, ms.idx)
        v = self._class_values.get(key)
        if v is None:
            st = S.score_startup(S.startup_seconds(ms.profile, None, False, ms.req.sha))
            v = (
                0.0,  # resident
                0.0,  # cached
                0.0,  # domain (dynamic)
                0.0,  # throughput
                cls.hw_score,
                0.0,  # fit (dynamic)
                st,
                0.0,  # sticky
                self.scarcity(cls, ms),
                0.0,  # load (bucket)
                0.0,  # throttled (bucket)
                0.0,  # failed
            )
            self._class_values[key] = v
        return v

    def host_values(
        self,
        hs: HostState,
        ms: ModelState,
        mem: int,
        incumbent: ResidencyView | None = None,
    ) -> tuple[float, ...]:
        """Scorer values for one host (special hosts, incumbents and the naive scan)."""
        cls = hs.cls
        fit = S.score_fit(hs.free_b, mem, self.fit_scale)
        load = S.score_load(hs.load_level)
        thr = S.score_throttled(hs.throttled)
        new_domain = hs.domain not in ms.used_domains
        if incumbent is None and hs.idx not in ms.special_set:
            return _values(self.class_values(cls, ms), new_domain, fit, load, thr)
        mid = ms.req.model_id
        snap = hs.snap
        cached = self.cached(hs, ms)
        tps = _valid_tps(snap.measured_tokens_per_second.get(mid))
        res = cls.resources
        hw = (
            0.0
            if tps is not None
            else S.score_hardware(
                res.memory_bandwidth_gbps, res.compute_gflops, self.max_bw, self.max_gf
            )
        )
        sample = self.timings.get((hs.host_id, mid))
        st = S.score_startup(
            S.startup_seconds(
                ms.profile, sample, cached or incumbent is not None, ms.req.sha
            )
        )
        sticky = False
        if incumbent is not None:
            if incumbent.loaded_at is not None:
                sticky = (
                    self.now - incumbent.loaded_at < ms.profile.min_residency_seconds
                )
            else:
                sticky = True
        existing = hs.residencies.get(mid)
        failed = (
            existing is not None and existing.state == "failed" and incumbent is None
        )
        return (
            S.score_resident(incumbent.state if incumbent is not None else None),
            S.score_cached(cached),
            S.score_domain(new_domain),
            S.score_throughput(tps, ms.max_tps),
            hw,
            fit,
            st,
            S.score_sticky(sticky),
            self.scarcity(cls, ms),
            load,
            thr,
            S.score_failed(failed),
        )

    # ==================================================================================
    # Candidate selection
    # ==================================================================================
    def disk_need(self, hs: HostState, ms: ModelState) -> int:
        if ms.req.disk_bytes is None or self.cached(hs, ms):
            return 0
        return ms.req.disk_bytes

    def feasible(
        self, hs: HostState, ms: ModelState
    ) -> tuple[Rejection | None, str, int, int]:
        """Static + dynamic verdict for placing one new replica of ms on hs."""
        r = self.host_static(hs, ms)
        if r is not None:
            return r, "", 0, 0
        rt, mem = self.runtime_for(hs.cls, ms)
        disk = self.disk_need(hs, ms)
        r = CHAIN.dynamic_check(
            hs, ms.req, mem, disk + self.disk_extra if disk else 0, self.headroom
        )
        return r, rt, mem, disk

    def _eval_host(
        self, hs: HostState, ms: ModelState, need_new_domain: bool
    ) -> Candidate | None:
        if need_new_domain and hs.domain in ms.used_domains:
            return None
        r, rt, mem, disk = self.feasible(hs, ms)
        if r is not None:
            return None
        values = self.host_values(hs, ms, mem)
        return Candidate(
            S.combine(values, ms.boost), hs.host_id, hs.idx, rt, mem, disk, values
        )

    def _class_upper_bounds(self, ms: ModelState) -> list[tuple[float, int]]:
        """Eligible classes by an upper bound on any member's score (new domain, perfect
        fit, no load or throttling penalty), best first. Computed once per model."""
        if not ms.class_order and ms.class_mem and not ms.explicit:
            order = []
            for ci in ms.class_mem:
                v = self.class_values(self.classes[ci], ms)
                ub = S.combine(_values(v, True, 100.0, 0.0, 0.0), ms.boost)
                order.append((-ub, ci))
            order.sort()
            ms.class_order = order
        return ms.class_order

    def best_host(self, ms: ModelState, need_new_domain: bool) -> Candidate | None:
        """The feasible host with the highest score (ties: smaller host id), exactly as a full
        scan would find it: special hosts one by one, every other host through its bucket."""
        if self.naive:
            return self._best_host_naive(ms, need_new_domain)
        best: Candidate | None = None
        hosts = self.hosts
        for hi in ms.special:
            c = self._eval_host(hosts[hi], ms, need_new_domain)
            if c is not None and c.beats(best):
                best = c
        if ms.explicit:
            return best
        used = ms.used_domains
        deny = ms.req.deny
        special = ms.special_set
        headroom = self.headroom
        req = ms.req
        dyn = CHAIN.dynamic_check
        boost = ms.boost
        scale = self.fit_scale
        disk = req.disk_bytes or 0
        disk_check = disk + self.disk_extra if disk else 0
        for neg_ub, ci in self._class_upper_bounds(ms):
            if best is not None and -neg_ub < best.score:
                break
            cls = self.classes[ci]
            rt, mem = ms.class_mem[ci]
            base = self.class_values(cls, ms)
            for b in cls.buckets:
                lst = b.open
                if not lst:
                    continue
                load = S.score_load(b.load_level)
                thr = S.score_throttled(b.throttled)
                if (
                    best is not None
                    and S.combine(_values(base, True, 100.0, load, thr), boost)
                    < best.score
                ):
                    continue
                look_new = bool(used) and any(d not in used for d in b.domains)
                if need_new_domain and not look_new:
                    continue
                i = bisect_left(lst, (mem, "", -1))
                n = len(lst)
                first_any: HostState | None = None
                first_new: HostState | None = None
                while i < n:
                    _, hid, hi = lst[i]
                    i += 1
                    if hi in special or hid in deny:
                        continue
                    hs = hosts[hi]
                    is_new = hs.domain not in used
                    if not is_new and (first_any is not None or need_new_domain):
                        continue
                    if dyn(hs, req, mem, disk_check, headroom) is not None:
                        continue
                    if is_new:
                        first_new = hs
                        break
                    first_any = hs
                    if not look_new:
                        break
                for hs in (first_any, first_new):
                    if hs is None:
                        continue
                    values = _values(
                        base,
                        hs.domain not in used,
                        S.score_fit(hs.free_b, mem, scale),
                        load,
                        thr,
                    )
                    c = Candidate(
                        S.combine(values, boost),
                        hs.host_id,
                        hs.idx,
                        rt,
                        mem,
                        disk,
                        values,
                    )
                    if c.beats(best):
                        best = c
        return best

    def _best_host_naive(
        self, ms: ModelState, need_new_domain: bool
    ) -> Candidate | None:
        best: Candidate | None = None
        for hs in self.hosts:
            c = self._eval_host(hs, ms, need_new_domain)
            if c is not None and c.beats(best):
                best = c
        return best

    def needs_new_domain(self, ms: ModelState) -> bool:
        target = ms.domain_target()
        if len(ms.used_domains) >= target:
            return False
        return bool(self.eligible_domains(ms, 1, exclude=ms.used_domains))

    def choose(self, ms: ModelState) -> Candidate | None:
        if self.needs_new_domain(ms):
            c = self.best_host(ms, True)
            if c is not None:
                return c
        return self.best_host(ms, False)

    # ==================================================================================
    # Ledger mutations
    # ==================================================================================
    def commit_new(
        self,
        ms: ModelState,
        c: Candidate,
        reason: str,
        round_class: int,
        pinned_phase: bool = False,
    ) -> Entry:
        slot = Slot(
            model_id=ms.req.model_id,
            kind="new",
            memory_mb=c.memory_mb,
            runtime=c.runtime,
            disk_bytes=c.disk_bytes,
            priority=ms.priority,
            reason=reason,
            round_class=round_class,
            pinned_phase=pinned_phase,
        )
        e = Entry(c.hidx, slot, "new", reason, True, c.values, c.score)
        self.recommit_new(ms, e)
        return e

    def recommit_new(self, ms: ModelState, e: Entry) -> None:
        """Add a new-placement entry to the ledgers (also used to undo an uncommit exactly)."""
        hs = self.hosts[e.hidx]
        slot = e.slot
        hs.free_a -= slot.memory_mb
        hs.free_b -= slot.memory_mb
        hs.disk_used += slot.disk_bytes
        hs.add_desired(slot, ms.req)
        self.fleet.reindex(hs)
        ms.entries.append(e)
        ms.used_domains[hs.domain] += 1
        self.new_count += 1
        if not slot.pinned_phase:
            self.movable.setdefault(slot.round_class, Counter())[hs.idx] += 1
            self.repair_slack[slot.round_class] = (
                self.repair_slack.get(slot.round_class, 0)
                + slot.memory_mb
                - min_memory(ms.profile)
            )

    def uncommit_new(self, ms: ModelState, e: Entry) -> None:
        hs = self.hosts[e.hidx]
        slot = hs.remove_desired(ms.req.model_id, ms.req)
        assert slot is e.slot and slot.kind == "new"
        hs.free_a += slot.memory_mb
        hs.free_b += slot.memory_mb
        hs.disk_used -= slot.disk_bytes
        self.fleet.reindex(hs)
        ms.entries.remove(e)
        ms.used_domains[hs.domain] -= 1
        if ms.used_domains[hs.domain] <= 0:
            del ms.used_domains[hs.domain]
        self.new_count -= 1
        if not slot.pinned_phase:
            mv = self.movable[slot.round_class]
            mv[hs.idx] -= 1
            if mv[hs.idx] <= 0:
                del mv[hs.idx]
            self.repair_slack[slot.round_class] -= slot.memory_mb - min_memory(
                ms.profile
            )

    def remove_kept(self, ms: ModelState, e: Entry) -> None:
        hs = self.hosts[e.hidx]
        slot = hs.remove_desired(ms.req.model_id, ms.req)
        assert slot is e.slot and slot.kind == "kept"
        hs.free_b += slot.memory_mb
        self.fleet.reindex(hs)
        ms.entries.remove(e)
        ms.used_domains[hs.domain] -= 1
        if ms.used_domains[hs.domain] <= 0:
            del ms.used_domains[hs.domain]

    def reserve(
        self, ms: ModelState, hs: HostState, mem: int, runtime: str, disk: int = 0
    ) -> None:
        """Hold a staged beneficiary's memory (with admission headroom), slot and artifact disk."""
        need = math.ceil(mem * (1.0 + self.headroom))
        slot = Slot(ms.req.model_id, "reserved", need, runtime, disk, ms.priority)
        hs.free_b -= need
        hs.disk_used += disk
        hs.add_desired(slot, ms.req)
        self.fleet.reindex(hs)
        ms.used_domains[hs.domain] += 1

    def release_index(self) -> tuple[list[tuple[int, int]], set[int]]:
        """(sorted (lowest kept-incumbent priority, host idx), hosts with leaving or must-move
        residencies): the hosts a staged preemption may look at. Built once after seeding;
        kept incumbents are only ever removed afterwards, so entries can only be stale in the
        conservative direction."""
        if self._release is None:
            floors: list[tuple[int, int]] = []
            for hs in self.hosts:
                lo = None
                for slot in hs.desired.values():
                    if slot.kind == "kept" and (lo is None or slot.priority < lo):
                        lo = slot.priority
                if lo is not None:
                    floors.append((lo, hs.idx))
            floors.sort()
            leaving = {hi for hi in self.leaving_models} | set(self.mustmove_on)
            self._release = (floors, leaving)
        return self._release

    def note_leaving(self, hidx: int) -> None:
        if self._release is not None:
            self._release[1].add(hidx)

    # ==================================================================================
    # Phase 2-3: ledgers and incumbents
    # ==================================================================================
    def seed(self) -> None:
        models = self.by_model
        # Ledgers from live inventory. Immovable residencies (external or operator-pinned)
        # and unmanaged memory consume both ledgers first.
        self.immovable: list[tuple[int, ResidencyView]] = []
        for hs in self.hosts:
            snap = hs.snap
            live: set[str] = set()
            live_mb = 0
            immovable_mb = 0
            seen: set[str] = set()
            for r in sorted(snap.residencies, key=_res_order):
                if r.model_id not in seen:
                    seen.add(r.model_id)
                    hs.residencies[r.model_id] = r
                elif (
                    r.state in HEALTHY_STATES
                    and hs.residencies[r.model_id].state not in HEALTHY_STATES
                ):
                    hs.residencies[r.model_id] = r
                if r.state not in LIVE_STATES:
                    continue
                mem = max(0, int(r.memory_mb))
                live_mb += mem
                live.add(r.model_id)
                if not r.managed or r.pinned:
                    immovable_mb += mem
                    self.immovable.append((hs.idx, r))
            unmanaged = max(0, int(snap.unmanaged_memory_mb))
            hs.live_models = frozenset(live)
            hs.free_a = hs.cap_new - unmanaged - live_mb
            hs.free_b = hs.cap_new - unmanaged - immovable_mb
            for m in sorted(live):
                ms = models.get(m)
                if ms is not None:
                    hs._add_presence(ms.req.max_colocated, ms.req.excludes)
                else:
                    hs._add_presence(0, self.excl.get(m, frozenset()))

        # Kept-set bookkeeping used only while seeding (convergence checks compare an
        # incumbent against the incumbents already kept, not against everything live).
        kept_on: list[list[tuple[str, ModelReq | None]]] = [[] for _ in self.hosts]
        kept_names: list[set[str]] = [set() for _ in self.hosts]
        for hi, r in self.immovable:
            if r.model_id not in kept_names[hi]:
                kept_names[hi].add(r.model_id)
                ms = models.get(r.model_id)
                kept_on[hi].append((r.model_id, ms.req if ms is not None else None))

        # Immovable residencies satisfy demand when they are healthy, on an eligible host
        # and statically compatible (they are never actuated either way).
        for hi, r in sorted(
            self.immovable, key=lambda t: (t[1].model_id, self.hosts[t[0]].host_id)
        ):
            ms = models.get(r.model_id)
            hs = self.hosts[hi]
            if (
                ms is None
                or r.state not in HEALTHY_STATES
                or len(ms.entries) >= ms.wanted
            ):
                continue
            if self.host_static(hs, ms) is not None:
                continue
            if hs.residencies.get(r.model_id) is not r:
                continue
            slot = Slot(
                r.model_id,
                "immovable",
                max(0, int(r.memory_mb)),
                r.runtime,
                0,
                ms.priority,
                residency=r,
            )
            values = self.host_values(hs, ms, slot.memory_mb, incumbent=r)
            reason = R.PINNED_RESIDENCY if r.pinned else R.EXTERNAL_RESIDENCY
            ms.entries.append(
                Entry(
                    hi,
                    slot,
                    "existing",
                    reason,
                    bool(r.managed),
                    values,
                    S.combine(values, ms.boost),
                )
            )
            ms.used_domains[hs.domain] += 1

        # Managed incumbents, model by model in seeding order.
        candidates: dict[str, list[tuple[HostState, ResidencyView]]] = {}
        self.obsolete: list[tuple[int, ResidencyView]] = []
        for hs in self.hosts:
            for m, r in hs.residencies.items():
                if r.state not in LIVE_STATES or not r.managed or r.pinned:
                    continue
                if r.state in HEALTHY_STATES and m in models and hs.eligible:
                    candidates.setdefault(m, []).append((hs, r))
                else:
                    self.obsolete.append((hs.idx, r))
            # duplicates of the same model on one host are obsolete
            for r in hs.snap.residencies:
                if (
                    r.managed
                    and not r.pinned
                    and r.state in LIVE_STATES
                    and hs.residencies.get(r.model_id) is not r
                ):
                    self.obsolete.append((hs.idx, r))

        order = sorted(
            self.models,
            key=lambda ms: (
                -ms.priority,
                ms.eligible_count,
                -ms.profile.memory_mb,
                ms.req.model_id,
            ),
        )
        for ms in order:
            cands = sorted(
                candidates.get(ms.req.model_id, ()), key=lambda t: t[0].host_id
            )
            remaining = list(cands)
            while remaining:
                if len(ms.entries) >= ms.wanted:
                    break
                short_domains = len(ms.used_domains) < ms.domain_target()
                used = ms.used_domains
                pick = min(
                    remaining,
                    key=lambda t, short=short_domains, used=used: (
                        0 if (short and t[0].domain not in used) else 1,
                        _STATE_RANK.get(t[1].state, 9),
                        t[0].host_id,
                    ),
                )
                remaining.remove(pick)
                hs, r = pick
                verdict = self._incumbent_verdict(hs, r, ms, kept_on[hs.idx])
                if verdict is None and hs.domain in ms.used_domains:
                    # Keep room for the failure-domain spread that is still reachable.
                    more = self.eligible_domains(
                        ms, ms.domain_target(), exclude=ms.used_domains
                    )
                    target = min(ms.domain_target(), len(ms.used_domains) + len(more))
                    slots_left = ms.wanted - len(ms.entries) - 1
                    if slots_left < target - len(ms.used_domains):
                        verdict = (
                            "mustmove",
                            R.FAILURE_DOMAIN,
                            "spread needs another failure domain",
                            "",
                        )
                if verdict is None:
                    self._keep(hs, r, ms, kept_on)
                    continue
                kind, reason, detail, survivor = verdict
                if kind == "mustmove":
                    ms.mustmove.append(MustMove(hs.idx, r, reason, detail))
                elif self.evictions < self.policy.max_evictions:
                    self._converge(hs, r, ms, reason, survivor)
                else:
                    # Over this plan's eviction budget: the violation stays visible and
                    # converges over later plans instead of an unbounded wave.
                    ms.shortfalls.append(
                        (
                            R.EVICTION_BUDGET,
                            f"{reason} convergence on {hs.host_id} deferred",
                        )
                    )
                    self._keep(hs, r, ms, kept_on)
            for hs, r in remaining:
                self.obsolete.append((hs.idx, r))

        # Memory of obsolete residencies is released by the reconciler on its own.
        for hi, r in self.obsolete:
            self.hosts[hi].leaving_mb += max(0, int(r.memory_mb))
            self.leaving_models.setdefault(hi, set()).add(r.model_id)
        for ms in self.models:
            for mm in ms.mustmove:
                self.mustmove_on.setdefault(mm.hidx, []).append((ms, mm))
        for hs in self.hosts:
            self.fleet.reindex(hs)

    def _keep(self, hs: HostState, r: ResidencyView, ms: ModelState, kept_on) -> None:
        mem = max(0, int(r.memory_mb))
        slot = Slot(
            ms.req.model_id,
            "kept",
            mem,
            r.runtime,
            0,
            ms.priority,
            reason=R.INCUMBENT,
            residency=r,
        )
        values = self.host_values(hs, ms, mem, incumbent=r)
        hs.free_b -= mem
        hs.add_desired(slot, ms.req)
        kept_on[hs.idx].append((ms.req.model_id, ms.req))
        ms.entries.append(
            Entry(
                hs.idx,
                slot,
                "existing",
                R.INCUMBENT,
                True,
                values,
                S.combine(values, ms.boost),
            )
        )
        ms.used_domains[hs.domain] += 1

    def _incumbent_verdict(
        self,
        hs: HostState,
        r: ResidencyView,
        ms: ModelState,
        kept: list[tuple[str, ModelReq | None]],
    ) -> tuple[str, str, str, str] | None:
        """None (keep), ("mustmove", ...) or ("converge", ..., survivor model id)."""
        req = ms.req
        rej = self.host_static(hs, ms)
        if rej is not None:
            return ("mustmove", rej[0], rej[1], "")
        allowed = req.runtimes or DEFAULT_RUNTIMES
        if r.runtime not in allowed or r.runtime not in hs.cls.runtime_set:
            return (
                "mustmove",
                R.RUNTIME_MISMATCH,
                f"live runtime {r.runtime} no longer allowed",
                "",
            )
        n = len(kept) + 1
        first = kept[0][0] if kept else ""
        if hs.limit and n > hs.limit:
            return (
                "converge",
                R.MODEL_LIMIT,
                f"host ceiling {hs.limit} below live inventory",
                first,
            )
        if req.max_colocated and n > req.max_colocated:
            return (
                "converge",
                R.COLOCATION_LIMIT,
                f"model allows {req.max_colocated} co-located",
                first,
            )
        for mid, k in kept:
            if mid in req.excludes:
                return (
                    "converge",
                    R.COLOCATION_EXCLUDED,
                    f"excluded pairing with {mid}",
                    mid,
                )
            if k is not None and k.max_colocated and n > k.max_colocated:
                return (
                    "converge",
                    R.COLOCATION_LIMIT,
                    f"{mid} allows {k.max_colocated} co-located",
                    mid,
                )
        mem = max(0, int(r.memory_mb))
        if mem > hs.free_b:
            return (
                "mustmove",
                R.INSUFFICIENT_MEMORY,
                f"desired footprint over capacity ({hs.free_b} MB free < {mem} MB)",
                "",
            )
        return None

    def _converge(
        self,
        hs: HostState,
        r: ResidencyView,
        ms: ModelState,
        reason: str,
        survivor: str,
    ) -> None:
        """Stage drain/unload of an incumbent that violates a lowered ceiling or co-location rule."""
        self.obsolete.append((hs.idx, r))
        not_before = None
        if r.loaded_at is not None:
            t = r.loaded_at + ms.profile.min_residency_seconds
            if t > self.now:
                not_before = t
        self.evictions += 1
        rsn = (
            R.MODEL_LIMIT_CONVERGENCE
            if reason == R.MODEL_LIMIT
            else R.COLOCATION_CONVERGENCE
        )
        self.preemptions.append(
            Preemption(
                host_id=hs.host_id,
                victim_model=r.model_id,
                beneficiary_model=survivor,
                reason=rsn,
                memory_mb=max(0, int(r.memory_mb)),
                priority=self.by_model[survivor].priority
                if survivor in self.by_model
                else ms.priority,
                not_before=not_before,
            )
        )

    # ==================================================================================
    # Phases 4-5: pins and priority classes
    # ==================================================================================
    def run(self) -> None:
        from grid.planner import preemption, repair

        self.seed()
        pinned = sorted(
            (ms for ms in self.models if ms.req.pins and ms.wanted > 0),
            key=lambda ms: (-ms.priority, ms.req.model_id),
        )
        for ms in pinned:
            for hid in ms.req.pins:
                hs = self.fleet.by_id.get(hid)
                if hs is None:
                    ms.shortfalls.append(
                        (R.PIN_UNSATISFIED, f"{hid}: {R.UNKNOWN_HOST}")
                    )
                    continue
                if any(e.hidx == hs.idx for e in ms.entries):
                    continue
                rej = self.host_static(hs, ms)
                if rej is not None:
                    ms.shortfalls.append(
                        (R.PIN_UNSATISFIED, f"{hid}: {rej[0]} {rej[1]}".strip())
                    )
                    continue
                c = self._eval_host(hs, ms, False)
                if c is not None:
                    self.commit_new(ms, c, R.PIN, ms.priority, pinned_phase=True)
                    continue
                outcome = preemption.stage(self, ms, only_host=hs, destructive=True)
                if outcome is None:
                    r, _, _, _ = self.feasible(hs, ms)
                    why = f"{r[0]} {r[1]}" if r else ""
                    if self.evictions >= self.policy.max_evictions:
                        why = f"{R.EVICTION_BUDGET} ({why})"
                    ms.shortfalls.append((R.PIN_UNSATISFIED, f"{hid}: {why}".strip()))

        classes = sorted(
            {ms.priority for ms in self.models if ms.wanted > 0}, reverse=True
        )
        for prio in classes:
            members = [
                ms for ms in self.models if ms.priority == prio and ms.wanted > 0
            ]
            members.sort(
                key=lambda ms: (
                    ms.eligible_count,
                    -ms.profile.memory_mb,
                    ms.harm_key,
                    ms.req.model_id,
                )
            )
            for tier in TIERS:
                active = [
                    ms
                    for ms in members
                    if not ms.blocked
                    and ms.progress < ms.wanted
                    and ms.tier_of(ms.progress) == tier
                ]
                while active:
                    nxt = []
                    for ms in active:
                        if self._place_one(ms, tier, prio, preemption, repair):
                            if (
                                ms.progress < ms.wanted
                                and ms.tier_of(ms.progress) == tier
                            ):
                                nxt.append(ms)
                        else:
                            ms.blocked = True
                    active = nxt

        self._retain()

    def _place_one(
        self, ms: ModelState, tier: str, prio: int, preemption, repair
    ) -> bool:
        if self.new_count >= self.policy.max_new_placements:
            ms.placement_budget = True
            return False
        # A predictive (inferred-only) transfer must leave the larger predictive disk reserve.
        self.disk_extra = self.predictive_extra if tier == "inferred" else 0
        try:
            return self._place_one_inner(ms, tier, prio, preemption, repair)
        finally:
            self.disk_extra = 0

    def _place_one_inner(
        self, ms: ModelState, tier: str, prio: int, preemption, repair
    ) -> bool:
        c = self.choose(ms)
        if c is not None:
            self.commit_new(ms, c, TIER_REASON[tier], prio)
            return True
        if repair.try_repair(self, ms, tier, prio):
            return True
        outcome = preemption.stage(
            self, ms, only_host=None, destructive=tier != "inferred"
        )
        return outcome is not None

    # ==================================================================================
    # Phase 6: make-before-break retention
    # ==================================================================================
    def _retain(self) -> None:
        for ms in self.models:
            if ms.wanted <= 0 or not ms.mustmove:
                continue
            ready = sum(
                1
                for e in ms.entries
                if e.status == "existing"
                and e.slot.residency is not None
                and e.slot.residency.state == "ready"
            )
            deficit = ms.wanted - ready
            if deficit <= 0:
                continue
            for mm in sorted(ms.mustmove, key=lambda mm: self.hosts[mm.hidx].host_id):
                if deficit <= 0:
                    break
                if mm.preempted or mm.residency.state != "ready":
                    continue
                ms.retained.append(mm)
                deficit -= 1


_STATE_RANK = {"ready": 0, "warming": 1, "loading": 2}


def min_memory(profile: ModelProfile) -> int:
    """Smallest footprint any runtime could give this model (repair lower bound)."""
    vals = [int(profile.memory_mb)] + [
        int(v) for v in profile.runtime_memory_mb.values()
    ]
    return max(0, min(vals))


def _res_order(r: ResidencyView) -> tuple:
    return (
        r.model_id,
        0 if r.state in HEALTHY_STATES else 1,
        _STATE_RANK.get(r.state, 9),
        r.state,
    )


def _values(
    base: tuple[float, ...], new_domain: bool, fit: float, load: float, thr: float
) -> tuple[float, ...]:
    """Class values with the per-host entries (domain, fit, load, throttled) filled in."""
    return (
        base[0],
        base[1],
        100.0 if new_domain else 0.0,
        base[3],
        base[4],
        fit,
        base[6],
        base[7],
        base[8],
        load,
        thr,
        base[11],
    )
