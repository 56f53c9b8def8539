"""Staged preemption: drain and unload the lowest-priority sufficient victim set first.

When a replica of a model with a preemption-capable signal (pin, baseline, direct demand) finds
no host, the planner looks for a host where removing lower-priority managed work would make it
fit. It emits ``Preemption`` entries (drain + unload) for that victim set, reserves the
beneficiary's memory and slot on the host so later, lower-priority work in the same plan cannot
take it, and keeps reporting the beneficiary as a shortfall (``PREEMPTION_STAGED``). A later
snapshot proves the memory free and the ordinary placement path places it.

A kept replica taken as a victim is replaced, when its model has one, by a surplus incumbent of
the same model (a live replica the seed left out only because enough were kept): a scale-down
and a preemption in one plan never leave a ready model with neither copy.

A scale-up (a replica beyond the beneficiary's first and its baseline) preempts only when the
offered concurrency it would serve exceeds what the victims' replicas now serve (``_worth_it``):
the victim's displaced demand counts against the beneficiary's gain, so a brief surge does not
evict steady work that then returns and is evicted again (ping-pong).

Never a victim: external (managed=False) or operator-pinned residencies, a model's own pinned
host, incumbents inside their minimum residency, anything of equal or higher priority, and a
model's only ready replica while that model itself wants more replicas than it has ready (it
would lose all service while short, and such a victim did not come back the same day). Only a
copy that keeps serving counts as another: ready on an eligible host and not already a victim
of this plan.
Inferred-only demand never preempts; it may only wait for capacity that obsolete residencies
are already releasing (``AWAITING_RELEASE``, no eviction). Each plan stages at most
``policy.max_evictions`` evictions.

Victim preference on a host: lowest priority, idle before busy, lowest learned warm-back cost,
larger memory, model id. Host preference among sufficient sets: lowest highest-victim priority,
fewest busy victims, lowest total warm-back cost, fewest victims, host id. When the model still
needs another failure domain, hosts in new domains are searched first.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

from collections.abc import Iterator

from grid.fleet import reasons as R
from grid.fleet.planning import Preemption
from grid.fleet.views import ResidencyView
from grid.planner import scoring as S
from grid.planner.devices import residency_devices, share_mb
from grid.planner.feasibility import ModelReq
from grid.planner.ledger import Ledger
from grid.planner.state import Entry, HostState, ModelState, MustMove


@dataclass(slots=True, eq=False)
class Victim:
    model_id: str
    ms: ModelState  # the victim's model
    memory_mb: int  # what it is charged in the desired ledger (b)
    kept: bool  # a kept incumbent (in the desired ledger) rather than a must-move residency
    busy: bool
    warmback: float
    priority: int
    ref: Entry | MustMove  # Entry (kept) or MustMove
    # What its process holds (the residency's report): what leaving frees in ledger (a).
    live_mb: int = 0

    def key(self) -> tuple:
        return (
            self.priority,
            1 if self.busy else 0,
            self.warmback,
            -self.memory_mb,
            self.model_id,
        )


@dataclass(slots=True, eq=False)
class StagedSet:
    hs: HostState
    victims: list[Victim]
    runtime: str
    memory_mb: int
    disk_bytes: int = 0

    def cost(self) -> tuple:
        top = max((v.priority for v in self.victims), default=-(1 << 62))
        busy = sum(1 for v in self.victims if v.busy)
        warm = round(sum(v.warmback for v in self.victims), 6)
        return (top, busy, warm, len(self.victims), self.hs.host_id)


def within_min_residency(now: float, min_residency_seconds: float, residency: ResidencyView) -> bool:
    """Minimum-residency protection at `now` (a loading/warming residency without loaded_at
    counts). Status's admission rows ask the same question of the plan they explain."""
    if residency.loaded_at is None:
        return residency.state in ("loading", "warming")
    return now - residency.loaded_at < min_residency_seconds


