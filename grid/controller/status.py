"""The allocator status document (GET /allocator/status, `gridctl status --json`).

Shape (every key always present; lists bounded):

    controller   id, epoch, started_at, restart_grace_until, lease {state, term, holder_id, ...}
    controllers  [{controller_id, state (active|standby|unresponsive|stopped), term, admin_url,
                   started_at, announced_age_seconds}] every controller that announced itself
    mode         requested, effective, changed_at, log_durable
    revisions    dirty, processed, success, positions {stream: seq}, profiles {model: seq}, plans
    hosts        [{host_id, state, fresh, heartbeat_age_seconds, capacity_mb, reserved_mb,
                   unmanaged_mb, used_mb, free_mb, offered_mb, planner_free_mb, offered_reasons,
                   failure_domain, tags, residencies [...],
                   cached, protection_reason, override, use, yield_to_user_seconds, revoked,
                   revoked_at, revoked_reason}]
                 offered_mb: the memory the planner may place into (after reserve, thermal
                 derating, a throttled host's fraction; GPU memory on a VRAM host), planner_free_mb
                 what of it is not taken, offered_reasons why it is less than capacity_mb
                 (e.g. "throttled: offers 50%")
                 use: "dedicated" (joined with `gridctl invite --dedicated`), "employee" (joined
                 without: a workstation or laptop) or "" (not joined by invitation, or unsaid);
                 yield_to_user_seconds: the host throttles while its user gave input within that
                 many seconds, None never (grid.events.host.HostUse, from the heartbeat)
                 revoked: the operator revoked the host's credentials (`gridctl node revoke`) at
                 revoked_at (log receipt time); also a warning
    profiles     [ModelProfile fields]
    retired      [{model_id, retired_at}]
    models       [{model_id, wanted, placed, ready, evidence, shortfall, retired}]
    load_failures  [{host_id, model_id, reason, detail, action_id, artifact_sha256, at}]: the last
                 failed load per (host, model) until a later success there; a model short of
                 ready replicas with no planning shortfall shows the newest as its shortfall
    drains       [{host_id, since, deadline_at, deadline_passed, risks [{host_id, model_id, reason, detail,
                   at_deadline}]}] each draining host (operator or local drain): when it began (log time),
                 its evacuation deadline, and each model whose last ready copy is there and that the plan
                 replaces nowhere (kept past the deadline until a replacement is ready,
                 grid.controller.drain_check); each risk is also a warning
    flap_quarantines  [{kind (host|model), subject, reason, since, until, remaining_seconds, transitions,
                   level}] hosts and models the last tick held out of new placement because their
                 lifecycle flaps (grid.fleet.quarantine), except where that would cost a replica
                 (grid.planner.plan.build_plan); each releases itself at `until`
    unplaceable  [{model_id, reason, detail}] configured models with no ready replica that cannot be
                 placed as things stand (the gateway's 503 verdict; absent ones are loading)
    unplaced_claims  [{host_id, model_id, state, reason, artifact_sha256, managed}] heartbeat claims of
                 ready/warming residencies the gateway does not route: a managed one the latest recorded
                 plan does not assign to that host (not_in_plan), no warm ack of that host confirms
                 (no_warm_ack), or whose artifact is not the profile's (artifact_mismatch); an external
                 one (managed false) no operator admitted (route_not_admitted), admitted for another
                 kind or endpoint, or that a profile constraint refuses there (host_not_allowed, ...);
                 each is also a warning (grid.projections.routes)
    workloads    [{workload, state (ready|starting|planned|undersupplied|deferred|capacity-contended|
                   blocked-by-residency|infeasible|awaiting-plan), model_id, offered_concurrency,
                   replicas, desired, planned, ready, missing, eligible_hosts, startup_seconds, reason,
                   detail, served_by, joint, exploring}] one admission row per active workload's `auto`
                   traffic, explaining the authoritative plan against the observed hosts
                   (grid.controller.workload_status says which state means what)
    forecasts    {version, targets [...], models [...], workloads [...]} (baseline when absent)
    qualification_exclusions  [{model_id, host_id, reason (not_qualified), detail}] for each profile
                 with require_qualified, the hosts it may not use and why (grid.fleet.qualification);
                 each host's own qualifications are in hosts[].qualifications [{runtime, model_id,
                 artifact_sha256, result, failed_step, reason, age_seconds}] (the latest per runtime
                 and model, aged by the log's receipt time)
    plan         {generation, recorded, planner_version, inputs_digest, placements, preemptions,
                  shortfalls, prefetch (cache-only advisories), evictions (predictive cache expiries),
                  explanations, explanation_text}
    reconciliation  the ReconcileResult (actions, deferred, ignored, blocked, withdrawals, ...)
    pending_commands, delivered_pending_action_ids, withdrawn_commands, withdrawn_destructive
                 pending_commands[].waiting: host_stale / host_unknown when its host is silent ("" else)
    history      recent terminal actions, newest first; status "expired" (message expired_undelivered):
                 no host accepted it before its lease ran out and its host was stale or unknown
    ticks        recent tick reports; last_tick
    rejected_events  {total, by_reason {reason: n}, latest [{stream, seq, subject, reason, role}]}: log
                 messages the controller's folds skipped as not provably written by an identity that
                 may write their subject (grid.identity.signing, grid.identity.provenance); latest
                 holds the newest few, newest last; a non-zero total is also a warning
    over_budget_hosts  [{host, dropped {over_rate|over_bytes: n}, total, first_at, last_at, over_now}]:
                 hosts whose messages the folds dropped unread over their budget
                 (grid.projections.budget; also counted in rejected_events); over_now is a warning
    store        {state (ok|low_free_space|write_failed|unknown), detail, source, reason, path, free_bytes,
                  total_bytes, warn_free_bytes, jetstream_storage_bytes, jetstream_reserved_bytes,
                  jetstream_max_bytes, restart_needs_free_bytes, recoveries} the event log store's pressure:
                 source local_server_disk when the controller runs beside its server (`gridctl up`: its
                 disk), jetstream_account_info elsewhere (a cluster: the account's storage, reservations
                 and limit, free_bytes/total_bytes the limit's headroom or None), none when unread; every
                 None field's why is in `reason` (grid.controller.store_view); not ok is also a warning
    warnings     snapshot quarantine, non-durable log, forecast failures, plan conflicts, ...

It is built from a `ControllerView` (the controller's public snapshot), never from the live
controller, so this module knows nothing of the service that produces the view.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from grid.controller import drain_check, store_view
from grid.controller.governor import Limits
from grid.controller.inputs import ready_replicas
from grid.controller.reconcile import ReconcileResult
from grid.controller.workload_status import workload_rows
from grid.demand.forecast import Forecast
from grid.events.authorship import Rejection, describe_rejected
from grid.projections.budget import over_budget_warnings
from grid.events.commands import DESTRUCTIVE_KINDS
from grid.events.host import HostHeartbeat
from grid.fleet import ADMITTING_HOST_STATES, HOLDS_MEMORY_STATES, heartbeat_live
from grid.fleet.devices import vram_capacity_mb
from grid.fleet import reasons as R
from grid.fleet.hardware import hardware_row
from grid.fleet.placeability import plan_saw_profile, unplaceable
from grid.fleet.qualification import host_qualifies, why_not
from grid.fleet.planning import Plan, PlannerInput, TimingSample, decode_plan
from grid.fleet.views import HostView
from grid.planner.feasibility import new_work_allocatable_mb
from grid.planner.plan import render_explanation
from grid.projections import fleet as fleet_proj
from grid.projections import placed as placed_proj
from grid.projections import routes as routes_proj
from grid.projections.actions import ActionRecord, ActionsState, LoadFailure


class TickReport(msgspec.Struct, kw_only=True):
    """One controller tick as status reports it (durations in milliseconds)."""

    number: int
    at: float
    reason: str
    mode: str
    effective_mode: str
    leader: bool
    duration_ms: float = 0.0
    plan_ms: float = 0.0
    forecast_ms: float = 0.0
    reconcile_ms: float = 0.0
    publish_ms: float = 0.0
    # CPU time of the pure tick (forecast, plan, reconcile) on its worker thread: what the tick
    # computed, as against duration_ms, which also counts waiting (the GIL, the log, the lease).
    cpu_ms: float = 0.0
    generation: str = ""
    plan_recorded: bool = False
    actions: int = 0
    deferred: int = 0
    published: int = 0
    withdrawn: int = 0
    dirty_revision: int = 0
    error: str | None = None


@dataclass(frozen=True)
class ControllerView:
    """A controller's public snapshot: everything status shows, read at one instant."""

    now: float
    controller_id: str
    epoch: str
    started_at: float | None
    restart_grace_until: float | None
    lease: dict[str, object] | None
    # The lease's last error while it is not held (None when held or absent).
    lease_error: str | None
    published_total: int
    withdrawn_total: int
    plan_conflicts: int
    log_durable: bool
    dirty_revision: int
    processed_revision: int
    success_revision: int
    states: Mapping[str, Any]
    positions: dict[str, int]
    malformed_events: int
    warnings: tuple[str, ...]
    limits: Limits
    history_limit: int
    last_tick: TickReport | None
    ticks: tuple[TickReport, ...]
    last_plan: Plan | None
    last_input: PlannerInput | None
    last_forecast: Forecast | None
    last_generation: str
    last_result: ReconcileResult | None
    # Every controller that announced itself: which is active, which stand by (presence.py).
    controllers: tuple[dict[str, Any], ...] = ()
    # Messages the folds rejected (authorship not proven, or not vouched for), by reason, and the
    # latest of them (oldest first).
    rejected_events: Mapping[str, int] = field(default_factory=dict)
    rejections: tuple[Rejection, ...] = ()
    # Hosts over their log budget (grid.projections.budget.flagged_rows): their messages dropped unread.
    over_budget: tuple[Mapping[str, Any], ...] = ()
    # The event log store's disk pressure (grid.transport.store_pressure) where the controller runs
    # beside the server that writes it (`gridctl up`); None elsewhere.
    store: Mapping[str, Any] | None = None


