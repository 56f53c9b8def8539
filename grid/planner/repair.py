"""Bounded deterministic backtracking repair for capacity fragmented by greedy placement.

When a replica finds no feasible host, the repair tries to evacuate one or two *new*
placements of the same priority class (never incumbents, never pins: moving those would be a
real migration) from a host that is statically eligible for it, place the replica there, and
re-place the evacuated replicas elsewhere through the ordinary candidate search. Any failure
rolls back exactly. Every host examined, every eviction subset tried and every re-placement
costs one step of the per-plan budget ``policy.max_repair_steps``; the search order (host id,
then subsets by memory) makes the result deterministic.

Before any search an admissible lower bound fails fast: moving replicas never creates memory or
model slots, so if the fleet's aggregate free memory (plus any footprint a runtime switch could
save) is below the replica's smallest footprint, or no model slot is free anywhere, no sequence
of moves can succeed. On a saturated homogeneous fleet this costs zero steps. Only hosts that
hold movable replicas of the same class and are eligible for the model are searched, so
unrelated or ineligible inventory does not change the budget spent or the result.
"""

from __future__ import annotations

from itertools import combinations

from grid.fleet import reasons as R
from grid.planner.ledger import Ledger
from grid.planner.state import TIER_REASON, Entry, HostState, ModelState, min_memory

MAX_SUBSET = 2


def lower_bound_fails(led: Ledger, ms: ModelState, prio: int) -> bool:
    t = led.fleet.totals
    slack = max(0, led.repair_slack.get(prio, 0))
    if t.free_mb + slack < min_memory(ms.profile):
        return True
    return t.unlimited_open <= 0 and t.slots <= 0


def try_repair(led: Ledger, ms: ModelState, tier: str, prio: int) -> bool:
    budget = led.policy.max_repair_steps
    movable = led.movable.get(prio)
    if not movable or led.repair_steps >= budget:
        return False
    if lower_bound_fails(led, ms, prio):
        return False
    hosts = sorted(
        (led.hosts[hi] for hi, n in movable.items() if n > 0), key=lambda h: h.host_id
    )
    for hs in hosts:
        if led.repair_steps >= budget:
            return False
        led.repair_steps += 1
        if hs.present(ms.req.model_id) or led.host_static(hs, ms) is not None:
            continue
        items: list[tuple[ModelState, Entry]] = []
        for slot in hs.desired.values():
            if (
                slot.kind == "new"
                and slot.round_class == prio
                and not slot.pinned_phase
            ):
                vms = led.by_model[slot.model_id]
                if vms is ms:
                    continue
                e = next(x for x in vms.entries if x.slot is slot)
                items.append((vms, e))
        items.sort(key=lambda t: (-t[1].slot.memory_mb, t[0].req.model_id))
        for size in range(1, min(MAX_SUBSET, len(items)) + 1):
            for subset in combinations(items, size):
                if led.repair_steps >= budget:
                    return False
                led.repair_steps += 1
                if _attempt(led, ms, hs, list(subset), tier, prio):
                    return True
    return False


def _attempt(
    led: Ledger,
    ms: ModelState,
    hs: HostState,
    subset: list[tuple[ModelState, Entry]],
    tier: str,
    prio: int,
) -> bool:
    for vms, e in subset:
        led.uncommit_new(vms, e)
    c = led.eval_host(hs, ms, False)
    if c is None:
        _restore(led, subset)
        return False
    placed = led.commit_new(ms, c, TIER_REASON[tier], prio)
    moved: list[tuple[ModelState, Entry]] = []
    ok = True
    for vms, e in sorted(
        subset, key=lambda t: (-t[1].slot.memory_mb, t[0].req.model_id)
    ):
        led.repair_steps += 1
        c2 = led.choose(vms)
        if c2 is None:
            ok = False
            break
        moved.append((vms, led.commit_new(vms, c2, R.REPAIRED, prio)))
    if ok:
        return True
    for vms, e in reversed(moved):
        led.uncommit_new(vms, e)
    led.uncommit_new(ms, placed)
    _restore(led, subset)
    return False


def _restore(led: Ledger, subset: list[tuple[ModelState, Entry]]) -> None:
    for vms, e in subset:
        led.recommit_new(vms, e)
