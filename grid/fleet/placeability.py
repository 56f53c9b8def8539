"""Pure: is a configured model with no ready replica on its way, or can it not be placed at all?

The gateway answers a request with it (grid.gateway.state) and `gridctl status` shows it
(grid.controller.status): one function over the same log facts, so the two always agree. It
lives in the fleet vocabulary because it reads only a recorded plan's shortfalls and reasons,
and the gateway and the controller both need it (neither may import the other, nor the
planner's algorithm).

"Loading" answers 503 with a Retry-After (its cold start); "cannot be placed" answers 503 with
the reason and no Retry-After, because waiting will not help until an operator changes the
profile or the fleet. Two facts decide it, both read from the log, never guessed:

1. the artifact: the profile names no source and no fresh host has the weights cached (by
   sha256, or by model id when the profile has none), so no agent can ever load it;
2. the latest plan's shortfall for the model, when that plan saw the current control stream
   (a profile changed after the plan is judged by the next plan, not by this one) and its
   reason is static: no host passes the model's static checks, or a hard pin cannot be met.
   Dynamic shortfalls (memory held by others now, budgets, staged preemptions) are "loading".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from grid.events.control import ModelProfile
from grid.events.subjects import CONTROL_STREAM
from grid.fleet import reasons as R
from grid.fleet.freshness import HEARTBEAT_TIMEOUT_SECONDS, HeartbeatWindow, heartbeat_fresh
from grid.fleet.planning import Plan
from grid.fleet.views import HostView

ARTIFACT_UNKNOWN = "artifact_unknown"
# Shortfall reasons that no amount of waiting resolves.
STATIC_SHORTFALLS = frozenset({R.NO_ELIGIBLE_HOST, R.PIN_UNSATISFIED})
MAX_DETAIL = 240


@dataclass(frozen=True, slots=True)
class Unplaceable:
    reason: str
    detail: str = ""


def plan_saw_profile(based_on: Mapping[str, int] | None, profile_revision: int) -> bool:
    """Whether a plan that saw the streams up to `based_on` judged the profile's current revision
    (a profile changed after the plan is judged by the next plan, not by this one)."""
    return based_on is not None and based_on.get(CONTROL_STREAM, 0) >= profile_revision


def _has_artifact(snap: HostView, profile: ModelProfile) -> bool:
    sha = profile.artifact_sha256.lower() if profile.artifact_sha256 else None
    for art in snap.cached:
        if (art.sha256.lower() == sha) if sha else (art.model_id == profile.model_id):
            return True
    for r in snap.residencies:
        if r.model_id == profile.model_id and (sha is None or (r.artifact_sha256 or "").lower() == sha):
            return True
    return False


def unplaceable(
    profile: ModelProfile,
    snapshots: Iterable[HostView],
    plan: Plan | None,
    *,
    plan_current: bool,
    now: float,
    heartbeat_timeout_seconds: float = HEARTBEAT_TIMEOUT_SECONDS,
) -> Unplaceable | None:
    """Why `profile` cannot be placed, or None when it may still become ready."""
    window = HeartbeatWindow(heartbeat_timeout_seconds)
    fresh = [s for s in snapshots if heartbeat_fresh(s.heartbeat_at, now, window)]
    # With no fresh host at all nothing is known yet (a grid starting up): not a verdict.
    if fresh and profile.artifact_source is None and not any(_has_artifact(s, profile) for s in fresh):
        what = f"sha256 {profile.artifact_sha256.lower()[:12]}..." if profile.artifact_sha256 else "its weights"
        return Unplaceable(ARTIFACT_UNKNOWN,
                           f"no host has {what} cached and the profile names no artifact source")
    if plan is None or not plan_current:
        return None
    for s in plan.shortfalls:
        if s.model_id == profile.model_id and s.placed == 0 and s.wanted > 0 and s.reason in STATIC_SHORTFALLS:
            detail = s.detail
            for e in plan.explanations:
                if e.model_id == profile.model_id and e.rejected_counts:
                    counts = ", ".join(f"{k} on {n}" for k, n in sorted(e.rejected_counts.items()))
                    detail = f"{detail}; hosts rejected: {counts}" if detail else f"hosts rejected: {counts}"
            return Unplaceable(s.reason, detail[:MAX_DETAIL])
    return None