def _b(value: Any) -> Any:
    return msgspec.to_builtins(value)


def _command_row(r: ActionRecord) -> dict[str, Any]:
    c = r.command
    return {
        "action_id": c.action_id, "kind": c.kind, "host_id": c.host_id, "model_id": c.model_id,
        "status": r.status, "withdrawn": r.withdrawn, "withdrawn_reason": r.withdrawn_reason,
        "issued_at": r.issued_at, "acked_at": r.acked_at, "terminal_at": r.terminal_at,
        "controller_term": c.controller_term, "generation": c.generation, "reason": c.reason,
        "message": r.message, "duration_seconds": r.duration_seconds,
    }


# Why a pending command waits on its host (pending_commands[].waiting), as status says it.
WAITING_HOST_STALE = "host_stale"
WAITING_HOST_UNKNOWN = "host_unknown"


def _pending_row(r: ActionRecord, fresh: Mapping[str, bool]) -> dict[str, Any]:
    """A pending command's row, with what it waits on when its host (`fresh`: host id -> fresh) is
    silent: one it accepted may be running and stays until the host answers; one it never accepted
    expires once its lease is over (grid.controller.reconcile.expire_undelivered, then status
    "expired" in history)."""
    host_fresh = fresh.get(r.command.host_id)
    waiting = WAITING_HOST_UNKNOWN if host_fresh is None else "" if host_fresh else WAITING_HOST_STALE
    return {**_command_row(r), "waiting": waiting}


