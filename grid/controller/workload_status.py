"""Admission rows: what each active workload's `auto` traffic gets now (the `workloads` rows of status).

The forecast says which model a workload's demand is projected onto and whether it was admitted;
the authoritative plan says whether that model got replicas and, when not, why; the observed fleet
says whether the placed replicas serve or are still starting. One row per active (non-idle)
workload joins the three, so an operator sees a deferred or blocked workload and the concrete
reason, not only a model's shortfall. The rows explain the existing decision: they read what the
planner recorded (placements, shortfalls, staged preemptions, each model's explanation) and never
run a second solver, and nothing here changes a plan or the router.

Columns: ``model_id`` (the chosen model), ``offered_concurrency``, ``desired`` (the forecast's
target replicas for that model: what the plan was asked for, every workload and direct demand
of that model included), ``planned`` (the plan's placements of it), ``ready`` (ready replicas on
fresh hosts the gateway routes to), ``missing`` = max(0, desired - ready), ``eligible_hosts``
(the plan explanation's complete count of statically eligible hosts; None without one),
``startup_seconds`` (the fastest learned load+warm path over the hosts the plan places it on,
else the hosts its explanation lists as eligible, else the profile's prior; None for an unknown
profile), ``state``, ``reason`` (a constant) and ``detail``. ``replicas`` is the workload's own
projection and ``served_by`` a ready model the router sends its traffic to meanwhile.

States, first match wins (one per row; ``state_of`` below is the whole mapping):

1. ``infeasible``: no configured model scores the workload (reason no_candidate), or its model
   has no ready replica and no host passes the static checks (no_eligible_host), or its pin
   names a host that cannot take it (pin_unsatisfied);
2. ``deferred`` below the admission gate: the workload has traffic (so it is active and its
   demand stays visible) but fewer observations and less offered concurrency than the gate asks
   (reason below_evidence_gate, ``detail`` says how far below). The seed's gate exists exactly so
   such a workload gets no replica yet: its model is deliberately not desired under the current
   evidence, which is what deferred reports; leaving it out would hide live demand;
3. ``awaiting-plan``: there is no plan yet (no_plan), the plan was made before the forecast that
   made the workload active (plan_predates_forecast), or the plan never saw its model
   (model_not_in_plan: a profile newer than the plan);
4. ``ready``: at least one replica is ready and at least ``desired`` are;
5. ``starting``: a replica the plan places is loading or warming on its host;
6. ``planned``: the plan places a replica whose host has no process for it yet;
7. ``undersupplied``: 0 < ready < desired and nothing more is placed or starting (reason: the
   plan's shortfall reason for the model);
8. with nothing ready, placed or starting, the plan's shortfall decides:

   * ``blocked-by-residency``: the capacity the model needs is held by residencies the planner
     may not preempt: a staged preemption for it whose drain waits for the victim's minimum
     residency (``Preemption.not_before`` after the plan's time), or, for a model whose demand
     may preempt (not inferred-only), every lower-priority managed occupant of the hosts its
     explanation names as full now is fenced: operator-pinned (pinned_residency), inside its
     minimum residency (min_residency) or its model's only ready copy while that model wants
     more (protect_last_replica) -- the planner's own victim rules
     (grid.planner.preemption);
   * ``deferred``: intentionally left out under current capacity: the forecast desires no
     replica of the model this tick (not_planned), the plan's bounded wave stopped first
     (eviction_budget, placement_budget), or the model is held out by flap quarantine;
   * ``capacity-contended``: any other shortfall: memory, model slots, disk, co-location or
     failure domains taken by other work (insufficient_memory, model_limit, ...), including
     capacity the plan is already freeing (preemption_staged, awaiting_release,
     relocation_staged).

Pure: the forecast, the plan, ready counts, the observed hosts, the profiles and learned timings
the plan was made with in; rows out, sorted by workload. Times are the plan's own (``Plan.now``):
no clock is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grid.controller.reconcile import LAST_REPLICA, MIN_RESIDENCY
from grid.demand.forecast import (
    WORKLOAD_ADMITTED,
    WORKLOAD_BELOW_GATE,
    WORKLOAD_IDLE,
    WORKLOAD_NO_CANDIDATE,
    Forecast,
    WorkloadForecast,
)
from grid.events.control import ModelProfile
from grid.fleet import reasons as R
from grid.fleet.planning import ModelExplanation, Plan, TimingSample
from grid.fleet.views import HostView, ResidencyView
from grid.planner.preemption import within_min_residency
from grid.planner.scoring import startup_seconds

# --- admission states (the seed's nine; status, gridctl and the glossary use these values) ---
READY = "ready"
STARTING = "starting"
PLANNED = "planned"
UNDERSUPPLIED = "undersupplied"
DEFERRED = "deferred"
CAPACITY_CONTENDED = "capacity-contended"
BLOCKED_BY_RESIDENCY = "blocked-by-residency"
INFEASIBLE = "infeasible"
AWAITING_PLAN = "awaiting-plan"
STATES: tuple[str, ...] = (READY, STARTING, PLANNED, UNDERSUPPLIED, DEFERRED, CAPACITY_CONTENDED,
                           BLOCKED_BY_RESIDENCY, INFEASIBLE, AWAITING_PLAN)

# --- row reasons of this module (the others are the forecast's and the planner's own) -------
NO_PLAN = "no_plan"
PLAN_PREDATES_FORECAST = "plan_predates_forecast"
MODEL_NOT_IN_PLAN = "model_not_in_plan"
# The forecast desires no replica of the workload's model this tick and the plan reports none short.
NOT_PLANNED = "not_planned"
ALL_READY = "all_ready"
REPLICA_STARTING = "replica_starting"
PLACED_NOT_STARTED = "placed_not_started"
# Short of replicas with no shortfall recorded (e.g. a replica failed since the plan was made).
NOT_YET_REPLACED = "not_yet_replaced"
# Residency fences: reused from the reconciler and the planner, where they mean the same thing.
PINNED = R.PINNED_RESIDENCY

# Shortfall reasons that are the plan's own bounded choice, not a lack of room: deferred.
_DEFERRING = frozenset({R.EVICTION_BUDGET, R.PLACEMENT_BUDGET, R.FLAP_QUARANTINE})
# Shortfall reasons that say no host can take the model as things stand: infeasible.
_INFEASIBLE = frozenset({R.NO_ELIGIBLE_HOST, R.PIN_UNSATISFIED})
# Capacity is already being freed for the model: no residency fence question to ask.
_STAGED = frozenset({R.PREEMPTION_STAGED, R.AWAITING_RELEASE, R.RELOCATION_STAGED})
# A residency that holds its host's memory and a model slot (a victim candidate).
_OCCUPYING = frozenset({"ready", "loading", "warming"})
_STARTING = frozenset({"loading", "warming"})
# Plan evidence labels whose demand never preempts (grid.planner.placement: inferred-only is
# never destructive; "none" wants nothing).
_NON_DESTRUCTIVE = frozenset({"inferred", "none", ""})


def workload_rows(
    forecast: Forecast | None,
    plan: Plan | None,
    ready: Mapping[str, int],
    hosts: Sequence[HostView] = (),
    profiles: Mapping[str, ModelProfile] | None = None,
    timings: Sequence[TimingSample] = (),
) -> list[dict[str, Any]]:
    """One admission row per active workload of `forecast` (see the module docstring)."""
    if forecast is None:
        return []
    ctx = _Context(forecast, plan, ready, hosts, profiles or {}, timings)
    return [ctx.row(w) for w in sorted(forecast.workloads, key=lambda x: x.workload) if w.status != WORKLOAD_IDLE]


class _Context:
    """The joins every row reads, computed once per call."""

    def __init__(self, forecast: Forecast, plan: Plan | None, ready: Mapping[str, int],
                 hosts: Sequence[HostView], profiles: Mapping[str, ModelProfile],
                 timings: Sequence[TimingSample]) -> None:
        self.forecast, self.plan, self.ready, self.profiles = forecast, plan, ready, profiles
        self.hosts = {h.host_id: h for h in hosts}
        self.timings = {(t.host_id, t.model_id): t for t in timings}
        self.desired: dict[str, int] = {}
        for t in forecast.targets:
            self.desired[t.model_id] = self.desired.get(t.model_id, 0) + max(0, int(t.replicas))
        self.placed: dict[str, list[str]] = {}
        self.explained: dict[str, ModelExplanation] = {}
        self.short: dict[str, list[tuple[str, str]]] = {}
        if plan is not None:
            for p in plan.placements:
                self.placed.setdefault(p.model_id, []).append(p.host_id)
            self.explained = {ex.model_id: ex for ex in plan.explanations}
            for s in plan.shortfalls:
                self.short.setdefault(s.model_id, []).append((s.reason, s.detail))

    def row(self, w: WorkloadForecast) -> dict[str, Any]:
        model = w.model_id
        ex = self.explained.get(model) if model else None
        ready = max(0, int(self.ready.get(model, 0))) if model else 0
        desired = self.desired.get(model, 0) if model else 0
        row: dict[str, Any] = {
            "workload": w.workload, "state": "", "model_id": model,
            "offered_concurrency": round(w.offered_concurrency, 6), "replicas": w.replicas,
            "desired": desired, "planned": len(self.placed.get(model, ())) if model else 0,
            "ready": ready, "missing": max(0, desired - ready),
            "eligible_hosts": ex.eligible_count if ex is not None else None,
            "startup_seconds": self._startup(model, ex) if model else None,
            "reason": "", "detail": "", "served_by": None, "joint": w.joint, "exploring": w.exploring,
        }
        row["state"], row["reason"], row["detail"] = self._state(w, model, ex, ready, desired)
        if row["state"] not in (READY, STARTING):
            fallback = sorted((c for c in w.candidates if c.model_id != model and self.ready.get(c.model_id, 0)),
                              key=lambda c: (-c.suitability, c.model_id))
            row["served_by"] = fallback[0].model_id if fallback else None
        return row

    def _state(self, w: WorkloadForecast, model: str | None, ex: ModelExplanation | None,
               ready: int, desired: int) -> tuple[str, str, str]:
        fc, plan = self.forecast, self.plan
        if w.status == WORKLOAD_NO_CANDIDATE or (w.status == WORKLOAD_ADMITTED and not model):
            return INFEASIBLE, WORKLOAD_NO_CANDIDATE, "no configured model scores this workload"
        if w.status == WORKLOAD_BELOW_GATE or not model:
            return DEFERRED, WORKLOAD_BELOW_GATE, (
                f"{w.observations} of {fc.evidence_observations} observations, offered "
                f"{w.offered_concurrency:.2f} of {fc.evidence_concurrency:.2f} concurrency")
        if plan is None:
            return AWAITING_PLAN, NO_PLAN, ""
        if plan.now < fc.now:
            return AWAITING_PLAN, PLAN_PREDATES_FORECAST, f"plan at {plan.now:g}, forecast at {fc.now:g}"
        if ex is None:
            return AWAITING_PLAN, MODEL_NOT_IN_PLAN, ""
        short = self.short.get(model, [])
        if not ready and ex.eligible_count == 0:
            return INFEASIBLE, R.NO_ELIGIBLE_HOST, _detail_of(short, R.NO_ELIGIBLE_HOST)
        if ready and ready >= desired:
            return READY, ALL_READY, f"{ready} of {desired} desired ready"
        starting, waiting = self._placed_progress(model)
        if starting:
            return STARTING, REPLICA_STARTING, "on " + ", ".join(starting)
        if waiting:
            return PLANNED, PLACED_NOT_STARTED, "on " + ", ".join(waiting)
        primary = ex.shortfall_reason or (short[0][0] if short else "")
        detail = _detail_of(short, primary)
        if ready:
            return UNDERSUPPLIED, primary or NOT_YET_REPLACED, detail
        staged = self._fenced_drains(model)
        if staged:
            return BLOCKED_BY_RESIDENCY, MIN_RESIDENCY, staged
        if desired == 0 or ex.wanted == 0 or not primary:
            why = "the forecast desires no replica of this model now" if desired == 0 else detail
            return DEFERRED, NOT_PLANNED, why
        if primary in _INFEASIBLE:
            return INFEASIBLE, primary, detail
        if primary in _DEFERRING:
            return DEFERRED, primary, detail
        fence = self._fence(model, ex, primary)
        if fence is not None:
            return (BLOCKED_BY_RESIDENCY, *fence)
        return CAPACITY_CONTENDED, primary, detail

    def _placed_progress(self, model: str) -> tuple[list[str], list[str]]:
        """Hosts the plan places `model` on where it is loading/warming, and where no process
        for it exists yet (a ready copy there is already counted in `ready`)."""
        starting: list[str] = []
        waiting: list[str] = []
        for host_id in sorted(self.placed.get(model, ())):
            r = _residency(self.hosts.get(host_id), model)
            if r is None or r.state not in ("ready", *_STARTING):
                waiting.append(host_id)
            elif r.state in _STARTING:
                starting.append(host_id)
        return starting, waiting

    def _fenced_drains(self, model: str) -> str:
        """The staged preemptions for `model` whose drain waits for the victim's minimum
        residency (``Preemption.not_before`` after the plan's time), as a detail ("" for none)."""
        plan = self.plan
        assert plan is not None
        return "; ".join(f"{p.victim_model} on {p.host_id} drains not before {p.not_before:g}"
                         for p in plan.preemptions
                         if p.beneficiary_model == model and p.not_before is not None and p.not_before > plan.now)

    def _fence(self, model: str, ex: ModelExplanation, primary: str) -> tuple[str, str] | None:
        """(fence reason, detail) when residency fences hold the capacity `model` needs."""
        if primary in _STAGED or ex.evidence in _NON_DESTRUCTIVE:
            return None
        full = [v.host_id for v in ex.rejected if v.eligible]
        fences: list[tuple[str, str]] = []
        for host_id in full:
            host = self.hosts.get(host_id)
            if host is None:
                return None
            for r in host.residencies:
                if r.model_id == model or r.state not in _OCCUPYING or not r.managed:
                    continue
                victim = self.explained.get(r.model_id)
                if victim is not None and victim.priority >= ex.priority:
                    continue  # equal or higher priority is contention, never a victim
                why = self._fence_of(host_id, r, victim)
                if why is None:
                    return None  # a preemptable occupant: the room is contended, not fenced
                fences.append((why, f"{r.model_id} on {host_id}"))
        if not fences:
            return None
        # The reason names the first fence; the detail names each occupant, and its fence when they differ.
        mixed = len({why for why, _ in fences}) > 1
        return fences[0][0], "; ".join(f"{d} ({why})" if mixed else d for why, d in fences)

    def _fence_of(self, host_id: str, r: ResidencyView, victim: ModelExplanation | None) -> str | None:
        """The planner's victim rules (grid.planner.preemption), at the plan's time."""
        assert self.plan is not None
        profile = self.profiles.get(r.model_id)
        if r.pinned or (profile is not None and host_id in profile.pins):
            return PINNED
        if within_min_residency(self.plan.now, profile.min_residency_seconds if profile is not None else 0.0, r):
            return MIN_RESIDENCY
        if r.state == "ready" and victim is not None and victim.wanted > 1 and not any(
                h.host_id != host_id and (o := _residency(h, r.model_id)) is not None and o.state == "ready"
                for h in self.hosts.values()):
            return LAST_REPLICA
        return None

    def _startup(self, model: str, ex: ModelExplanation | None) -> float | None:
        profile = self.profiles.get(model)
        if profile is None:
            return None
        hosts = list(self.placed.get(model, ())) or (list(ex.eligible_hosts) if ex is not None else [])
        sha = profile.artifact_sha256.lower() if profile.artifact_sha256 else None
        best: float | None = None
        for host_id in hosts:
            host = self.hosts.get(host_id)
            r = _residency(host, model)
            if r is not None and r.state == "ready":
                continue  # a ready copy starts nothing
            # A cached artifact or a replica already past its load skips the load phase.
            cached = (r is not None and r.state in ("cached", "warming")) or (host is not None and any(
                c.model_id == model and (sha is None or c.sha256.lower() == sha) for c in host.cached))
            s = startup_seconds(profile, self.timings.get((host_id, model)), cached, sha)
            best = s if best is None else min(best, s)
        if best is None:
            best = startup_seconds(profile, None, False, sha)
        return round(best, 3)


def _residency(host: HostView | None, model: str) -> ResidencyView | None:
    if host is None:
        return None
    return next((r for r in host.residencies if r.model_id == model), None)


def _detail_of(short: Sequence[tuple[str, str]], reason: str) -> str:
    return next((d for r, d in short if r == reason), "")
