"""The dashboard's view model: a pure function of the projection states, a forecast and `now`.

The browser receives exactly this structure (JSON) on every change; it renders and never
computes. Keeping the view pure means the page shows what `gridctl status` would say for the
same log position, and a test can pin the view of a given set of events.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from grid.demand.forecast import Forecast
from grid.events.commands import CommandIssued
from grid.events.plan import PlanCreated
from grid.fleet import HEARTBEAT_TIMEOUT_SECONDS, HeartbeatWindow, heartbeat_fresh
from grid.fleet.planning import Plan, decode_plan
from grid.planner.explain import render_explanation
from grid.planner.plan import PLANNER_VERSION
from grid.projections import fleet as fleet_proj
from grid.projections.actions import ActionRecord, ActionsState
from grid.projections.catalog import CatalogState
from grid.projections.fleet import FleetState, HostRecord
from grid.projections.plans import PlansState

VIEW_VERSION = 1
# Bounds keep one push small however long the grid has run.
RECENT_ACTIONS = 40
TIMELINE_PER_RESIDENCY = 12


class ResidencyRow(msgspec.Struct, frozen=True, kw_only=True):
    model_id: str
    state: str
    memory_mb: int
    managed: bool
    active_requests: int
    loaded_age_seconds: float | None


class HostRow(msgspec.Struct, frozen=True, kw_only=True):
    host_id: str
    state: str
    fresh: bool
    heartbeat_age_seconds: float | None
    protection_reason: str
    failure_domain: str
    capacity_mb: int
    reserved_mb: int
    resident_mb: int
    unmanaged_mb: int
    residencies: tuple[ResidencyRow, ...]
    warnings: tuple[str, ...]


class ModelRow(msgspec.Struct, frozen=True, kw_only=True):
    model_id: str
    priority: int
    memory_mb: int
    min_replicas: int
    max_replicas: int
    wanted: int
    placed: int
    ready: int
    evidence: str
    shortfall_reason: str
    rate: float
    observed_rate: float
    forecast_reason: str


class WorkloadRow(msgspec.Struct, frozen=True, kw_only=True):
    workload: str
    status: str
    observed_rate: float
    rate: float
    model_id: str | None


class TimelineStep(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    status: str
    at_age_seconds: float
    duration_seconds: float | None


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    host_id: str
    model_id: str
    steps: tuple[TimelineStep, ...]


class ActionRow(msgspec.Struct, frozen=True, kw_only=True):
    action_id: str
    kind: str
    host_id: str
    model_id: str
    status: str
    reason: str
    message: str
    issued_age_seconds: float
    duration_seconds: float | None


class PlanView(msgspec.Struct, frozen=True, kw_only=True):
    generation: str
    age_seconds: float
    planner_version: str
    controller_id: str
    controller_term: int
    placements: int
    preemptions: int
    shortfalls: tuple[str, ...]
    explanation: tuple[str, ...]


class DashboardView(msgspec.Struct, frozen=True, kw_only=True):
    version: int = VIEW_VERSION
    now: float
    mode: str
    hosts: tuple[HostRow, ...]
    models: tuple[ModelRow, ...]
    workloads: tuple[WorkloadRow, ...]
    plan: PlanView | None
    actions: tuple[ActionRow, ...]
    timelines: tuple[Timeline, ...]
    positions: dict[str, int]


def _age(now: float, at: float | None) -> float | None:
    return None if at is None else round(max(0.0, now - at), 3)


def _host_row(record: HostRecord, now: float, timeout: float) -> HostRow:
    hb = record.heartbeat
    res = record.resources
    residencies = tuple(
        ResidencyRow(
            model_id=r.model_id,
            state=r.state,
            memory_mb=r.memory_mb,
            managed=r.managed,
            active_requests=r.active_requests,
            loaded_age_seconds=r.loaded_age_seconds,
        )
        for r in sorted(hb.residencies if hb else (), key=lambda r: (r.model_id, r.state))
    )
    age = _age(now, record.heartbeat_at)
    return HostRow(
        host_id=record.host_id,
        state=fleet_proj.effective_state(record, now),
        fresh=heartbeat_fresh(record.heartbeat_at, now, HeartbeatWindow(timeout)),
        heartbeat_age_seconds=age,
        protection_reason=record.protection_reason,
        failure_domain=res.failure_domain if res else "",
        capacity_mb=res.capacity_mb if res else 0,
        reserved_mb=res.reserved_mb if res else 0,
        resident_mb=sum(r.memory_mb for r in residencies if r.state not in ("cached", "failed")),
        unmanaged_mb=hb.unmanaged_memory_mb if hb else 0,
        residencies=residencies,
        warnings=hb.warnings if hb else (),
    )


def _action_row(rec: ActionRecord, now: float) -> ActionRow:
    cmd: CommandIssued = rec.command
    return ActionRow(
        action_id=cmd.action_id,
        kind=cmd.kind,
        host_id=cmd.host_id,
        model_id=cmd.model_id,
        status="withdrawn" if rec.withdrawn else rec.status,
        reason=rec.withdrawn_reason or cmd.reason,
        message=rec.message,
        issued_age_seconds=_age(now, rec.issued_at) or 0.0,
        duration_seconds=rec.duration_seconds,
    )


def _timelines(actions: ActionsState, now: float) -> tuple[Timeline, ...]:
    """Each residency's lifecycle as the commands that moved it (load, warm, drain, unload)."""
    by_key: dict[tuple[str, str], list[ActionRecord]] = {}
    for rec in actions.actions.values():
        by_key.setdefault((rec.command.host_id, rec.command.model_id), []).append(rec)
    out = []
    for (host_id, model_id), recs in sorted(by_key.items()):
        recs.sort(key=lambda r: r.issued_seq)
        steps = tuple(
            TimelineStep(
                kind=r.command.kind,
                status="withdrawn" if r.withdrawn else r.status,
                at_age_seconds=_age(now, r.issued_at) or 0.0,
                duration_seconds=r.duration_seconds,
            )
            for r in recs[-TIMELINE_PER_RESIDENCY:]
        )
        out.append(Timeline(host_id=host_id, model_id=model_id, steps=steps))
    return tuple(out)