def offered_memory(h: HostView) -> tuple[int, list[str]]:
    """The memory the planner may place into on `h` (grid.planner.feasibility's new-work
    allocatable memory, before what already runs there) and why it is less than the host's
    capacity, in words: a plan's `insufficient_memory` beside plenty of free memory is
    otherwise a riddle (a throttled host offers only its throttle fraction)."""
    res = h.resources
    why: list[str] = []
    vram = vram_capacity_mb(res)
    if vram:
        why.append(f"placements use GPU memory: {vram} MiB")
    elif res.reserved_mb:
        why.append(f"reserve: {res.reserved_mb} MiB")
    derating = min(1.0, max(0.0, float(res.thermal_derating)))
    if derating < 1.0:
        why.append(f"thermal derating: offers {derating:.0%}")
    if h.state == "throttled":
        fraction = min(1.0, max(0.0, float(res.throttle_fraction)))
        if fraction < 1.0:
            why.append(f"throttled: offers {fraction:.0%}")
    if h.state not in ADMITTING_HOST_STATES:
        why.append(f"{h.state}: takes no new placement")
    return (new_work_allocatable_mb(res, h.state) if h.state in ADMITTING_HOST_STATES else 0), why


def _hosts(ctl: ControllerView, now: float, snaps: tuple[HostView, ...]) -> list[dict[str, Any]]:
    fleet = ctl.states["fleet"]
    limits = ctl.limits
    rows = []
    for h in snaps:
        res = h.resources
        used = sum(r.memory_mb for r in h.residencies if r.state in HOLDS_MEMORY_STATES)
        age = None if h.heartbeat_at is None else round(now - h.heartbeat_at, 3)
        rec = fleet.hosts.get(h.host_id)
        fresh = heartbeat_live(h.heartbeat_at, now, limits)
        offered, offered_why = offered_memory(h)
        rows.append({
            "host_id": h.host_id, "state": h.state, "fresh": fresh,
            "heartbeat_age_seconds": age, "capacity_mb": res.capacity_mb, "reserved_mb": res.reserved_mb,
            "unmanaged_mb": h.unmanaged_memory_mb, "used_mb": used,
            "free_mb": res.capacity_mb - res.reserved_mb - h.unmanaged_memory_mb - used,
            # What the planner may use: offered_mb in all, planner_free_mb of it not yet taken
            # (before admission headroom), offered_reasons why it is less than capacity_mb.
            "offered_mb": offered, "planner_free_mb": max(0, offered - h.unmanaged_memory_mb - used),
            "offered_reasons": offered_why,
            "failure_domain": res.failure_domain, "tags": list(res.tags), "runtimes": list(res.runtimes),
            "residencies": [
                {"model_id": r.model_id, "state": r.state, "managed": r.managed, "pinned": r.pinned,
                 "memory_mb": r.memory_mb, "active_requests": r.active_requests, "artifact_sha256": r.artifact_sha256}
                for r in h.residencies
            ],
            "cached": len(h.cached),
            "hardware": hardware_row(res, h.disk_free_bytes, h.disk_total_bytes),
            "actuator_capabilities": list(h.actuator_capabilities),
            "protection_reason": rec.protection_reason if rec is not None else "",
            "override": _b(rec.override) if rec is not None and rec.override is not None else None,
            "warnings": list(getattr(rec.heartbeat, "warnings", ()) or ()) if rec is not None and rec.heartbeat else [],
            **_use(rec.heartbeat if rec is not None else None),
            # Revoked by the operator (`gridctl node revoke`): when (log receipt time) and why.
            "revoked": rec is not None and rec.revoked_at is not None,
            "revoked_at": rec.revoked_at if rec is not None else None,
            "revoked_reason": rec.revoked_reason if rec is not None else "",
        })
    return rows


