"""What draining a host costs: each model whose last ready copy is there and that no other host
can take. `gridctl host drain` prints it the moment the drain is written (from a what-if plan of
the controller's last planner input with the host draining), and `gridctl status` shows it while
the drain lasts (from the plan the controller made with the host draining).

What the evacuation deadline does with such a copy follows safety invariant 5 (seed: "Protect
the last required replica"; "without [a safe peer], Grid reports the shortfall and preserves the
last replica"): it does not take it. The copy keeps serving from the draining host (the gateway
routes to it after every admitting host) until a replacement elsewhere is ready; copies of models
that are ready elsewhere too are drained at the deadline (grid.controller.reconcile).

Pure: functions of a planner input, a plan and a host id; the planner run is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import msgspec

from grid.events.control import ModelProfile
from grid.fleet import ADMITTING_HOST_STATES, heartbeat_fresh
from grid.fleet.planning import Plan, PlannerInput
from grid.fleet.views import ResidencyView

# What the evacuation deadline does with a last copy that has no replacement: nothing (it stays).
AT_DEADLINE_KEPT = "kept_until_replaced"
# Other hosts' refusals named in a risk's detail (the plan's counts cover the rest).
MAX_NAMED_HOSTS = 3
# A what-if for a host the last planner input does not know.
UNKNOWN_HOST = "unknown_host"
NO_PLAN_YET = "no_plan_yet"


class DrainRisk(msgspec.Struct, frozen=True, kw_only=True):
    """A model whose last ready copy is on the draining host, and why no other host can take it."""

    host_id: str
    model_id: str
    # The plan's shortfall reason for the model (e.g. no_eligible_host), and its detail with the
    # first few other hosts' own refusals (e.g. "h2: insufficient_memory (needs 3000 MB, ...)").
    reason: str
    detail: str = ""
    at_deadline: str = AT_DEADLINE_KEPT


def _serves(r: ResidencyView, profile: ModelProfile | None) -> bool:
    sha = (profile.artifact_sha256 or "").lower() if profile is not None else ""
    return r.state == "ready" and (not sha or (r.artifact_sha256 or "").lower() == sha)


def last_copies(pin: PlannerInput, host_id: str) -> tuple[str, ...]:
    """Configured models with a ready managed copy on `host_id` and no ready copy on any other
    fresh host that takes work (the copies a drain of `host_id` could leave with nothing)."""
    profiles = {p.model_id: p for p in pin.profiles}
    here: set[str] = set()
    elsewhere: set[str] = set()
    for h in pin.hosts:
        if h.host_id == host_id:
            here.update(r.model_id for r in h.residencies
                        if r.managed and not r.pinned and r.model_id in profiles
                        and _serves(r, profiles[r.model_id]))
        elif h.state in ADMITTING_HOST_STATES and h.heartbeat_at is not None \
                and heartbeat_fresh(h.heartbeat_at, pin.now, pin.policy):
            elsewhere.update(r.model_id for r in h.residencies if _serves(r, profiles.get(r.model_id)))
    return tuple(sorted(here - elsewhere))


def _replaced(plan: Plan, host_id: str, model_id: str) -> bool:
    """The plan puts `model_id` on another host, or stages room for it there (a preemption)."""
    return any(p.model_id == model_id and p.host_id != host_id for p in plan.placements) or any(
        pre.beneficiary_model == model_id and pre.host_id != host_id for pre in plan.preemptions)


def _why_not(plan: Plan, host_id: str, model_id: str) -> tuple[str, str]:
    shortfall = next((s for s in plan.shortfalls if s.model_id == model_id and s.wanted > s.placed), None)
    expl = next((e for e in plan.explanations if e.model_id == model_id), None)
    named = [f"{v.host_id}: {v.reason}" + (f" ({v.detail})" if v.detail else "")
             for v in (expl.rejected if expl is not None else ()) if v.host_id != host_id][:MAX_NAMED_HOSTS]
    reason = shortfall.reason if shortfall is not None else "no_replacement_planned"
    detail = "; ".join(named) or (shortfall.detail if shortfall is not None else "") or "no other host is eligible"
    return reason, detail


def risks(pin: PlannerInput, plan: Plan, host_id: str) -> tuple[DrainRisk, ...]:
    """The last copies on `host_id` that `plan` (made with the host draining) does not replace."""
    out = []
    for model_id in last_copies(pin, host_id):
        if _replaced(plan, host_id, model_id):
            continue
        reason, detail = _why_not(plan, host_id, model_id)
        out.append(DrainRisk(host_id=host_id, model_id=model_id, reason=reason, detail=detail))
    return tuple(out)


def draining(pin: PlannerInput, host_id: str) -> PlannerInput | None:
    """`pin` with `host_id` draining (None when the input has no such host)."""
    if not any(h.host_id == host_id for h in pin.hosts):
        return None
    hosts = tuple(h if h.host_id != host_id else msgspec.structs.replace(h, state="draining") for h in pin.hosts)
    return msgspec.structs.replace(pin, hosts=hosts)


class DrainCheck(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to "what would draining this host cost?" (GET /allocator/hosts/{host}/drain-check)."""

    host_id: str
    # False when the controller cannot tell (no plan yet, or a host it has not heard of): `reason` says why.
    known: bool
    reason: str = ""
    evacuation_deadline_seconds: float
    risks: tuple[DrainRisk, ...] = ()
    warnings: tuple[str, ...] = ()


def check_drain(pin: PlannerInput | None, host_id: str, deadline_seconds: float,
                plan_fn: Callable[[PlannerInput], Plan]) -> DrainCheck:
    """The what-if: the last planner input with `host_id` draining, planned by `plan_fn`."""
    if pin is None:
        return DrainCheck(host_id=host_id, known=False, reason=NO_PLAN_YET, evacuation_deadline_seconds=deadline_seconds)
    what_if = draining(pin, host_id)
    if what_if is None:
        return DrainCheck(host_id=host_id, known=False, reason=UNKNOWN_HOST, evacuation_deadline_seconds=deadline_seconds)
    found = risks(what_if, plan_fn(what_if), host_id)
    return DrainCheck(host_id=host_id, known=True, evacuation_deadline_seconds=deadline_seconds, risks=found,
                      warnings=tuple(warning(r, deadline_seconds) for r in found))


def warning(risk: DrainRisk, deadline_seconds: float) -> str:
    """One risk in words: which model, why nothing replaces it, and what the deadline does."""
    return (f"draining host {risk.host_id}: {risk.model_id} has its last ready copy there and no other host can "
            f"take it ({risk.reason}: {risk.detail}); the {deadline_seconds:g} s evacuation deadline will not "
            f"unload it (the last replica is kept): it keeps serving from {risk.host_id} until a replacement is "
            f"ready elsewhere. Free room for it elsewhere, or `gridctl host resume {risk.host_id}` to end the drain")


def draining_risks(pin: PlannerInput | None, plan: Plan | None,
                   evacuating: Mapping[str, float] | Iterable[str]) -> tuple[DrainRisk, ...]:
    """The risks of every host draining now, from the plan the controller made with them draining."""
    if pin is None or plan is None:
        return ()
    out: list[DrainRisk] = []
    for host_id in sorted(evacuating):
        out.extend(risks(pin, plan, host_id))
    return tuple(out)
