"""The one safety invariant checker (docs/INVARIANTS.md numbers in the constants), used by the lab
on every tick and by the stateful reconciler test after every decision.

``check_tick`` judges what the reconciler decided against exactly what it was shown (the plan,
the observed hosts, the action history, the profiles) and returns violations as
(invariant, detail) values; an empty list is a safe tick. The lab adds the physical evidence its
world reports (a warm that found no memory, an unload of a live engine) under the same names.
Determinism (the same inputs give the same ids) and idempotent acks are properties of the
reconciler and the projection rather than of one decision: the stateful test checks those itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grid.controller.governor import GLOBAL_LIMIT, Limits, artifact_key, backoff_index
from grid.controller.reconcile import Guards, ReconcileResult
from grid.events.commands import PREDICTIVE_PREFETCH
from grid.events.control import ModelProfile
from grid.fleet import ADMITTING_HOST_STATES, EVACUATING_HOST_STATES, heartbeat_fresh
from grid.fleet.planning import Plan
from grid.fleet.reasons import RELOCATION
from grid.fleet.views import HostView, ResidencyView
from grid.projections.actions import ActionsState

Violation = tuple[str, str]

MEMORY = "1_memory_overcommit"
INELIGIBLE = "2_ineligible_host"
# Make before break: a routine drain only once every desired replica of the model is ready,
# never of a desired replica, and never ahead of availability work waiting for a slot.
MAKE_BEFORE_BREAK = "3_drain_before_replacement_ready"
DESIRED_DRAINED = "3_desired_replica_drained"
SLOT_ORDER = "3_routine_destructive_before_availability"
ROUTING = "4_routed_not_ready"
LAST_REPLICA = "5_last_ready_replica_drained"
SHORTFALL_DRAINED = "5_drained_with_shortfall"
# A staged preemption takes a model's last ready replica while that model wants more than one.
PREEMPTED_WHILE_SHORT = "5_preempted_last_ready_while_short"
DRAIN_BEFORE_UNLOAD = "6_unload_before_drain"
DRAIN_STATE = "6_drain_of_a_residency_not_serving"
UNMANAGED = "7_unmanaged_actuated"
MUTATION_LIMIT = "8_mutation_limit"
GLOBAL_MUTATION_LIMIT = "8_global_mutation_limit"
ARTIFACT_FANOUT = "8_artifact_fanout"
BACKOFF = "8_failure_backoff_ignored"
FENCING = "9_stale_term"
DUPLICATE_ID = "9_duplicate_action_id"
REISSUED_ID = "9_reissued_action_id"
PENDING_EQUIVALENT = "9_pending_equivalent_not_suppressed"


def check_tick(
    plan: Plan,
    hosts: Sequence[HostView],
    result: ReconcileResult,
    history: ActionsState,
    profiles: Mapping[str, ModelProfile],
    demanded: frozenset[str],
    now: float,
    limits: Limits,
    *,
    guards: Guards = Guards(),
) -> list[Violation]:
    """Every violation in one decision. `demanded`: models with recent direct demand (a drain of
    their last ready replica is a violation even when the plan asked for it)."""
    by_host = {h.host_id: h for h in hosts}
    out: list[Violation] = []
    out += _plan_fits(plan, by_host)
    out += _identity(result, history)
    out += _actuation(plan, by_host, result, profiles, now, limits, guards)
    out += _last_replica(plan, hosts, result, demanded, now, limits)
    out += _limits(by_host, result, history, now, limits)
    return out


def _admitting(h: HostView | None, now: float, limits: Limits) -> bool:
    return h is not None and h.state in ADMITTING_HOST_STATES and heartbeat_fresh(h.heartbeat_at, now, limits)


def _managed(h: HostView | None, model_id: str) -> ResidencyView | None:
    return next((r for r in (h.residencies if h else ()) if r.model_id == model_id and r.managed and not r.pinned),
                None)


def _plan_fits(plan: Plan, by_host: Mapping[str, HostView]) -> list[Violation]:
    """[1] The plan's desired managed footprint fits every host's declared memory."""
    out: list[Violation] = []
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
    return out


def _identity(result: ReconcileResult, history: ActionsState) -> list[Violation]:
    """[9] Distinct ids, never an issued id again, and no second command for an open intent."""
    out: list[Violation] = []
    ids = [a.action_id for a in result.actions]
    if len(ids) != len(set(ids)):
        out.append((DUPLICATE_ID, "duplicate action ids in one tick"))
    for action_id in sorted(set(ids) & set(history.actions)):
        out.append((REISSUED_ID, f"{action_id} was already issued"))
    open_intents = {(r.command.kind, r.command.host_id, r.command.model_id)
                    for r in history.actions.values() if r.terminal_at is None and not r.withdrawn}
    for a in result.actions:
        if (a.kind, a.host_id, a.model_id) in open_intents:
            out.append((PENDING_EQUIVALENT, f"{a.kind} {a.model_id} on {a.host_id} is already open"))
    return out


def _actuation(plan: Plan, by_host: Mapping[str, HostView], result: ReconcileResult,
               profiles: Mapping[str, ModelProfile], now: float, limits: Limits, guards: Guards) -> list[Violation]:
    """[2] admission only on admitting hosts; [3]/[5] make before break; [6] drain before unload;
    [7] never actuate what Grid does not own."""
    out: list[Violation] = []

    def ready(host_id: str, model_id: str) -> bool:
        h = by_host.get(host_id)
        if not _admitting(h, now, limits):
            return False
        sha = profiles[model_id].artifact_sha256 if model_id in profiles else None
        return any(r.model_id == model_id and r.state == "ready"
                   and (sha is None or (r.artifact_sha256 or "").lower() == sha.lower())
                   for r in h.residencies)  # type: ignore[union-attr]

    def evacuation_due(h: HostView) -> bool:
        since = guards.evacuating_since.get(h.host_id)
        return (h.state in EVACUATING_HOST_STATES and since is not None
                and now - since >= limits.evacuation_deadline_seconds)

    desired: dict[str, list[str]] = {}
    for p in plan.placements:
        desired.setdefault(p.model_id, []).append(p.host_id)
    shortfall = {s.model_id for s in plan.shortfalls if s.wanted > s.placed}
    relocations = {(p.host_id, p.victim_model) for p in plan.preemptions if p.reason == RELOCATION}
    for a in result.actions:
        h = by_host.get(a.host_id)
        where = f"{a.kind} {a.model_id} on {a.host_id}"
        if a.kind in ("load", "warm") and not _admitting(h, now, limits):
            out.append((INELIGIBLE, f"{where} ({h.state if h else 'unknown'})"))
        r = _managed(h, a.model_id)
        foreign = [x for x in (h.residencies if h else ()) if x.model_id == a.model_id and (not x.managed or x.pinned)]
        if foreign and r is None:
            out.append((UNMANAGED, where))
        if a.kind == "unload" and (r is None or r.state != "draining" or r.active_requests):
            out.append((DRAIN_BEFORE_UNLOAD, f"{where} ({r.state if r else 'absent'})"))
        if a.kind != "drain":
            continue
        if r is None or r.state not in ("ready", "failed"):
            out.append((DRAIN_STATE, f"{where} ({r.state if r else 'absent'})"))
            continue
        routine = a.preemption_for is None and a.model_id in profiles and r.state == "ready"
        if routine and h is not None and not evacuation_due(h):
            if not all(ready(x, a.model_id) for x in desired.get(a.model_id, ())):
                out.append((MAKE_BEFORE_BREAK, f"{where} before its replacements are ready"))
            if a.model_id in shortfall:
                out.append((SHORTFALL_DRAINED, f"{where} while the model has a shortfall"))
            if a.host_id in desired.get(a.model_id, ()):
                out.append((DESIRED_DRAINED, where))
        if routine and h is not None and evacuation_due(h) and not any(
            ready(x, a.model_id) for x in by_host if x != a.host_id
        ):
            # past an evacuation's deadline a copy goes without its replacement, but never the last
            out.append((LAST_REPLICA, f"evacuation drained the last ready {a.model_id} ({a.host_id})"))
        if (a.host_id, a.model_id) in relocations and r.state == "ready" and not any(
            ready(x, a.model_id) for x in by_host if x != a.host_id
        ):
            # a relocation moves a replica: another ready copy serves before the old one drains
            out.append((LAST_REPLICA, f"relocation drained the last ready {a.model_id} ({a.host_id})"))
    # Availability work means demanded work: a predictive prefetch waits behind routine work too.
    if any(d.reason == GLOBAL_LIMIT and d.kind in ("load", "warm") and d.detail != PREDICTIVE_PREFETCH
           for d in result.deferred):
        for a in result.actions:
            if a.destructive and a.preemption_for is None:
                out.append((SLOT_ORDER, f"{a.kind} {a.model_id} on {a.host_id} took a slot availability waits for"))
    return out


def _last_replica(plan: Plan, hosts: Sequence[HostView], result: ReconcileResult, demanded: frozenset[str],
                  now: float, limits: Limits) -> list[Violation]:
    """[5] No drain of a demanded model's last ready replica (a relocation keeps a copy), and no
    staged preemption of a model's last ready replica while that model wants more than one."""
    out: list[Violation] = []
    ready: dict[str, set[str]] = {}
    for h in hosts:
        if not _admitting(h, now, limits):
            continue
        for r in h.residencies:
            if r.state == "ready":
                ready.setdefault(r.model_id, set()).add(h.host_id)
    wanted = _wanted(plan)
    drained: dict[str, int] = {}
    relocations = {(p.host_id, p.victim_model) for p in plan.preemptions if p.reason == RELOCATION}
    for a in result.actions:
        if a.kind != "drain" or a.host_id not in ready.get(a.model_id, set()):
            continue
        drained[a.model_id] = drained.get(a.model_id, 0) + 1
        if drained[a.model_id] < len(ready[a.model_id]):
            continue
        moves = (a.host_id, a.model_id) in relocations
        if (a.preemption_for is None or moves) and a.model_id in demanded:
            out.append((LAST_REPLICA, f"drain of the last ready {a.model_id} ({a.host_id}) with demand"))
        elif a.preemption_for is not None and not moves and wanted.get(a.model_id, 0) > 1:
            # A higher priority may take a model's only replica, but not while the model itself
            # wants more than one: it would lose all service while short.
            out.append((PREEMPTED_WHILE_SHORT, f"preemption of the last ready {a.model_id} ({a.host_id}) for "
                                               f"{a.preemption_for} while it wants {wanted[a.model_id]}"))
    return out