def _use(hb: HostHeartbeat | None) -> dict[str, Any]:
    """Whose machine the host is, from its latest heartbeat (HostHeartbeat.use): `use` is
    "dedicated" (joined with `--dedicated`), "employee" (joined without) or "" (not joined by
    invitation, or an agent that does not say); `yield_to_user_seconds` how recently its user's
    input throttles it (None: never, or not said)."""
    use = hb.use if hb is not None else msgspec.UNSET
    if isinstance(use, msgspec.UnsetType):
        return {"use": "", "yield_to_user_seconds": None}
    kind = "" if use.dedicated is None else "dedicated" if use.dedicated else "employee"
    return {"use": kind, "yield_to_user_seconds": use.yield_to_user_seconds}


def _revoked_warnings(rows: list[dict[str, Any]]) -> list[str]:
    return [f"host {h['host_id']}: credential revoked by the operator at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(h['revoked_at']))}"
            + (f" ({h['revoked_reason']})" if h["revoked_reason"] else "")
            + "; it can rejoin only with a new invitation"
            for h in rows if h["revoked"]]


def _with_qualifications(rows: list[dict[str, Any]], now: float, snaps: tuple[HostView, ...]) -> list[dict[str, Any]]:
    """Each host row with the host's latest qualification per (runtime, model) and its age."""
    by_host = {h.host_id: h for h in snaps}
    for row in rows:
        host = by_host.get(row["host_id"])
        row["qualifications"] = [
            {"runtime": q.runtime, "model_id": q.model_id, "artifact_sha256": q.artifact_sha256,
             "result": "passed" if q.passed else "failed", "failed_step": q.failed_step, "reason": q.reason,
             "age_seconds": round(now - q.recorded_at, 3)}
            for q in (host.qualifications if host is not None else ())
        ]
    return rows


