"""Placed projection: which managed residencies the controller placed and the host confirmed.

A heartbeat's claim alone attracts no traffic (invariant 4, "route only admitted ready", with
control-envelope corroboration). A managed residency may take requests only when

1. the latest plan (GRID_PLANS, written only by the controller, signed) assigns that model to
   that host as a managed placement, and lists the pair as corroborated: the controller itself
   commanded a warm of that model on that host (GRID_CMDS, which only its fold of this
   projection reads) and the host's confirming ack names that very command. A host can sign an
   ack of its own, for an action id of its choosing, on its own subject; it cannot make the
   controller's plan list it. And
2. that host acknowledged a warm of that model (GRID_HOSTS `ActionAck`, kind "warm") that
   started a child: "succeeded"; "accepted" (the warm passed fencing and ran; its terminal ack
   may never come when the agent lost its state file mid-warm and later adopted the child); or
   "failed" with the agent's `interrupted_by_restart` (the agent restarted mid-warm, and its
   recovery proves and adopts a surviving child before reporting it ready). A later succeeded
   drain or unload, or a warm that failed otherwise, withdraws that confirmation; a rejected or
   cancelled command had no side effect and changes nothing; and
3. its artifact digest is the profile's, when the profile names one (checked by `verdict`).

The fold is pure and order-independent per (host, model): each pair keeps only its
highest-sequence relevant ack (GRID_HOSTS is one stream, so sequences order it), and only the
highest-sequence plan counts. So acks folded out of order (the gateway scans the older part of
the hosts stream for acks beside its live tail) give the same state as an in-order fold.

Bounded: one entry per (host, model) pair, at most MAX_PAIRS (the oldest dropped first), and
the latest plan's managed assignments.

External residencies (`managed=False`) are outside this rule: they enter only by an operator's
admission (grid.projections.routes, whose `admission` applies this rule to managed ones).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import msgspec

from grid.events.acks import ActionAck
from grid.events.base import Event
from grid.events.commands import CommandIssued
from grid.events.plan import PlanCreated
from grid.fleet import CLAIM_STATES, REPLICA_STATES, FreshnessPolicy, heartbeat_fresh
from grid.fleet.views import HostView, ResidencyView
from grid.projections.position import Position
from grid.projections.sharedmap import SharedMap, share_fields

MAX_PAIRS = 65_536
# grid.agent.outcomes.MSG_INTERRUPTED (the receipt of an action a restart interrupted); the
# agent is not imported here (projections stay below it), a test keeps the two equal.
INTERRUPTED_BY_RESTART = "interrupted_by_restart"

# Why a managed claim gets no route (also the `reason` of an unplaced claim).
REASON_NOT_IN_PLAN = "not_in_plan"
REASON_NO_WARM_ACK = "no_warm_ack"
REASON_ARTIFACT_MISMATCH = "artifact_mismatch"
REASON_NOT_CORROBORATED = "not_corroborated"
# Load and warm commands remembered per (host, model): the ack confirming a residency names one.
WARMS_KEPT = 4

_SEP = "\x1f"


def pair_key(host_id: str, model_id: str) -> str:
    return f"{host_id}{_SEP}{model_id}"


class AckRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The latest relevant ack for one (host, model): whether it confirms a started warm."""

    seq: int
    at: float
    confirmed: bool
    kind: str
    status: str
    action_id: str
    message: str = ""
    generation: str = ""
    controller_term: int = 0