def _wanted(plan: Plan) -> dict[str, int]:
    """Replicas each model wants, as the plan shows it: its shortfall's target, else what it placed."""
    out: dict[str, int] = {}
    for p in plan.placements:
        out[p.model_id] = out.get(p.model_id, 0) + 1
    for s in plan.shortfalls:
        out[s.model_id] = max(out.get(s.model_id, 0), s.wanted)
    return out


def _limits(by_host: Mapping[str, HostView], result: ReconcileResult, history: ActionsState, now: float,
            limits: Limits) -> list[Violation]:
    """[8] Per-host and global mutation limits, exact-artifact fanout and failure backoff, charged
    the way the governor charges: open commands (a withdrawn one while its host may run it)."""
    out: list[Violation] = []
    backoffs = backoff_index(limits, history.actions.values())
    for a in result.actions:
        bo = backoffs.get((a.kind, a.host_id, a.model_id))
        if bo is not None and now < bo.not_before:
            out.append((BACKOFF, f"{a.kind} {a.model_id} on {a.host_id} before {bo.not_before}"))
    withdrawn_now = {w.action_id for w in result.withdrawals}
    per_host: dict[str, int] = {}
    charged_global = 0
    fanout: dict[str, int] = {}
    for rec in sorted(history.actions.values(), key=lambda r: r.issued_seq):
        if rec.terminal_at is not None:
            continue
        live = not rec.withdrawn and rec.command.action_id not in withdrawn_now
        if not (live or rec.status == "accepted"):
            continue
        c = rec.command
        per_host[c.host_id] = per_host.get(c.host_id, 0) + 1
        h = by_host.get(c.host_id)
        if h is not None and heartbeat_fresh(h.heartbeat_at, now, limits):
            charged_global += 1
        if c.kind == "load":
            k = artifact_key(c.model_id, c.artifact_sha256)
            fanout[k] = fanout.get(k, 0) + 1
    total = charged_global
    for a in result.actions:
        per_host[a.host_id] = per_host.get(a.host_id, 0) + 1
        total += 1
        if a.kind == "load":
            k = artifact_key(a.model_id, a.artifact_sha256)
            fanout[k] = fanout.get(k, 0) + 1
            if fanout[k] > limits.artifact_fanout:
                out.append((ARTIFACT_FANOUT, f"{fanout[k]} loads of {k} at once"))
        if per_host[a.host_id] > limits.max_host_mutations:
            out.append((MUTATION_LIMIT, f"{per_host[a.host_id]} mutations open on {a.host_id}"))
    if result.actions and total > limits.max_global_mutations:
        out.append((GLOBAL_MUTATION_LIMIT, f"{total} mutations open across the fleet"))
    return out