def _qualification_exclusions(ctl: ControllerView, snaps: tuple[HostView, ...]) -> list[dict[str, Any]]:
    """The hosts each profile requiring qualification may not use, by the planner's own rule."""
    catalog = ctl.states["catalog"]
    rows = []
    for model_id in sorted(catalog.profiles):
        profile = catalog.profiles[model_id]
        if not profile.require_qualified:
            continue
        rows.extend({"model_id": model_id, "host_id": h.host_id, "reason": R.NOT_QUALIFIED,
                     "detail": why_not(h, profile)}
                    for h in snaps if not host_qualifies(h, profile))
    return rows


def _models(ctl: ControllerView, ready: Mapping[str, int]) -> list[dict[str, Any]]:
    catalog = ctl.states["catalog"]
    plan, pin = ctl.last_plan, ctl.last_input
    expl = {e.model_id: e for e in plan.explanations} if plan is not None else {}
    short = {s.model_id: s for s in plan.shortfalls} if plan is not None else {}
    placed: dict[str, int] = {}
    for p in plan.placements if plan is not None else ():
        placed[p.model_id] = placed.get(p.model_id, 0) + 1
    demand = {d.model_id: d for d in pin.demand} if pin is not None else {}
    rows = []
    for model_id in sorted(set(catalog.profiles) | set(catalog.retired)):
        e, s, d = expl.get(model_id), short.get(model_id), demand.get(model_id)
        wanted = e.wanted if e is not None else (d.replicas if d is not None else 0)
        rows.append({
            "model_id": model_id, "retired": model_id in catalog.retired and model_id not in catalog.profiles,
            "wanted": 0 if model_id not in catalog.profiles else wanted, "placed": placed.get(model_id, 0),
            "ready": ready.get(model_id, 0), "evidence": d.evidence if d is not None else "",
            "demand_reason": d.reason if d is not None else "",
            "shortfall": None if s is None else {"wanted": s.wanted, "placed": s.placed, "reason": s.reason,
                                                  "detail": s.detail},
        })
    return rows


def _load_failure_rows(actions: ActionsState) -> list[LoadFailure]:
    return sorted(actions.load_failures.values(), key=lambda f: (f.model_id, f.host_id))


def _with_load_failures(rows: list[dict[str, Any]], failures: list[LoadFailure]) -> list[dict[str, Any]]:
    """A model with fewer ready replicas than wanted, which the plan placed (no planning
    shortfall), is short because a host failed to load it: show that host's reason (newest
    failure first), e.g. artifact_not_cached, as its shortfall."""
    newest: dict[str, LoadFailure] = {}
    for f in failures:
        if f.model_id not in newest or (f.at, f.host_id) > (newest[f.model_id].at, newest[f.model_id].host_id):
            newest[f.model_id] = f
    for row in rows:
        f = newest.get(row["model_id"])
        if f is None or row["shortfall"] is not None or row["retired"] or row["ready"] >= row["wanted"]:
            continue
        # "placed" counts replicas that serve: a placement whose load failed is not one.
        row["shortfall"] = {"wanted": row["wanted"], "placed": row["ready"], "reason": f.reason,
                            "detail": f"load failed on host {f.host_id}" + (f": {f.detail}" if f.detail else ""),
                            "host_id": f.host_id}
    return rows