class PlacedState(msgspec.Struct, frozen=True, kw_only=True):
    # The latest plan: its GRID_PLANS sequence, generation, and managed assignments
    # (pair_key -> placement status, "existing" or "new").
    plan_seq: int = 0
    plan_generation: str = ""
    plan_readable: bool = True
    assigned: dict[str, str] = {}
    # pair_key -> the latest relevant ack.
    acks: Mapping[str, AckRecord] = {}
    # The latest plan's corroborated pairs (pair keys), as the controller recorded them.
    plan_corroborated: frozenset[str] = frozenset()
    # pair_key -> the last WARMS_KEPT load and warm commands the controller issued there (only a
    # fold that reads GRID_CMDS, the controller's, sees them).
    warms: Mapping[str, tuple[str, ...]] = {}

    # `acks` and `warms` are SharedMaps (as FleetState.hosts): an ack or a command copies one
    # bucket of them, not every pair (thousands in a 10,000-host wave), and the state it replaces
    # stays as it was (a tick may hold it). Sorted when iterated; encoded as plain dicts; given
    # dicts (decoded from a snapshot, or built by hand), they are converted here.
    def __post_init__(self) -> None:
        share_fields(self, "acks", "warms")


def initial() -> PlacedState:
    return PlacedState()


class _Placement(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    model_id: str
    host_id: str
    status: str = "new"
    managed: bool = True


class _Placements(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """Only the placements of a grid.fleet.planning.Plan (the rest is skipped, not built)."""

    placements: tuple[_Placement, ...] = ()


_placements = msgspec.json.Decoder(_Placements | None)


def _assignments(raw: bytes) -> dict[str, str] | None:
    try:
        plan = _placements.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if plan is None:
        return {}
    managed = sorted((p for p in plan.placements if p.managed), key=lambda p: (p.host_id, p.model_id))
    return {pair_key(p.host_id, p.model_id): p.status for p in managed}


def _confirms(event: ActionAck) -> bool | None:
    """True: the ack confirms a started warm; False: it withdraws one; None: no effect."""
    if event.kind == "warm":
        if event.status in ("accepted", "succeeded"):
            return True
        if event.status == "failed":
            reason = event.message.partition(":")[0].strip()
            return reason == INTERRUPTED_BY_RESTART
        return None  # rejected or cancelled: no side effect happened
    if event.kind in ("drain", "unload"):
        return False if event.status == "succeeded" else None
    return None


def apply(state: PlacedState, event: Event, position: Position) -> PlacedState:
    match event:
        case PlanCreated():
            if position.seq <= state.plan_seq:
                return state
            assigned = _assignments(bytes(event.plan))
            return msgspec.structs.replace(
                state, plan_seq=position.seq, plan_generation=event.generation,
                plan_readable=assigned is not None, assigned=assigned or {},
                plan_corroborated=frozenset(pair_key(h, m) for h, m in event.corroborated),
            )
        case CommandIssued(kind="load" | "warm"):
            key = pair_key(event.host_id, event.model_id)
            kept = state.warms.get(key, ())
            if event.action_id in kept:
                return state
            warms = cast(SharedMap[tuple[str, ...]], state.warms).set(key, (*kept, event.action_id)[-WARMS_KEPT:])
            if len(warms) > MAX_PAIRS:
                warms = warms.without(min(warms))  # a bound, not a policy
            return msgspec.structs.replace(state, warms=warms)
        case ActionAck():
            if not event.model_id:
                return state
            confirmed = _confirms(event)
            if confirmed is None:
                return state
            key = pair_key(event.host_id, event.model_id)
            old = state.acks.get(key)
            if old is not None and old.seq >= position.seq:
                return state  # folded out of order: the later ack already decided
            acks = cast(SharedMap[AckRecord], state.acks).set(key, AckRecord(
                seq=position.seq, at=position.time, confirmed=confirmed, kind=event.kind, status=event.status,
                action_id=event.action_id, message=event.message, generation=event.generation,
                controller_term=event.controller_term,
            ))
            if len(acks) > MAX_PAIRS:
                # Withdrawn confirmations first, then the oldest: a bound, not a policy.
                drop = min(acks.items(), key=lambda kv: (kv[1].confirmed, kv[1].seq))[0]
                acks = acks.without(drop)
            return msgspec.structs.replace(state, acks=acks)
    return state


# --- the rule ------------------------------------------------------------------------------------


def _sha(value: str | None) -> str | None:
    return value.lower() if value else None


def verdict(state: PlacedState, host_id: str, residency: ResidencyView, profile_sha: str | None) -> str | None:
    """Why this residency's claim is not corroborated (None: it is, or it needs no corroboration).

    `profile_sha` is the model profile's artifact digest (None when the profile names none or
    there is no profile).
    """
    if not residency.managed:
        return None
    key = pair_key(host_id, residency.model_id)
    if key not in state.assigned:
        return REASON_NOT_IN_PLAN
    ack = state.acks.get(key)
    if ack is None or not ack.confirmed:
        return REASON_NO_WARM_ACK
    if key not in state.plan_corroborated:
        return REASON_NOT_CORROBORATED
    want = _sha(profile_sha)
    if want is not None and _sha(residency.artifact_sha256) != want:
        return REASON_ARTIFACT_MISMATCH
    return None


def commanded(state: PlacedState, host_id: str, model_id: str) -> bool:
    """Did the controller ever command a load or warm of `model_id` on `host_id`?"""
    return pair_key(host_id, model_id) in state.warms


def without_uncommanded(snapshot: HostView, state: PlacedState) -> HostView:
    """The host as the planner may count it: a managed replica the controller never commanded
    there is a claim, not supply. Its memory still counts as used (the host says it is), as
    memory Grid does not manage."""
    keep, claimed_mb = [], 0
    for r in snapshot.residencies:
        if r.managed and r.state in REPLICA_STATES and not commanded(state, snapshot.host_id, r.model_id):
            claimed_mb += r.memory_mb
        else:
            keep.append(r)
    if not claimed_mb:
        return snapshot
    return msgspec.structs.replace(snapshot, residencies=tuple(keep),
                                   unmanaged_memory_mb=snapshot.unmanaged_memory_mb + claimed_mb)


def corroborated(state: PlacedState) -> tuple[tuple[str, str], ...]:
    """(host, model) pairs whose confirming ack names a command this fold saw the controller issue.

    Order-independent (acks and commands live on different streams): judged when asked."""
    out = []
    for key, ack in state.acks.items():
        if ack.confirmed and ack.action_id in state.warms.get(key, ()):
            host_id, _, model_id = key.partition(_SEP)
            out.append((host_id, model_id))
    return tuple(sorted(out))


class UnplacedClaim(msgspec.Struct, frozen=True, kw_only=True):
    """A heartbeat's claim of a managed ready/warming residency the rule does not corroborate."""

    host_id: str
    model_id: str
    state: str
    reason: str
    artifact_sha256: str | None = None
    # False: an external engine's claim (grid.projections.routes judges those).
    managed: bool = True


def profile_digests(profiles: Mapping[str, Any]) -> dict[str, str | None]:
    """model id -> the profile's artifact digest (ModelProfile values)."""
    return {m: p.artifact_sha256 for m, p in profiles.items()}


def unplaced_claims(state: PlacedState, snapshots: Iterable[HostView], digests: Mapping[str, str | None],
                    *, now: float | None = None, policy: FreshnessPolicy | None = None) -> list[UnplacedClaim]:
    """Every managed ready or warming claim that is not corroborated, sorted by host and model.

    With `now` and `policy`, only hosts whose heartbeat is fresh claim anything (a host that went
    away is not counted forever; its residencies take no traffic either way).
    """
    out: list[UnplacedClaim] = []
    for snap in snapshots:
        if now is not None and policy is not None and not heartbeat_fresh(snap.heartbeat_at, now, policy):
            continue
        for r in snap.residencies:
            if not r.managed or r.state not in CLAIM_STATES:
                continue
            why = verdict(state, snap.host_id, r, digests.get(r.model_id))
            if why is not None:
                out.append(UnplacedClaim(host_id=snap.host_id, model_id=r.model_id, state=r.state, reason=why,
                                         artifact_sha256=r.artifact_sha256))
    out.sort(key=lambda c: (c.host_id, c.model_id, c.state))
    return out