def protected(led: Ledger, vms: ModelState, residency: ResidencyView) -> bool:
    return within_min_residency(led.now, vms.profile.min_residency_seconds, residency)


def sole_ready_while_short(led: Ledger, vms: ModelState, residency: ResidencyView) -> bool:
    """The residency is its model's only ready replica that keeps serving, and the model's
    target is more than one.

    A copy that keeps serving is ready on an eligible host (a stale or draining host's copy is
    not coming back) and is not already a victim of this plan: two victim sets staged in one
    plan must not take a short model's last two copies, each counting the other as a survivor."""
    if residency.state != "ready" or vms.wanted <= 1:
        return False
    model_id = vms.req.model_id
    taken = {p.host_id for p in led.preemptions if p.victim_model == model_id}
    for other in led.hosts:
        if not other.eligible or other.host_id in taken:
            continue
        r = other.residencies.get(model_id)
        if r is not None and r is not residency and r.state == "ready":
            return False
    return True


def _victims_on(
    led: Ledger, hs: HostState, ms: ModelState, destructive: bool
) -> list[Victim]:
    if not destructive:
        return []
    out: list[Victim] = []
    for slot in hs.desired.values():
        if slot.kind != "kept" or slot.priority >= ms.priority:
            continue
        r = slot.residency
        if r is None or not r.managed or r.pinned:
            continue
        vms = led.by_model[slot.model_id]
        if hs.host_id in vms.req.pins or protected(led, vms, r) or sole_ready_while_short(led, vms, r):
            continue
        if vms.req.model_id in led.held_models:
            continue  # a flap-quarantined model could not be placed again elsewhere
        entry = next(e for e in vms.entries if e.hidx == hs.idx and e.slot is slot)
        out.append(make_victim(led, hs, vms, r, slot.memory_mb, True, entry))
    for vms, mm in led.mustmove_on.get(hs.idx, ()):
        if mm.preempted or vms.priority >= ms.priority or vms.req.model_id in led.held_models:
            continue
        r = mm.residency
        if hs.host_id in vms.req.pins or protected(led, vms, r) or sole_ready_while_short(led, vms, r):
            continue
        out.append(make_victim(led, hs, vms, r, max(0, int(r.memory_mb)), False, mm))
    out.sort(key=Victim.key)
    return out


def make_victim(
    led: Ledger,
    hs: HostState,
    vms: ModelState,
    r: ResidencyView,
    mem: int,
    kept: bool,
    ref: Entry | MustMove,
) -> Victim:
    sample = led.timings.get((hs.host_id, vms.req.model_id))
    warm = S.startup_seconds(vms.profile, sample, False, vms.req.sha)
    busy = r.state == "ready" and r.active_requests > 0
    return Victim(vms.req.model_id, vms, mem, kept, busy, warm, vms.priority, ref, max(0, int(r.memory_mb)))


def fits_after(
    led: Ledger, hs: HostState, req: ModelReq, mem: int, disk: int, victims: list[Victim]
) -> bool:
    """Would the beneficiary fit once leaving residencies and these victims are gone?"""
    need = mem * (1.0 + led.headroom)
    free_b = hs.free_b + sum(v.memory_mb for v in victims if v.kept)
    if free_b < math.ceil(need):
        return False
    free_a = hs.free_a + hs.leaving_mb + sum(v.live_mb for v in victims)
    if free_a < need:
        return False
    if hs.dev is not None and not _devices_fit_after(hs, req, mem, victims, led.headroom):
        return False
    gone = {v.model_id for v in victims}
    leaving = led.leaving_models.get(hs.idx, ())
    present = set(hs.desired)
    for m in hs.live_models:
        if m in hs.desired:
            continue
        if m in leaving and not _still_live_elsewhere(led, hs, m):
            continue
        present.add(m)
    present -= gone
    if req.model_id in present:
        return False
    n = len(present) + 1
    if hs.limit and n > hs.limit:
        return False
    if req.max_colocated and n > req.max_colocated:
        return False
    for m in present:
        if m in req.excludes:
            return False
        other = led.by_model.get(m)
        if (
            other is not None
            and other.req.max_colocated
            and n > other.req.max_colocated
        ):
            return False
    return _disk_ok(hs, disk)