def _unplaceable(ctl: ControllerView, now: float, snaps: tuple[HostView, ...],
                 ready: Mapping[str, int]) -> list[dict[str, Any]]:
    """Models that cannot be placed, and why: the verdict the gateway gives a request for them
    (grid.fleet.placeability), from the same facts: the latest recorded plan and the fleet."""
    catalog, plans = ctl.states["catalog"], ctl.states["plans"]
    recorded = plans.latest
    try:
        plan = decode_plan(bytes(recorded.plan)) if recorded is not None else None
    except Exception:  # a plan status cannot read loses only the shortfall half of the verdict
        plan = None
    rows = []
    for model_id in sorted(catalog.profiles):
        if ready.get(model_id, 0):
            continue
        current = plan_saw_profile(recorded.based_on if recorded is not None else None,
                                   catalog.revisions.get(model_id, 0))
        verdict = unplaceable(catalog.profiles[model_id], snaps, plan, plan_current=current, now=now,
                              heartbeat_timeout_seconds=ctl.limits.heartbeat_timeout_seconds)
        if verdict is not None:
            rows.append({"model_id": model_id, "reason": verdict.reason, "detail": verdict.detail})
    return rows


# Unplaced claims named one by one in warnings (the list in `unplaced_claims` is complete).
MAX_UNPLACED_WARNINGS = 10
_UNPLACED_WHY = {
    placed_proj.REASON_NOT_IN_PLAN: "the latest plan does not assign it there",
    placed_proj.REASON_NO_WARM_ACK: "no warm ack of that host confirms it",
    placed_proj.REASON_ARTIFACT_MISMATCH: "its artifact is not the profile's",
    placed_proj.REASON_NOT_CORROBORATED: "no warm this controller commanded there was acknowledged",
    routes_proj.REASON_NOT_ADMITTED: "no operator admitted this external route (gridctl engine admit)",
    routes_proj.REASON_KIND_MISMATCH: "the operator admitted another kind of engine there",
    routes_proj.REASON_ENDPOINT_MISMATCH: "the operator admitted another endpoint there",
    routes_proj.REASON_HOST_NOT_ALLOWED: "the profile does not allow this host",
    routes_proj.REASON_HOST_DENIED: "the profile denies this host",
}


def _unplaced_claims(ctl: ControllerView, snaps: tuple[HostView, ...]) -> list[placed_proj.UnplacedClaim]:
    """Heartbeat claims (of fresh hosts) the gateway does not route, judged as the gateway judges them
    (managed ones only with the placed projection: without it there is nothing to judge them by)."""
    catalog = ctl.states["catalog"]
    return routes_proj.unadmitted_claims(snaps, routes=catalog.routes, profiles=catalog.profiles,
                                         placed=ctl.states.get("placed"), now=ctl.now, policy=ctl.limits)


def _unplaced_warnings(claims: list[placed_proj.UnplacedClaim]) -> list[str]:
    out = [f"{'unplaced' if c.managed else 'unadmitted external'} claim: host {c.host_id} reports "
           f"{c.model_id} {c.state}, routed nowhere: "
           f"{_UNPLACED_WHY.get(c.reason, c.reason)} ({c.reason})" for c in claims[:MAX_UNPLACED_WARNINGS]]
    if len(claims) > MAX_UNPLACED_WARNINGS:
        out.append(f"unplaced claim: {len(claims) - MAX_UNPLACED_WARNINGS} more (see unplaced_claims)")
    return out


def _drains(ctl: ControllerView, now: float) -> tuple[list[dict[str, Any]], tuple[drain_check.DrainRisk, ...]]:
    """Each draining host: since when (log time), its evacuation deadline, and the models whose last
    ready copy is there with no replacement in the plan (kept past the deadline; drain_check)."""
    since = fleet_proj.evacuating_since(ctl.states["fleet"], now)
    deadline = ctl.limits.evacuation_deadline_seconds
    risks = drain_check.draining_risks(ctl.last_input, ctl.last_plan, since)
    rows = [{"host_id": host_id, "since": at, "deadline_at": at + deadline, "deadline_passed": now >= at + deadline,
             "risks": [_b(r) for r in risks if r.host_id == host_id]}
            for host_id, at in sorted(since.items())]
    return rows, risks


# Rejections status lists one by one (the counts are complete).
LATEST_REJECTIONS = 5


