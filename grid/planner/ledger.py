"""The plan's ledger: capacity bookkeeping, candidate search and the operations that change it.

One ``Ledger`` holds everything a plan mutates while it is built: the per-host memory, slot
and disk ledgers (``state.HostState``), each model's desired entries, the repair scope, the
hosts with leaving capacity, and the staged preemptions. The placer (``placement.Placer``)
drives it; staged preemption, repair and explanations take it as their one typed parameter, so
none of them needs the placer's module (or another's).

ScoredHost selection is exact: ``best_host`` returns the host with the highest total score
(ties: smaller host id) as a full scan would, but scans per host class and bucket with an upper
bound that prunes those that cannot win (``scorer.py`` says why that is exact). The values come
from the scorer table (``scorers.py``). ``Ledger(reference_scan=True)`` performs the plain full
scan; tests and the planner benchmark prove both give byte-identical plans.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter

from grid.fleet import reasons as R
from grid.fleet.planning import Policy, Preemption, TimingSample
from grid.fleet.views import ResidencyView
from grid.planner import scorers
from grid.planner import scoring as S
from grid.planner.devices import residency_devices, share_mb
from grid.planner.eligibility import StaticEligibility
from grid.planner.feasibility import CHAIN, DEFAULT_RUNTIMES, HostClass, Rejection
from grid.planner.state import (
    ScoredHost,
    Entry,
    PlacementFleet,
    HostState,
    ModelState,
    MustMove,
    Slot,
    min_memory,
)

# best_host takes from each bucket the first feasible host of its open list (sorted by free
# memory, so best fit first) and the first in a failure domain the model does not use yet: that
# is the bucket's best host only while those are the only scorers its hosts can differ in.
assert {s.name for s in scorers.HOST_VARYING} == {"domain", "fit"}, (
    "a scorer that varies within a bucket needs a bucket key of its own (scorer.py)"
)


class Ledger(StaticEligibility):
    """One plan's mutable placement state over the (memoised) static eligibility."""

    def __init__(
        self,
        *,
        now: float,
        policy: Policy,
        hosts: list[HostState],
        classes: list[HostClass],
        fleet: PlacementFleet,
        models: list[ModelState],
        excl: dict[str, frozenset[str]],
        timings: dict[tuple[str, str], TimingSample],
        max_bw: float,
        max_gf: float,
        reference_scan: bool = False,
        held_models: set[str] | None = None,
    ) -> None:
        super().__init__(hosts, classes, fleet, models)
        # Flap-quarantined models (grid.fleet.quarantine): no new replica this plan, except a
        # model's only one. The hosts share this set (their feasibility check reads it).
        self.held_models = held_models if held_models is not None else set()
        self.now = now
        self.policy = policy
        self.headroom = max(0.0, float(policy.admission_headroom_fraction))
        self.reference_scan = reference_scan
        # Symmetric co-location exclusions by model id (also for models without a profile).
        self.excl = excl
        # (host id, model id) -> learned load/warm timing
        self.timings = timings
        # (host id, model id) of open load/warm commands (PlannerInput.pending)
        self.pending: frozenset[tuple[str, str]] = frozenset()
        # Fleet-wide hardware maxima for the hardware prior.
        self.max_bw = max_bw
        self.max_gf = max_gf
        # Best-fit normalisation: the largest new-work memory in the fleet.
        self.fit_scale = max((h.cap_new for h in hosts if h.eligible), default=1) or 1
        self.preemptions: list[Preemption] = []
        self.evictions = 0
        # relocations that placed a new copy of an incumbent this plan (relocation.py)
        self.relocations_started = 0
        self.relocation_steps = 0  # budget spent by relocation.py's search
        self.repair_steps = 0
        self.new_count = 0
        # Extra bytes an uncached artifact must leave free for the replica being placed now.
        self.disk_extra = 0
        self.predictive_extra = max(
            0,
            int(policy.predictive_disk_reserve_bytes) - int(policy.disk_reserve_bytes),
        )
        # priority class -> host idx -> number of movable new placements (repair scope)
        self.movable: dict[int, Counter[int]] = {}
        # priority class -> sum over movable new placements of (memory - model's minimum memory)
        self.repair_slack: dict[int, int] = {}
        # host idx -> model ids of obsolete live residencies (released by the reconciler)
        self.leaving_models: dict[int, set[str]] = {}
        # host idx -> must-move residencies on that host (preemption victims)
        self.mustmove_on: dict[int, list[tuple[ModelState, MustMove]]] = {}
        # model id -> its live incumbents the seed left out only because enough were kept
        self.surplus: dict[str, list[tuple[int, ResidencyView]]] = {}
        # (class idx, model idx) -> scorers.class_values
        self._class_values: dict[tuple[int, int], tuple[float, ...]] = {}
        self._release: tuple[list[tuple[int, int]], set[int]] | None = None
        self._scarcity_index: dict[int, tuple[list[int], list[tuple]]] = {}
        # class idx -> per bucket scorers.bucket_values (the same for every model)
        self._bucket_values: dict[int, list[tuple[float, ...]]] = {}
        # (class idx, model idx) -> per bucket [bucket, values its plain hosts share, upper
        # bound or None]
        self._bucket_memo: dict[tuple[int, int], list[list]] = {}
        # (host idx, model idx) -> (what the verdict read, verdict) for special hosts
        self._special_memo: dict[tuple[int, int], tuple[tuple, ScoredHost | None]] = {}

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
        """The class-wide scorers' values on a plain (non-special) host of the class."""
        key = (cls.idx, ms.idx)
        v = self._class_values.get(key)
        if v is None:
            v = scorers.class_values(self, cls, ms)
            self._class_values[key] = v
        return v

    def host_values(
        self,
        hs: HostState,
        ms: ModelState,
        mem: int,
        incumbent: ResidencyView | None = None,
    ) -> tuple[float, ...]:
        """Scorer values for one host (special hosts, incumbents and the reference scan)."""
        if incumbent is None and hs.idx not in ms.special_set:
            return scorers.plain_host_values(self, hs, ms, mem, self.class_values(hs.cls, ms))
        return scorers.host_values(self, hs, ms, mem, incumbent)

    # ==================================================================================
    # Host evaluation and candidate selection
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

    def eval_host(
        self, hs: HostState, ms: ModelState, need_new_domain: bool
    ) -> ScoredHost | None:
        """One host as a candidate for one more replica of ms (None: infeasible)."""
        if need_new_domain and hs.domain in ms.used_domains:
            return None
        r, rt, mem, disk = self.feasible(hs, ms)
        if r is not None:
            return None
        values = self.host_values(hs, ms, mem)
        return ScoredHost(
            scorers.combine(values, ms.boost), hs.host_id, hs.idx, rt, mem, disk, values
        )

    def _best_special(self, ms: ModelState, need_new_domain: bool) -> ScoredHost | None:
        """The best of the model's special hosts, as ``eval_host`` on each would find it.

        A model's special hosts (pending, cached, resident, measured) are evaluated one by one
        on every search for it, and most of them did not change since the last one: with a
        first wave in flight a model has about one pending host per replica. Each verdict is
        remembered under a key of every mutable value ``eval_host`` reads for that (host,
        model); everything else it reads (static verdicts, runtime and memory, timings,
        pending, scarcity, class values) is fixed for the plan. Equal key, equal verdict and
        scores. The loop is written out (no call per host): it runs for every special host of
        every search."""
        best: ScoredHost | None = None
        hosts = self.hosts
        memo = self._special_memo
        mid = ms.req.model_id
        midx = ms.idx
        used = ms.used_domains
        disk_extra = self.disk_extra
        for hi in ms.special:
            hs = hosts[hi]
            # One replica per model per host: whatever else holds, a present model is no
            # candidate (a static rejection would give None as well).
            if mid in hs.desired or mid in hs.live_models:
                continue
            is_new = hs.domain not in used
            if need_new_domain and not is_new:
                continue
            dev = hs.dev
            key = (
                is_new,
                hs.free_a,
                hs.free_b,
                hs.present_n,
                hs.col_min,
                hs.disk_used,
                disk_extra,
                hs.excl_counts.get(mid, 0),
                hs.flap_quarantined,
                mid in hs.held_models,
                hs.residencies.get(mid),
                None if dev is None else (tuple(dev.free_a.values()), tuple(dev.free_b.values())),
            )
            hit = memo.get((hi, midx))
            if hit is not None and hit[0] == key:
                c = hit[1]
            else:
                c = self.eval_host(hs, ms, need_new_domain)
                memo[(hi, midx)] = (key, c)
            if c is not None and (
                best is None
                or c.score > best.score
                or (c.score == best.score and c.host_id < best.host_id)
            ):
                best = c
        return best

    def _class_upper_bounds(self, ms: ModelState) -> list[tuple[float, int]]:
        """Eligible classes by an upper bound on any member's score (every per-host scorer at
        its best), best first. Computed once per model."""
        if not ms.class_order and ms.class_mem and not ms.explicit:
            order = []
            for ci in ms.class_mem:
                v = self.class_values(self.classes[ci], ms)
                ub = scorers.combine(scorers.class_bound(v), ms.boost)
                order.append((-ub, ci))
            order.sort()
            ms.class_order = order
        return ms.class_order

    def _bucket_bounds(self, ci: int, ms: ModelState) -> list[list]:
        """Per bucket of a class: ``[bucket, values its plain hosts share, score upper bound]``
        for ms, the bound (every host-varying scorer at its best) None until a search first
        needs it. All of it is static for the plan, so a model's later searches reuse it; the
        bound stays lazy because a model with one or two replicas rarely reads most of them."""
        key = (ci, ms.idx)
        out = self._bucket_memo.get(key)
        if out is None:
            cls = self.classes[ci]
            of_buckets = self._bucket_values.get(ci)
            if of_buckets is None:
                of_buckets = [scorers.bucket_values(b) for b in cls.buckets]
                self._bucket_values[ci] = of_buckets
            v = self.class_values(cls, ms)
            out = [[b, v + bv, None] for b, bv in zip(cls.buckets, of_buckets)]
            self._bucket_memo[key] = out
        return out

    def best_host(self, ms: ModelState, need_new_domain: bool) -> ScoredHost | None:
        """The feasible host with the highest score (ties: smaller host id), exactly as a full
        scan would find it: special hosts one by one, every other host through its bucket."""
        if self.reference_scan:
            return self._best_host_reference(ms, need_new_domain)
        best = self._best_special(ms, need_new_domain)
        hosts = self.hosts
        if ms.explicit:
            return best
        used = ms.used_domains
        deny = ms.req.deny
        special = ms.special_set
        headroom = self.headroom
        req = ms.req
        dyn = CHAIN.dynamic_check
        boost = ms.boost
        combine = scorers.combine
        bound = scorers.bucket_bound
        values_at = scorers.bucket_host_values
        disk = req.disk_bytes or 0
        disk_check = disk + self.disk_extra if disk else 0
        for neg_ub, ci in self._class_upper_bounds(ms):
            if best is not None and -neg_ub < best.score:
                break
            rt, mem = ms.class_mem[ci]
            for bb in self._bucket_bounds(ci, ms):
                b, shared, b_ub = bb
                lst = b.open
                if not lst:
                    continue
                if best is not None:
                    if b_ub is None:
                        b_ub = bb[2] = combine(bound(shared), boost)
                    if b_ub < best.score:
                        continue
                # With no domain used yet every host is in a new domain (a first replica that
                # needs one must still search the buckets, not only the special hosts).
                look_new = not used or any(d not in used for d in b.domains)
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
                    values = values_at(self, hs, ms, mem, shared)
                    c = ScoredHost(
                        combine(values, boost), hs.host_id, hs.idx, rt, mem, disk, values
                    )
                    if c.beats(best):
                        best = c
        return best

    def _best_host_reference(
        self, ms: ModelState, need_new_domain: bool
    ) -> ScoredHost | None:
        """The plain full scan ``best_host`` must agree with."""
        best: ScoredHost | None = None
        for hs in self.hosts:
            c = self.eval_host(hs, ms, need_new_domain)
            if c is not None and c.beats(best):
                best = c
        return best

    def needs_new_domain(self, ms: ModelState) -> bool:
        target = ms.domain_target()
        if len(ms.used_domains) >= target:
            return False
        return bool(self.eligible_domains(ms, 1, exclude=ms.used_domains))

    def choose(self, ms: ModelState) -> ScoredHost | None:
        """The best host for one more replica, in a new failure domain while one is needed."""
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
        c: ScoredHost,
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
        dev = self.hosts[c.hidx].dev
        if dev is not None:
            picked = dev.pick(c.memory_mb, ms.req.tensor_parallel, self.headroom)
            assert picked is not None, "a feasible candidate fits its devices"
            slot.devices = picked
        e = Entry(c.hidx, slot, "new", reason, True, c.values, c.score)
        self.recommit_new(ms, e)
        return e

    def recommit_new(self, ms: ModelState, e: Entry) -> None:
        """Add a new-placement entry to the ledgers (also used to undo an uncommit exactly)."""
        hs = self.hosts[e.hidx]
        slot = e.slot
        hs.free_a -= slot.memory_mb
        hs.free_b -= slot.memory_mb
        if hs.dev is not None:
            hs.dev.take(slot.devices, slot.memory_mb, live=True)
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
        if hs.dev is not None:
            hs.dev.give(slot.devices, slot.memory_mb, live=True)
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

    def keep(
        self, hs: HostState, r: ResidencyView, ms: ModelState, slot: Slot, reason: str
    ) -> Entry:
        """Add a live residency (kept incumbent or immovable) to the model's desired set."""
        values = self.host_values(hs, ms, slot.memory_mb, incumbent=r)
        e = Entry(
            hs.idx,
            slot,
            "existing",
            reason,
            bool(r.managed),
            values,
            scorers.combine(values, ms.boost),
        )
        ms.entries.append(e)
        ms.used_domains[hs.domain] += 1
        return e

    def remove_kept(self, ms: ModelState, e: Entry) -> None:
        hs = self.hosts[e.hidx]
        slot = hs.remove_desired(ms.req.model_id, ms.req)
        assert slot is e.slot and slot.kind == "kept"
        hs.free_b += slot.memory_mb
        if hs.dev is not None:
            hs.dev.give(slot.devices, slot.memory_mb, live=False)
        self.fleet.reindex(hs)
        ms.entries.remove(e)
        ms.used_domains[hs.domain] -= 1
        if ms.used_domains[hs.domain] <= 0:
            del ms.used_domains[hs.domain]

    def restore_kept(self, ms: ModelState, e: Entry) -> None:
        """Undo ``remove_kept`` exactly (the entry returns at the end of the model's list)."""
        hs = self.hosts[e.hidx]
        hs.free_b -= e.slot.memory_mb
        if hs.dev is not None:
            hs.dev.take(e.slot.devices, e.slot.memory_mb, live=False)
        hs.add_desired(e.slot, ms.req)
        self.fleet.reindex(hs)
        ms.entries.append(e)
        ms.used_domains[hs.domain] += 1

    def readopt_surplus(self, ms: ModelState) -> bool:
        """Keep one of ms's surplus incumbents again (after a staged preemption removed a kept
        replica of ms): the model keeps a ready replica it already has instead of losing both
        the scale-down copy and the preempted one and waiting for a release of its own memory.
        Presence is unchanged (a live model already counts on its host); the desired ledger
        must still hold it."""
        mid = ms.req.model_id
        allowed = ms.req.runtimes or DEFAULT_RUNTIMES
        pool = self.surplus.get(mid, [])
        for i, (hidx, r) in enumerate(pool):
            hs = self.hosts[hidx]
            mem = self.incumbent_charge(hs, ms)
            if (
                mid in hs.desired
                or not hs.eligible
                or self.host_static(hs, ms) is not None
                or r.runtime not in allowed
                or r.runtime not in hs.cls.runtime_set
                or mem > hs.free_b
                or sum(1 for x in hs.snap.residencies if x.model_id == mid and x.managed) != 1
            ):
                continue
            on: tuple[int, ...] = ()
            if hs.dev is not None:
                on = residency_devices(r, frozenset(hs.dev.indexes))
                if any(hs.dev.free_b[d] < share_mb(mem, len(on)) for d in on):
                    continue
            del pool[i]
            slot = Slot(mid, "kept", mem, r.runtime, 0, ms.priority, reason=R.INCUMBENT, residency=r, devices=on)
            self.keep(hs, r, ms, slot, R.INCUMBENT)
            hs.free_b -= mem
            if hs.dev is not None:
                hs.dev.take(on, mem, live=False)
            hs.add_desired(slot, ms.req)
            hs.leaving_mb -= mem
            leaving = self.leaving_models.get(hidx)
            if leaving is not None:
                leaving.discard(mid)
                if not leaving:
                    del self.leaving_models[hidx]
            self.fleet.reindex(hs)
            return True
        return False

    def reserve(
        self, ms: ModelState, hs: HostState, mem: int, runtime: str, disk: int = 0
    ) -> None:
        """Hold a staged beneficiary's memory (with admission headroom), slot and artifact disk."""
        need = math.ceil(mem * (1.0 + self.headroom))
        slot = Slot(ms.req.model_id, "reserved", need, runtime, disk, ms.priority)
        hs.free_b -= need
        if hs.dev is not None:
            # The victims are still live: only the desired ledger is reserved. A set that no
            # longer fits (fits_after checked it) takes the roomiest devices, going negative
            # rather than offering memory that is not there.
            n = ms.req.tensor_parallel
            slot.devices = hs.dev.pick(need, n, None) or tuple(
                sorted(sorted(hs.dev.indexes, key=lambda i: (-hs.dev.free_b[i], i))[:n]))
            hs.dev.take(slot.devices, need, live=False)
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

    def note_leaving(self, hidx: int, model_id: str, memory_mb: int) -> None:
        """A residency on this host will be released by the reconciler (obsolete or evicted)."""
        self.hosts[hidx].leaving_mb += memory_mb
        self.leaving_models.setdefault(hidx, set()).add(model_id)
        if self._release is not None:
            self._release[1].add(hidx)
