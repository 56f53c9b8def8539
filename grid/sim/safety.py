"""Safety invariants the lab checks on every tick (docs/INVARIANTS.md numbers in brackets).

Each check returns violations as (invariant, detail) values; an empty list is a safe tick.
They judge what the controller decided against exactly what it was shown, plus the physical
evidence the world reports (a warm that found no memory, an unload of a live engine).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grid.controller.governor import Limits
from grid.controller.reconcile import ReconcileResult
from grid.events.control import ModelProfile
from grid.fleet import ADMITTING_HOST_STATES, heartbeat_fresh
from grid.planner.reasons import RELOCATION
from grid.planner.types import HostSnapshot, Plan
from grid.projections.actions import ActionsState

MEMORY = "1_memory_overcommit"
INELIGIBLE = "2_ineligible_host"
LAST_REPLICA = "5_last_ready_replica_drained"
DRAIN_BEFORE_UNLOAD = "6_unload_before_drain"
MUTATION_LIMIT = "8_mutation_limit"
FENCING = "9_stale_term"
ROUTING = "4_routed_not_ready"


def check_tick(
    plan: Plan,
    hosts: Sequence[HostSnapshot],
    result: ReconcileResult,
    history: ActionsState,
    profiles: Mapping[str, ModelProfile],
    demanded: frozenset[str],
    now: float,
    limits: Limits,
) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    by_host = {h.host_id: h for h in hosts}

    def admitting(h: HostSnapshot | None) -> bool:
        return (h is not None and h.state in ADMITTING_HOST_STATES
                and heartbeat_fresh(h.heartbeat_at, now, limits))

    ready: dict[str, set[str]] = {}
    for h in hosts:
        if not admitting(h):
            continue
        for r in h.residencies:
            if r.state == "ready":
                ready.setdefault(r.model_id, set()).add(h.host_id)
    # [1] the plan's desired footprint fits every host's declared memory.
    per_host: dict[str, int] = {}
    for p in plan.placements:
        if p.managed:
            per_host[p.host_id] = per_host.get(p.host_id, 0) + p.memory_mb
    for host_id, mb in sorted(per_host.items()):
        h = by_host.get(host_id)
        if h is not None:
            res = h.resources
            cap = int(res.capacity_mb * res.thermal_derating) - res.reserved_mb - h.unmanaged_memory_mb
            if mb > cap:
                out.append((MEMORY, f"plan puts {mb} MiB on {host_id} (capacity {cap})"))
    open_per_host: dict[str, int] = {}
    for rec in history.actions.values():
        if rec.terminal_at is None and not rec.withdrawn:
            open_per_host[rec.command.host_id] = open_per_host.get(rec.command.host_id, 0) + 1
    drained: dict[str, int] = {}
    relocations = {(p.host_id, p.victim_model) for p in plan.preemptions if p.reason == RELOCATION}
    for a in result.actions:
        h = by_host.get(a.host_id)
        if a.kind in ("load", "warm") and not admitting(h):
            out.append((INELIGIBLE, f"{a.kind} {a.model_id} on {a.host_id} ({h.state if h else 'unknown'})"))
        open_per_host[a.host_id] = open_per_host.get(a.host_id, 0) + 1
        if open_per_host[a.host_id] > limits.max_host_mutations:
            out.append((MUTATION_LIMIT, f"{open_per_host[a.host_id]} mutations open on {a.host_id}"))
        if a.kind == "unload":
            r = next((x for x in (h.residencies if h else ()) if x.model_id == a.model_id and x.managed), None)
            if r is None or r.state != "draining" or r.active_requests:
                out.append((DRAIN_BEFORE_UNLOAD, f"unload {a.model_id} on {a.host_id} ({r.state if r else 'absent'})"))
        moves = a.kind == "drain" and (a.host_id, a.model_id) in relocations  # a relocation keeps a copy
        if a.kind == "drain" and (a.preemption_for is None or moves) and a.model_id in demanded:
            if a.host_id in ready.get(a.model_id, set()):
                drained[a.model_id] = drained.get(a.model_id, 0) + 1
                if drained[a.model_id] >= len(ready[a.model_id]):
                    out.append((LAST_REPLICA, f"drain of the last ready {a.model_id} ({a.host_id}) with demand"))
    return out