def quarantine_rows(pin: PlannerInput | None, now: float) -> list[dict[str, Any]]:
    """The flap quarantines the last tick planned with (its input is what the plan obeyed)."""
    if pin is None:
        return []
    return [{**_b(q), "remaining_seconds": max(0.0, q.until - now)} for q in pin.flap_quarantines]


def _rejected(ctl: ControllerView) -> dict[str, Any]:
    by_reason = dict(sorted(ctl.rejected_events.items()))
    latest = ctl.rejections[-LATEST_REJECTIONS:]
    return {
        "total": sum(by_reason.values()), "by_reason": by_reason,
        "latest": [{"stream": r.stream, "seq": r.seq, "subject": r.subject, "reason": r.reason,
                    "role": r.role or None} for r in latest],
    }


def _forecasts(ctl: ControllerView) -> dict[str, Any]:
    fc = ctl.last_forecast
    if fc is None:
        pin = ctl.last_input
        return {"version": "baseline", "targets": _b(pin.demand) if pin is not None else [], "models": [],
                "workloads": []}
    return {
        "version": fc.version, "now": fc.now, "targets": _b(fc.targets), "models": _b(fc.models),
        "workloads": _b(fc.workloads), "evidence_observations": fc.evidence_observations,
        "evidence_concurrency": fc.evidence_concurrency,
        # The demand bucket (grid.events.control.ForecastWindowSet) and the buckets kept.
        "bucket_seconds": fc.bucket_seconds, "window_buckets": fc.window_buckets,
    }


def _workloads(ctl: ControllerView, snaps: tuple[HostView, ...], ready: Mapping[str, int]) -> list[dict[str, Any]]:
    """The admission rows, read against the profiles and learned timings the plan was made with
    (the current catalog's profiles when the plan's input is not at hand)."""
    pin = ctl.last_input
    if pin is not None:
        profiles = {p.model_id: p for p in pin.profiles}
        timings: tuple[TimingSample, ...] = pin.timings
    else:
        profiles, timings = dict(ctl.states["catalog"].profiles), ()
    return workload_rows(ctl.last_forecast, ctl.last_plan, ready, snaps, profiles, timings)


def _plan(ctl: ControllerView) -> dict[str, Any] | None:
    plan = ctl.last_plan
    if plan is None:
        return None
    try:
        text = list(render_explanation(plan))
    except Exception as exc:  # explanation rendering must never break status
        text = [f"(explanation unavailable: {type(exc).__name__})"]
    return {
        "generation": ctl.last_generation, "recorded": bool(ctl.last_tick and ctl.last_tick.plan_recorded),
        "planner_version": plan.planner_version, "inputs_digest": plan.inputs_digest, "now": plan.now,
        "placements": _b(plan.placements), "preemptions": _b(plan.preemptions), "shortfalls": _b(plan.shortfalls),
        "prefetch": _b(plan.prefetch), "evictions": _b(plan.evictions),
        "explanations": _b(plan.explanations), "explanation_text": text,
    }