def _decode(latest: PlanCreated) -> Plan | None:
    # A plan payload this version cannot read (another planner version's shape) is shown as
    # such; the rest of the page does not depend on it.
    try:
        return decode_plan(bytes(latest.plan))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _plan_view(plans: PlansState, now: float) -> PlanView | None:
    latest = plans.latest
    if latest is None:
        return None
    plan = _decode(latest)
    if plan is None:
        plan = Plan(planner_version=latest.planner_version, inputs_digest=latest.inputs_digest, now=latest.now)
        unreadable = (f"plan payload not readable by {PLANNER_VERSION}",)
    else:
        unreadable = ()
    return PlanView(
        generation=latest.generation,
        age_seconds=_age(now, plans.latest_at if plans.latest_at is not None else latest.at) or 0.0,
        planner_version=latest.planner_version,
        controller_id=latest.controller_id,
        controller_term=latest.controller_term,
        placements=len(plan.placements),
        preemptions=len(plan.preemptions),
        shortfalls=tuple(f"{s.model_id}: {s.placed}/{s.wanted} placed, {s.reason}" + (f" ({s.detail})" if s.detail else "")
                         for s in plan.shortfalls),
        explanation=unreadable + tuple(render_explanation(plan)),
    )


def build_view(
    states: Mapping[str, Any],
    now: float,
    *,
    forecast: Forecast | None = None,
    positions: Mapping[str, int] | None = None,
    heartbeat_timeout_seconds: float = HEARTBEAT_TIMEOUT_SECONDS,
) -> DashboardView:
    """The whole page's data at `now` (pure)."""
    fleet: FleetState = states["fleet"]
    catalog: CatalogState = states["catalog"]
    actions: ActionsState = states["actions"]
    plans: PlansState = states["plans"]

    hosts = tuple(_host_row(fleet.hosts[h], now, heartbeat_timeout_seconds) for h in sorted(fleet.hosts))
    ready: dict[str, int] = {}
    for row in hosts:
        for r in row.residencies:
            if r.state == "ready" and row.fresh:
                ready[r.model_id] = ready.get(r.model_id, 0) + 1

    plan = None if plans.latest is None else _decode(plans.latest)
    explained = {ex.model_id: ex for ex in plan.explanations} if plan else {}
    predicted = {m.model_id: m for m in forecast.models} if forecast else {}
    models = []
    for model_id in sorted(set(catalog.profiles) | set(explained)):
        prof = catalog.profiles.get(model_id)
        ex = explained.get(model_id)
        fc = predicted.get(model_id)
        models.append(ModelRow(
            model_id=model_id,
            priority=prof.priority if prof else (ex.priority if ex else 0),
            memory_mb=prof.memory_mb if prof else 0,
            min_replicas=prof.min_replicas if prof else 0,
            max_replicas=prof.max_replicas if prof else 0,
            wanted=ex.wanted if ex else 0,
            placed=ex.placed if ex else 0,
            ready=ready.get(model_id, 0),
            evidence=ex.evidence if ex else "",
            shortfall_reason=ex.shortfall_reason if ex else "",
            rate=round(fc.rate, 4) if fc else 0.0,
            observed_rate=round(fc.observed_rate, 4) if fc else 0.0,
            forecast_reason=fc.reason if fc else "",
        ))
    workloads = tuple(
        WorkloadRow(workload=w.workload, status=w.status, observed_rate=round(w.observed_rate, 4),
                    rate=round(w.rate, 4), model_id=w.model_id)
        for w in (forecast.workloads if forecast else ())
    )
    recent = sorted(actions.actions.values(), key=lambda r: r.issued_seq, reverse=True)[:RECENT_ACTIONS]
    return DashboardView(
        now=now,
        mode=catalog.mode,
        hosts=hosts,
        models=tuple(models),
        workloads=workloads,
        plan=_plan_view(plans, now),
        actions=tuple(_action_row(r, now) for r in recent),
        timelines=_timelines(actions, now),
        positions=dict(sorted((positions or {}).items())),
    )


_encoder = msgspec.json.Encoder(order="deterministic")


def encode_view(view: DashboardView) -> bytes:
    return _encoder.encode(view)
