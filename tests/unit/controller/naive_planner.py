"""A deliberately naive placement for the reconciler's state machine (tests only).

The product planner keeps a must-move replica in the plan until its replacement is ready, which
would hide the reconciler's own make-before-break check; this one does not. Not a planner: no scoring, portfolio, preemption or repair. It keeps healthy live
copies (sticky), then fills missing replicas one per model per round, higher priority first,
on the eligible host with the most free memory. Shortfalls are reported, never hidden.
"""

from __future__ import annotations

import hashlib

from grid.events import codec
from grid.events.control import DATA_TIERS, ModelProfile
from grid.fleet import HOLDS_MEMORY_STATES
from grid.fleet.planning import (
    HostVerdict,
    ModelBasis,
    ModelExplanation,
    Placement,
    Plan,
    PlannerInput,
    Shortfall,
)
from grid.fleet.views import HostView

PLANNER_VERSION = "interim-0.1"
LIVE = frozenset({"loading", "warming", "ready"})


def inputs_digest(pin: PlannerInput) -> str:
    return hashlib.sha256(codec.encode_value(pin)).hexdigest()


def _eligible(host: HostView, profile: ModelProfile, pin: PlannerInput) -> str | None:
    pol = pin.policy
    if host.heartbeat_at is None:
        return "no_heartbeat"
    if host.heartbeat_at > pin.now + pol.future_skew_seconds:
        return "future_heartbeat"
    if pin.now - host.heartbeat_at > pol.heartbeat_timeout_seconds:
        return "stale_heartbeat"
    if host.state not in ("accepting", "throttled"):
        return f"host_{host.state}"
    res = host.resources
    if not set(profile.runtimes) & set(res.runtimes):
        return "runtime"
    if profile.backends and not set(profile.backends) & set(res.backends):
        return "backend"
    if any(t not in res.tags for t in profile.required_tags):
        return "required_tag"
    if any(t in res.tags for t in profile.forbidden_tags):
        return "forbidden_tag"
    if profile.allow_hosts and host.host_id not in profile.allow_hosts:
        return "not_allowed"
    if host.host_id in profile.deny_hosts:
        return "denied"
    if profile.pins and host.host_id not in profile.pins:
        return "pinned_elsewhere"
    tiers = {t: i for i, t in enumerate(DATA_TIERS)}
    if tiers.get(profile.data_tier, 1) > tiers.get(res.data_tier, 1):
        return "data_tier"
    if profile.min_gpu_count and res.gpu_count < profile.min_gpu_count:
        return "gpu_count"
    if profile.min_gpu_memory_mb and res.gpu_memory_mb < profile.min_gpu_memory_mb:
        return "gpu_memory"
    if not {"load", "warm"} <= set(host.actuator_capabilities):
        return "actuator"
    return None


def _memory(profile: ModelProfile, host: HostView) -> tuple[str, int]:
    options = [r for r in sorted(profile.runtimes) if r in host.resources.runtimes] or ["llama.cpp"]
    best = min(options, key=lambda r: (profile.runtime_memory_mb.get(r, profile.memory_mb), r))
    return best, int(profile.runtime_memory_mb.get(best, profile.memory_mb))


