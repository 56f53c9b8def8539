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

from grid.planner import reasons as R
from grid.planner.placement import Engine, Entry, ModelState, min_memory

MAX_SUBSET = 2


def lower_bound_fails(eng: Engine, ms: ModelState, prio: int) -> bool:
    t = eng.fleet.totals
    slack = max(0, eng.repair_slack.get(prio, 0))
    if t.free_mb + slack < min_memory(ms.profile):
        return True
    return t.unlimited_open <= 0 and t.slots <= 0


def try_repair(eng: Engine, ms: ModelState, tier: str, prio: int) -> bool:
    budget = eng.policy.max_repair_steps
    movable = eng.movable.get(prio)
    if not movable or eng.repair_steps >= budget:
        return False
    if lower_bound_fails(eng, ms, prio):
        return False
    hosts = sorted(
        (eng.hosts[hi] for hi, n in movable.items() if n > 0), key=lambda h: h.host_id
    )
    for hs in hosts:
        if eng.repair_steps >= budget:
            return False
        eng.repair_steps += 1
        if hs.present(ms.req.model_id) or eng.host_static(hs, ms) is not None:
            continue
        items: list[tuple[ModelState, Entry]] = []
        for slot in hs.desired.values():
            if (
                slot.kind == "new"
                and slot.round_class == prio
                and not slot.pinned_phase
            ):
                vms = eng.by_model[slot.model_id]
                if vms is ms:
                    continue
                e = next(x for x in vms.entries if x.slot is slot)
                items.append((vms, e))
        items.sort(key=lambda t: (-t[1].slot.memory_mb, t[0].req.model_id))
        for size in range(1, min(MAX_SUBSET, len(items)) + 1):
            for subset in combinations(items, size):
                if eng.repair_steps >= budget:
                    return False
                eng.repair_steps += 1
                if _attempt(eng, ms, hs, list(subset), tier, prio):
                    return True
    return False


def _attempt(
    eng: Engine,
    ms: ModelState,
    hs,
    subset: list[tuple[ModelState, Entry]],
    tier: str,
    prio: int,
) -> bool:
    from grid.planner.placement import TIER_REASON

    for vms, e in subset:
        eng.uncommit_new(vms, e)
    c = eng._eval_host(hs, ms, False)
    if c is None:
        _restore(eng, subset)
        return False
    placed = eng.commit_new(ms, c, TIER_REASON[tier], prio)
    moved: list[tuple[ModelState, Entry]] = []
    ok = True
    for vms, e in sorted(
        subset, key=lambda t: (-t[1].slot.memory_mb, t[0].req.model_id)
    ):
        eng.repair_steps += 1
        c2 = eng.choose(vms)
        if c2 is None:
            ok = False
            break
        moved.append((vms, eng.commit_new(vms, c2, R.REPAIRED, prio)))
    if ok:
        return True
    for vms, e in reversed(moved):
        eng.uncommit_new(vms, e)
    eng.uncommit_new(ms, placed)
    _restore(eng, subset)
    return False


def _restore(eng: Engine, subset: list[tuple[ModelState, Entry]]) -> None:
    for vms, e in subset:
        eng.recommit_new(vms, e)
