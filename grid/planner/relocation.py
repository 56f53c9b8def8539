"""Staged relocation (proactive repack): move an equal- or lower-priority incumbent out of the way.

When a replica finds no host, repair finds nothing to evacuate and no lower-priority victim can
be preempted, the capacity is often only fragmented: one host could take the replica if an
incumbent of another model stood elsewhere, and another host has room for that incumbent now.
On the 4-machine lab fleet an image model stayed at one replica through a whole campaign while
the 48 GiB machine had 30 GiB free, because the 22 GiB research model sat on the only other
host that could take a second image replica.

The relocation is make-before-break, and nothing is destroyed:

1. the incumbent's new copy is placed on the other host (``RELOCATED``), or, on a later plan, the
   copy already loading there is kept again;
2. the old copy stays in the desired set (``RETAINED_UNTIL_REPLACED``) until its model has as
   many ready replicas as it wants, so it serves throughout;
3. then the plan stages its drain as a ``RELOCATION`` preemption naming the beneficiary (a drain
   the reconciler starts at once, without waiting out the scale-down cooldown, and only while
   another ready copy of the model exists);
4. meanwhile the beneficiary's memory, slot and disk are reserved on the host and the replica is
   reported as a ``RELOCATION_STAGED`` shortfall; once the drain proves the memory free, the
   ordinary placement path places it.

Each plan re-derives the decision from the live inventory. It stays on the same course because
a victim whose model already has a copy on its way elsewhere is preferred over every other.

Only worth it for demand: the beneficiary must have baseline, direct or workload (`auto`)
evidence, never correlation-only prediction, and the replica must carry at least
``MIN_GAIN_SHARE`` of one replica's capacity of offered concurrency the model's current
replicas cannot. At most ``MAX_STARTS`` relocations start per plan (one continuing relocation
costs nothing), and the search examines at most ``MAX_STEPS`` hosts, incumbents and
destinations per plan in all, so a saturated fleet costs a bounded amount; a victim inside its minimum residency, pinned, external, loading or of higher
priority is never moved. Deterministic: hosts and victims are compared by explicit keys that
end in ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from grid.fleet import reasons as R
from grid.fleet.planning import Preemption
from grid.planner.ledger import Ledger
from grid.planner.preemption import fits_after, make_victim, offered, protected, replica_capacity
from grid.planner.state import ScoredHost, Entry, HostState, ModelState, MustMove

# The replica must carry this share of one replica's capacity in unserved offered concurrency.
MIN_GAIN_SHARE = 0.25
# Relocations that place a new copy (not ones already under way) per plan.
MAX_STARTS = 2
# Hosts, incumbents and destinations examined per plan, whatever the fleet: on a saturated
# fleet every blocked replica asks, and the search must not grow with hosts x hosts.
MAX_STEPS = 512
# A workload's `auto` demand in a target's reason (grid.demand.forecast.REASON_WORKLOAD).
_WORKLOAD_REASON = "workload:"


@dataclass(slots=True, eq=False)
class _Option:
    hs: HostState  # where the beneficiary goes
    vms: ModelState  # the incumbent's model
    entry: Entry  # the incumbent's kept entry on hs
    destination: ScoredHost | None  # a new copy's host (None: a copy is already under way)
    warmback: float

    def key(self) -> tuple:
        return (
            0 if self.destination is None else 1,
            self.vms.priority,
            self.warmback,
            self.hs.host_id,
            self.vms.req.model_id,
        )


def _demanded(ms: ModelState) -> bool:
    """Baseline, direct or workload demand (a relocation is churn that prediction alone must
    not buy)."""
    d = ms.demand
    if d is None:
        return ms.n_base > 0
    if d.canary:
        return False
    if d.evidence in ("baseline", "direct"):
        return True
    return any(part.startswith(_WORKLOAD_REASON) for part in d.reason.split("+"))


def _worth_it(ms: ModelState) -> bool:
    have = ms.progress
    if have < ms.n_base:
        return True
    cap = replica_capacity(ms.profile)
    gain = min(cap, max(0.0, offered(ms) - cap * have))
    return gain >= MIN_GAIN_SHARE * cap


def _under_way(led: Ledger, vms: ModelState, hs: HostState) -> bool:
    """The model already has a healthy copy outside its desired set on another host."""
    return any(hidx != hs.idx for hidx, _ in led.surplus.get(vms.req.model_id, ()))


def _spend(led: Ledger) -> bool:
    """One step of the per-plan budget; False when it is spent."""
    if led.relocation_steps >= MAX_STEPS:
        return False
    led.relocation_steps += 1
    return True


def _destination(led: Ledger, vms: ModelState, away: HostState) -> ScoredHost | None:
    best: ScoredHost | None = None
    need_domain = led.needs_new_domain(vms)
    for h in led.hosts:
        if h is away or not h.eligible:
            continue
        if not _spend(led):
            return None
        c = led.eval_host(h, vms, need_domain)
        if c is not None and c.beats(best):
            best = c
    return best


def _options(led: Ledger, ms: ModelState, starts_left: bool) -> list[_Option]:
    out: list[_Option] = []
    mid = ms.req.model_id
    for hs in led.hosts:
        if not _spend(led):
            return out
        if not hs.eligible or hs.flap_quarantined or hs.present(mid) or led.host_static(hs, ms) is not None:
            continue
        rt, mem = led.runtime_for(hs.cls, ms)
        disk = led.disk_need(hs, ms)
        for slot in sorted(hs.desired.values(), key=lambda s: s.model_id):
            if slot.kind != "kept" or slot.priority > ms.priority or slot.model_id == mid:
                continue
            r = slot.residency
            if r is None or not r.managed or r.pinned or r.state != "ready":
                continue
            vms = led.by_model[slot.model_id]
            if hs.host_id in vms.req.pins or protected(led, vms, r) or not _spend(led):
                continue
            entry = next(e for e in vms.entries if e.hidx == hs.idx and e.slot is slot)
            victim = make_victim(led, hs, vms, r, slot.memory_mb, True, entry)
            if not fits_after(led, hs, ms.req, mem, disk, [victim]):
                continue
            if _under_way(led, vms, hs):
                out.append(_Option(hs, vms, entry, None, victim.warmback))
            elif starts_left:
                dest = _destination(led, vms, hs)
                if dest is not None:
                    out.append(_Option(hs, vms, entry, dest, victim.warmback))
    return out


def stage(led: Ledger, ms: ModelState, prio: int) -> bool:
    """Stage one relocation that makes room for one replica of ms; False when none is worth it."""
    if not _demanded(ms) or not _worth_it(ms) or led.evictions >= led.policy.max_evictions:
        return False  # (the old copy's drain counts against the plan's eviction budget)
    options = _options(led, ms, led.relocations_started < MAX_STARTS)
    if not options:
        return False
    return _apply(led, ms, min(options, key=_Option.key), prio)


def _ready_elsewhere(led: Ledger, vms: ModelState, hs: HostState) -> int:
    return sum(
        1
        for e in vms.entries
        if e.hidx != hs.idx
        and e.status == "existing"
        and e.slot.residency is not None
        and e.slot.residency.state == "ready"
    )


def _apply(led: Ledger, ms: ModelState, o: _Option, prio: int) -> bool:
    hs, vms = o.hs, o.vms
    r = o.entry.slot.residency
    assert r is not None
    mem = max(0, int(r.memory_mb))  # what the old copy's process frees when it drains
    led.remove_kept(vms, o.entry)
    adopted = o.destination is None and led.readopt_surplus(vms)
    if not adopted:
        dest = o.destination or _destination(led, vms, hs)
        if dest is None:
            led.restore_kept(vms, o.entry)
            return False
        led.commit_new(vms, dest, R.RELOCATED, prio)
        led.relocations_started += 1
    if _ready_elsewhere(led, vms, hs) >= vms.wanted:
        # The replacement serves: the old copy drains now, as a preemption naming the beneficiary.
        led.note_leaving(hs.idx, vms.req.model_id, mem)
        led.evictions += 1
        led.preemptions.append(
            Preemption(
                host_id=hs.host_id,
                victim_model=vms.req.model_id,
                beneficiary_model=ms.req.model_id,
                reason=R.RELOCATION,
                memory_mb=mem,
                priority=ms.priority,
            )
        )
    else:
        # Make-before-break: retained (``Placer.retain_until_replaced``) until the model has its ready replicas again.
        mm = MustMove(hs.idx, r, R.RELOCATION, f"moving to make room for {ms.req.model_id}")
        vms.mustmove.append(mm)
        led.mustmove_on.setdefault(hs.idx, []).append((vms, mm))
    rt, need = led.runtime_for(hs.cls, ms)
    led.reserve(ms, hs, need, rt, led.disk_need(hs, ms))
    ms.relocating += 1
    ms.staged_hosts.append(hs.host_id)
    return True