def build_status(ctl: ControllerView, *, admin_url: str | None = None) -> dict[str, Any]:
    """The status document of a controller snapshot; `admin_url` is where its admin API listens."""
    now = ctl.now
    catalog = ctl.states["catalog"]
    actions: ActionsState = ctl.states["actions"]
    records = sorted(actions.actions.values(), key=lambda r: r.issued_seq)
    open_records = [r for r in records if r.terminal_at is None]
    pending = [r for r in open_records if not r.withdrawn]
    withdrawn = [r for r in open_records if r.withdrawn]
    terminal = sorted((r for r in records if r.terminal_at is not None),
                      key=lambda r: (r.terminal_at or 0.0, r.issued_seq), reverse=True)
    limit = ctl.history_limit
    durable = ctl.log_durable
    warnings = list(ctl.warnings)
    snaps = fleet_proj.snapshots(ctl.states["fleet"], now)
    # An unadmitted external engine is no ready replica (grid.projections.routes.supply_view).
    ready = ready_replicas(tuple(routes_proj.supply_view(h, routes=catalog.routes, profiles=catalog.profiles)
                                 for h in snaps), now, ctl.limits)  # one count for models, unplaceable, workloads
    if ctl.lease_error:
        warnings.append(f"lease: {ctl.lease_error}")
    rejected = _rejected(ctl)
    if rejected["total"]:
        warnings.append(f"{describe_rejected(rejected['by_reason'])} (not provably written by an identity that "
                        "may write their subject, or a heartbeat replayed or signed outside the clock skew: "
                        "skipped, never folded; latest in rejected_events)")
    warnings.extend(over_budget_warnings(list(ctl.over_budget)))  # type: ignore[arg-type]
    unplaced = _unplaced_claims(ctl, snaps)
    warnings.extend(_unplaced_warnings(unplaced))
    host_rows = _hosts(ctl, now, snaps)
    warnings.extend(_revoked_warnings(host_rows))
    fresh = {h["host_id"]: h["fresh"] for h in host_rows}
    store = dict(ctl.store) if ctl.store is not None else store_view.unmeasured("this controller reports no store")
    drains, drain_risks = _drains(ctl, now)
    warnings.extend(drain_check.warning(r, ctl.limits.evacuation_deadline_seconds) for r in drain_risks)
    if ctl.store is not None and ctl.store.get("detail"):
        warnings.append(f"event log store: {ctl.store['detail']}")
    return {
        "now": now,
        "controller": {
            "id": ctl.controller_id, "epoch": ctl.epoch, "started_at": ctl.started_at,
            "restart_grace_until": ctl.restart_grace_until, "admin_url": admin_url,
            "lease": ctl.lease,
            "published_total": ctl.published_total, "withdrawn_total": ctl.withdrawn_total,
            "plan_conflicts": ctl.plan_conflicts,
        },
        "controllers": list(ctl.controllers),
        "mode": {
            "requested": catalog.mode,
            "effective": ctl.last_tick.effective_mode if ctl.last_tick is not None else catalog.mode,
            "changed_at": catalog.mode_changed_at, "log_durable": durable,
        },
        "revisions": {
            "dirty": ctl.dirty_revision, "processed": ctl.processed_revision, "success": ctl.success_revision,
            "positions": dict(sorted(ctl.positions.items())), "profiles": dict(sorted(catalog.revisions.items())),
            "plans": ctl.states["plans"].count, "malformed_events": ctl.malformed_events,
        },
        "hosts": _with_qualifications(host_rows, now, snaps),
        "profiles": [_b(catalog.profiles[k]) for k in sorted(catalog.profiles)],
        "retired": [{"model_id": t.model_id, "retired_at": t.retired_at} for _, t in sorted(catalog.retired.items())],
        "models": _with_load_failures(_models(ctl, ready), _load_failure_rows(actions)),
        "load_failures": [_b(f) for f in _load_failure_rows(actions)],
        "flap_quarantines": quarantine_rows(ctl.last_input, now),
        "drains": drains,
        "unplaceable": _unplaceable(ctl, now, snaps, ready),
        "unplaced_claims": [_b(c) for c in unplaced],
        "qualification_exclusions": _qualification_exclusions(ctl, snaps),
        "workloads": _workloads(ctl, snaps, ready),
        "forecasts": _forecasts(ctl),
        "plan": _plan(ctl),
        "reconciliation": _b(ctl.last_result) if ctl.last_result is not None else None,
        "pending_commands": [_pending_row(r, fresh) for r in pending[-limit:]],
        "delivered_pending_action_ids": [r.command.action_id for r in pending if r.status == "accepted"],
        "withdrawn_commands": [_command_row(r) for r in withdrawn[-limit:]],
        "withdrawn_destructive": [_command_row(r) for r in withdrawn if r.command.kind in DESTRUCTIVE_KINDS][-limit:],
        "history": [_command_row(r) for r in terminal[:limit]],
        "last_tick": _b(ctl.last_tick) if ctl.last_tick is not None else None,
        "ticks": [_b(t) for t in list(ctl.ticks)[-10:]],
        "rejected_events": rejected,
        "over_budget_hosts": [dict(r) for r in ctl.over_budget],
        "store": store,
        "warnings": warnings,
    }