def _devices_fit_after(hs: HostState, req: ModelReq, mem: int, victims: list[Victim], headroom: float) -> bool:
    """The device ledgers once the victims are gone: a kept victim returns its charge on its
    devices to the desired ledger and its process's memory to the physical one; a must-move one (never in the desired ledger) returns the devices
    it reports to the physical ledger only (unknown devices: nothing, conservatively)."""
    assert hs.dev is not None
    dev = hs.dev.copy()
    known = frozenset(dev.indexes)
    for v in victims:
        if isinstance(v.ref, Entry):
            devices = v.ref.slot.devices
            dev.give(devices, v.memory_mb, live=False)
            for i in devices:
                dev.free_a[i] += share_mb(v.live_mb, len(devices))
        else:
            on = residency_devices(v.ref.residency, known)
            for i in on:
                dev.free_a[i] += share_mb(v.live_mb, len(on))
    return dev.fits(mem, req.tensor_parallel, headroom)


def _still_live_elsewhere(led: Ledger, hs: HostState, model_id: str) -> bool:
    """A leaving model id is still present if another live residency of it is not leaving
    (e.g. a must-move copy that may be retained)."""
    for vms, mm in led.mustmove_on.get(hs.idx, ()):
        if mm.residency.model_id == model_id and not mm.preempted:
            return True
    return False


def _disk_ok(hs: HostState, disk: int) -> bool:
    if disk <= 0:
        return True
    if hs.disk_budget is None:
        return False
    return hs.disk_used + disk <= hs.disk_budget


def _victim_set(
    led: Ledger, hs: HostState, ms: ModelState, destructive: bool, budget: int
) -> StagedSet | None:
    if led.host_static(hs, ms) is not None:
        return None
    rt, mem = led.runtime_for(hs.cls, ms)
    disk = led.disk_need(hs, ms)
    if not _disk_ok(hs, disk + led.disk_extra if disk else 0):
        return None
    pool = _victims_on(led, hs, ms, destructive)
    if not pool and hs.leaving_mb <= 0 and not led.leaving_models.get(hs.idx):
        return None
    chosen: list[Victim] = []
    if not fits_after(led, hs, ms.req, mem, disk, chosen):
        ok = False
        for v in pool:
            chosen.append(v)
            if fits_after(led, hs, ms.req, mem, disk, chosen):
                ok = True
                break
        if not ok:
            return None
        # Drop victims that turned out unnecessary (latest additions are the most costly).
        for v in list(reversed(chosen)):
            trial = [x for x in chosen if x is not v]
            if fits_after(led, hs, ms.req, mem, disk, trial):
                chosen = trial
    if len(chosen) > budget:
        return None
    if chosen and not _worth_it(ms, chosen):
        return None
    return StagedSet(hs, chosen, rt, mem, disk)


def replica_capacity(p) -> float:
    util = p.target_utilization if math.isfinite(p.target_utilization) else 0.7
    return max(1, p.replica_concurrency) * min(1.0, max(0.05, util))


def offered(vms: ModelState) -> float:
    d = vms.demand
    if d is None or not math.isfinite(d.offered_concurrency):
        return 0.0
    return max(0.0, d.offered_concurrency)