def plan(pin: PlannerInput) -> Plan:
    retired = set(pin.retired)
    demand = {d.model_id: d for d in pin.demand}
    profiles = sorted((p for p in pin.profiles if p.model_id not in retired), key=lambda p: (-p.priority, p.model_id))
    hosts = sorted(pin.hosts, key=lambda h: h.host_id)
    free: dict[str, int] = {}
    for h in hosts:
        used = sum(r.memory_mb for r in h.residencies if r.state in HOLDS_MEMORY_STATES)
        free[h.host_id] = h.resources.capacity_mb - h.resources.reserved_mb - h.unmanaged_memory_mb - used

    wanted: dict[str, int] = {}
    eligible: dict[str, list[HostView]] = {}
    rejected: dict[str, list[HostVerdict]] = {}
    chosen: dict[str, list[Placement]] = {}
    for p in profiles:
        d = demand.get(p.model_id)
        want = max(p.min_replicas, d.replicas if d is not None else 0)
        wanted[p.model_id] = max(0, min(want, p.max_replicas)) if p.max_replicas > 0 else want
        eligible[p.model_id] = []
        rejected[p.model_id] = []
        for h in hosts:
            why = _eligible(h, p, pin)
            if why is None:
                eligible[p.model_id].append(h)
            else:
                rejected[p.model_id].append(HostVerdict(host_id=h.host_id, eligible=False, reason=why))
        chosen[p.model_id] = []
        # Sticky: keep live copies on eligible hosts first.
        for h in eligible[p.model_id]:
            if len(chosen[p.model_id]) >= wanted[p.model_id]:
                break
            live = [r for r in h.residencies if r.model_id == p.model_id and r.state in LIVE]
            if live:
                r = live[0]
                chosen[p.model_id].append(Placement(
                    model_id=p.model_id, host_id=h.host_id, runtime=r.runtime, memory_mb=r.memory_mb,
                    status="existing", reason="sticky_live_copy",
                ))
    # Fair rounds: one new replica per model per round, priority classes first.
    progress = True
    while progress:
        progress = False
        for p in profiles:
            if len(chosen[p.model_id]) >= wanted[p.model_id]:
                continue
            taken = {c.host_id for c in chosen[p.model_id]}
            best: tuple[int, str, HostView, str, int] | None = None
            for h in eligible[p.model_id]:
                if h.host_id in taken:
                    continue
                runtime, mem = _memory(p, h)
                if free[h.host_id] < mem:
                    continue
                limit = h.resources.model_limit
                if limit and sum(1 for r in h.residencies if r.state in HOLDS_MEMORY_STATES) + sum(
                    1 for cs in chosen.values() for c in cs if c.host_id == h.host_id and c.status == "new"
                ) >= limit:
                    continue
                cand = (-free[h.host_id], h.host_id, h, runtime, mem)
                if best is None or cand[:2] < best[:2]:
                    best = cand
            if best is None:
                continue
            _, host_id, _h, runtime, mem = best
            free[host_id] -= mem
            chosen[p.model_id].append(Placement(
                model_id=p.model_id, host_id=host_id, runtime=runtime, memory_mb=mem,
                status="new", reason="most_free_memory",
            ))
            progress = True

    placements: list[Placement] = []
    shortfalls: list[Shortfall] = []
    explanations: list[ModelExplanation] = []
    basis: list[ModelBasis] = []
    for p in sorted(profiles, key=lambda p: p.model_id):
        cs = sorted(chosen[p.model_id], key=lambda c: c.host_id)
        placements.extend(cs)
        d = demand.get(p.model_id)
        reason = ""
        if len(cs) < wanted[p.model_id]:
            reason = "no_eligible_host" if not eligible[p.model_id] else "insufficient_capacity"
            shortfalls.append(Shortfall(model_id=p.model_id, wanted=wanted[p.model_id], placed=len(cs), reason=reason))
        explanations.append(ModelExplanation(
            model_id=p.model_id, wanted=wanted[p.model_id],
            evidence=d.evidence if d is not None else "baseline",
            eligible_hosts=tuple(h.host_id for h in eligible[p.model_id]),
            rejected=tuple(rejected[p.model_id][:16]), chosen=tuple(cs), shortfall_reason=reason,
        ))
        basis.append(ModelBasis(
            model_id=p.model_id, evidence=d.evidence if d is not None else "baseline",
            eligible_holders=tuple(h.host_id for h in eligible[p.model_id] if any(
                r.model_id == p.model_id and r.managed and not r.pinned for r in h.residencies)),
        ))
    return Plan(
        planner_version=PLANNER_VERSION, inputs_digest=inputs_digest(pin), now=pin.now,
        placements=tuple(placements), shortfalls=tuple(shortfalls), explanations=tuple(explanations),
        basis=tuple(basis),
    )


def render_explanation(plan_: Plan) -> list[str]:
    lines = []
    for e in plan_.explanations:
        hosts = ", ".join(c.host_id for c in e.chosen) or "-"
        line = f"{e.model_id}: wanted {e.wanted} ({e.evidence}), placed on {hosts}"
        if e.shortfall_reason:
            line += f"; shortfall: {e.shortfall_reason}"
        lines.append(line)
    return lines
