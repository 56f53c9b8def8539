"""The allocator status document (GET /allocator/status, `gridctl status --json`).

Shape (every key always present; lists bounded):

    controller   id, epoch, started_at, restart_grace_until, lease {state, term, holder_id, ...}
    mode         requested, effective, changed_at, log_durable
    revisions    dirty, processed, success, positions {stream: seq}, profiles {model: seq}, plans
    hosts        [{host_id, state, fresh, heartbeat_age_seconds, capacity_mb, reserved_mb,
                   unmanaged_mb, used_mb, free_mb, failure_domain, tags, residencies [...],
                   cached, protection_reason, override}]
    profiles     [ModelProfile fields]
    retired      [{model_id, retired_at}]
    models       [{model_id, wanted, placed, ready, evidence, shortfall, retired}]
    forecasts    {version, targets [...], models [...], workloads [...]} (baseline when absent)
    plan         {generation, recorded, planner_version, inputs_digest, placements, preemptions,
                  shortfalls, explanations, explanation_text}
    reconciliation  the ReconcileResult (actions, deferred, ignored, blocked, withdrawals, ...)
    pending_commands, delivered_pending_action_ids, withdrawn_commands, withdrawn_destructive
    history      recent terminal actions, newest first
    ticks        recent tick reports; last_tick
    warnings     snapshot quarantine, non-durable log, forecast failures, plan conflicts, ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from grid.controller import inputs as inputs_mod
from grid.controller.reconcile import SERVING_STATES
from grid.events.commands import DESTRUCTIVE_KINDS
from grid.planner.types import HostSnapshot
from grid.projections import fleet as fleet_proj
from grid.projections.actions import ActionRecord, ActionsState

if TYPE_CHECKING:
    from grid.controller.service import Controller


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


def _hosts(ctl: "Controller", now: float, snaps: tuple[HostSnapshot, ...]) -> list[dict[str, Any]]:
    fleet = ctl.runner["fleet"]
    limits = ctl.settings.limits
    timeout = limits.heartbeat_timeout_seconds
    rows = []
    for h in snaps:
        res = h.resources
        used = sum(r.memory_mb for r in h.residencies if r.state in SERVING_STATES)
        age = None if h.heartbeat_at is None else round(now - h.heartbeat_at, 3)
        rec = fleet.hosts.get(h.host_id)
        rows.append({
            "host_id": h.host_id, "state": h.state, "fresh": age is not None and -limits.future_skew_seconds <= age <= timeout,
            "heartbeat_age_seconds": age, "capacity_mb": res.capacity_mb, "reserved_mb": res.reserved_mb,
            "unmanaged_mb": h.unmanaged_memory_mb, "used_mb": used,
            "free_mb": res.capacity_mb - res.reserved_mb - h.unmanaged_memory_mb - used,
            "failure_domain": res.failure_domain, "tags": list(res.tags), "runtimes": list(res.runtimes),
            "residencies": [
                {"model_id": r.model_id, "state": r.state, "managed": r.managed, "pinned": r.pinned,
                 "memory_mb": r.memory_mb, "active_requests": r.active_requests, "artifact_sha256": r.artifact_sha256}
                for r in h.residencies
            ],
            "cached": len(h.cached),
            "actuator_capabilities": list(h.actuator_capabilities),
            "protection_reason": rec.protection_reason if rec is not None else "",
            "override": _b(rec.override) if rec is not None and rec.override is not None else None,
            "warnings": list(getattr(rec.heartbeat, "warnings", ()) or ()) if rec is not None and rec.heartbeat else [],
        })
    return rows


def _models(ctl: "Controller", now: float, snaps: tuple[HostSnapshot, ...]) -> list[dict[str, Any]]:
    catalog = ctl.runner["catalog"]
    plan, pin = ctl.last_plan, ctl.last_input
    expl = {e.model_id: e for e in plan.explanations} if plan is not None else {}
    short = {s.model_id: s for s in plan.shortfalls} if plan is not None else {}
    placed: dict[str, int] = {}
    for p in plan.placements if plan is not None else ():
        placed[p.model_id] = placed.get(p.model_id, 0) + 1
    demand = {d.model_id: d for d in pin.demand} if pin is not None else {}
    ready: dict[str, int] = {}
    timeout = ctl.settings.limits.heartbeat_timeout_seconds
    for h in snaps:
        if h.heartbeat_at is None or now - h.heartbeat_at > timeout:
            continue
        for r in h.residencies:
            if r.state == "ready":
                ready[r.model_id] = ready.get(r.model_id, 0) + 1
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


def _forecasts(ctl: "Controller") -> dict[str, Any]:
    fc = ctl.last_forecast
    if fc is None:
        pin = ctl.last_input
        return {"version": "baseline", "targets": _b(pin.demand) if pin is not None else [], "models": [],
                "workloads": []}
    return {
        "version": fc.version, "now": fc.now, "targets": _b(fc.targets), "models": _b(fc.models),
        "workloads": _b(fc.workloads), "evidence_observations": fc.evidence_observations,
        "evidence_concurrency": fc.evidence_concurrency,
    }


def _plan(ctl: "Controller") -> dict[str, Any] | None:
    plan = ctl.last_plan
    if plan is None:
        return None
    _fn, version, render = inputs_mod.planner()
    text: list[str] = []
    if render is not None:
        try:
            rendered = render(plan)
            text = list(rendered) if not isinstance(rendered, str) else rendered.splitlines()
        except Exception as exc:  # explanation rendering must never break status
            text = [f"(explanation unavailable: {type(exc).__name__})"]
    return {
        "generation": ctl.last_generation, "recorded": bool(ctl.last_tick and ctl.last_tick.plan_recorded),
        "planner_version": plan.planner_version, "inputs_digest": plan.inputs_digest, "now": plan.now,
        "placements": _b(plan.placements), "preemptions": _b(plan.preemptions), "shortfalls": _b(plan.shortfalls),
        "explanations": _b(plan.explanations), "explanation_text": text,
    }


def build_status(ctl: "Controller") -> dict[str, Any]:
    now = ctl.clock.now()
    catalog = ctl.runner["catalog"]
    actions: ActionsState = ctl.runner["actions"]
    records = sorted(actions.actions.values(), key=lambda r: r.issued_seq)
    open_records = [r for r in records if r.terminal_at is None]
    pending = [r for r in open_records if not r.withdrawn]
    withdrawn = [r for r in open_records if r.withdrawn]
    terminal = sorted((r for r in records if r.terminal_at is not None),
                      key=lambda r: (r.terminal_at or 0.0, r.issued_seq), reverse=True)
    limit = ctl.settings.history_limit
    lease = ctl.lease
    durable = bool(getattr(ctl.log, "durable", False))
    grace_until = None if ctl.first_tick_at is None else ctl.first_tick_at + ctl.settings.restart_grace_seconds
    warnings = list(ctl.runner.warnings) + list(ctl.warnings)
    snaps = fleet_proj.snapshots(ctl.runner["fleet"], now)
    if lease is not None and lease.last_error and lease.state != "held":
        warnings.append(f"lease: {lease.last_error}")
    return {
        "now": now,
        "controller": {
            "id": ctl.controller_id, "epoch": ctl.epoch, "started_at": ctl.started_at,
            "restart_grace_until": grace_until, "admin_url": ctl.admin_url,
            "lease": lease.describe() if lease is not None else None,
            "published_total": ctl.published_total, "withdrawn_total": ctl.withdrawn_total,
            "plan_conflicts": ctl.plan_conflicts,
        },
        "mode": {
            "requested": catalog.mode,
            "effective": ctl.last_tick.effective_mode if ctl.last_tick is not None else catalog.mode,
            "changed_at": catalog.mode_changed_at, "log_durable": durable,
        },
        "revisions": {
            "dirty": ctl._dirty_revision, "processed": ctl._processed_revision, "success": ctl._success_revision,
            "positions": dict(sorted(ctl.runner.positions.items())), "profiles": dict(sorted(catalog.revisions.items())),
            "plans": ctl.runner["plans"].count, "malformed_events": ctl.runner.malformed,
        },
        "hosts": _hosts(ctl, now, snaps),
        "profiles": [_b(catalog.profiles[k]) for k in sorted(catalog.profiles)],
        "retired": [{"model_id": t.model_id, "retired_at": t.retired_at} for _, t in sorted(catalog.retired.items())],
        "models": _models(ctl, now, snaps),
        "forecasts": _forecasts(ctl),
        "plan": _plan(ctl),
        "reconciliation": _b(ctl.last_result) if ctl.last_result is not None else None,
        "pending_commands": [_command_row(r) for r in pending[-limit:]],
        "delivered_pending_action_ids": [r.command.action_id for r in pending if r.status == "accepted"],
        "withdrawn_commands": [_command_row(r) for r in withdrawn[-limit:]],
        "withdrawn_destructive": [_command_row(r) for r in withdrawn if r.command.kind in DESTRUCTIVE_KINDS][-limit:],
        "history": [_command_row(r) for r in terminal[:limit]],
        "last_tick": _b(ctl.last_tick) if ctl.last_tick is not None else None,
        "ticks": [_b(t) for t in list(ctl.ticks)[-10:]],
        "warnings": warnings,
    }