def _worth_it(ms: ModelState, victims: list[Victim]) -> bool:
    """Does one more replica of ms serve more demand than the victims' replicas now serve?

    Only a scale-up is weighed: a model's first replica and its configured baseline keep
    strict priority. Beyond that, the beneficiary's gain is the offered concurrency its current
    replicas cannot carry (at most one replica's capacity), and each kept victim displaces its
    model's share of offered concurrency (all of it when it is the last replica). Without this,
    a brief surge of an important model preempted the steady work of a less important one,
    the victim came back when the surge passed, and the next surge preempted it again."""
    have = ms.progress
    if have < max(1, ms.n_base):
        return True
    cap = replica_capacity(ms.profile)
    gain = min(cap, max(0.0, offered(ms) - cap * have))
    displaced = 0.0
    for v in victims:
        if not v.kept:
            continue  # a must-move residency is leaving anyway
        vms = v.ms
        displaced += offered(vms) / max(1, len(vms.entries))
    # Victims nobody is using cost nothing to displace.
    return displaced <= 0.0 or gain > displaced


def _candidate_hosts(led: Ledger, ms: ModelState) -> Iterator[HostState]:
    """Statically eligible hosts for ms that may have something to release (host id order).

    Uses the ledger's release index: hosts whose lowest removable-incumbent priority is below
    the beneficiary's, plus hosts with leaving or must-move residencies. Entries only go stale
    in the conservative direction (a victim removed later), and every host is re-checked."""
    idx = led.release_index()
    floors, leaving = idx
    cut = bisect_left(floors, (ms.priority, -1))
    chosen = {hi for _, hi in floors[:cut]}
    chosen.update(leaving)
    special = ms.special_set
    for hi in sorted(chosen):
        hs = led.hosts[hi]
        if not hs.eligible:
            continue
        if ms.explicit:
            if hi not in special:
                continue
        elif hi not in special and (
            hs.cls.idx not in ms.class_mem or hs.host_id in ms.req.deny
        ):
            continue
        yield hs


def stage(
    led: Ledger,
    ms: ModelState,
    *,
    only_host: HostState | None = None,
    destructive: bool = True,
) -> StagedSet | None:
    """Try to stage a preemption (or a wait for leaving capacity) for one replica of ms."""
    budget = max(0, led.policy.max_evictions - led.evictions)
    hosts = [only_host] if only_host is not None else list(_candidate_hosts(led, ms))
    # A flap-quarantined host takes no new placement, so nothing is released for one there.
    hosts = [hs for hs in hosts if not hs.flap_quarantined]
    passes = (
        [True, False] if (only_host is None and led.needs_new_domain(ms)) else [False]
    )
    best: StagedSet | None = None
    saw_budget = False
    for new_domain_only in passes:
        for hs in hosts:
            if new_domain_only and hs.domain in ms.used_domains:
                continue
            s = _victim_set(led, hs, ms, destructive, budget)
            if s is None:
                if (
                    budget == 0
                    and destructive
                    and _victim_set(led, hs, ms, destructive, 1 << 30) is not None
                ):
                    saw_budget = True
                continue
            if best is None or s.cost() < best.cost():
                best = s
        if best is not None:
            break
    if best is None:
        if saw_budget:
            ms.budget_blocked = True
        return None
    _apply(led, ms, best)
    return best


def _apply(led: Ledger, ms: ModelState, staged: StagedSet) -> None:
    hs = staged.hs
    for v in staged.victims:
        vms = v.ms
        if isinstance(v.ref, Entry):
            led.remove_kept(vms, v.ref)
            led.readopt_surplus(vms)
        else:
            v.ref.preempted = True
        led.note_leaving(hs.idx, v.model_id, v.live_mb)
        led.evictions += 1
        led.preemptions.append(
            Preemption(
                host_id=hs.host_id,
                victim_model=v.model_id,
                beneficiary_model=ms.req.model_id,
                reason=R.PRIORITY_PREEMPTION,
                memory_mb=v.live_mb,
                priority=ms.priority,
            )
        )
    led.reserve(ms, hs, staged.memory_mb, staged.runtime, staged.disk_bytes)
    if staged.victims:
        ms.staged += 1
    else:
        ms.awaiting += 1
    ms.staged_hosts.append(hs.host_id)
