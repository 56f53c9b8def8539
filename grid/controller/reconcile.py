"""Pure reconciler: (plan, actual fleet, action history, profiles, now) -> lifecycle actions.

Nomad's generic_sched habit: the result is buckets of values (actions to issue, deferrals,
ignored residencies, blocked models, withdrawals), every entry with a reason constant. Nothing
here reads a clock, touches the log or iterates an unordered collection without sorting.

Transitions are deliberately small: load (acquire/verify the artifact), warm (start and probe),
drain (stop routing new work), unload (release memory once drained and idle).

Rules, in the order they are applied:

* Never actuate what Grid does not own: unmanaged and pinned residencies are only evidence
  (safety invariant 7).
* Withdrawn destructive batches whose node may already be running them block further
  destructive work for that model until a terminal ack or a heartbeat newer than the command
  proves the postcondition. No wall-clock timeout.
* Open commands are re-validated: a delivered drain/unload that fresh evidence makes unsafe
  gets its model's whole destructive batch withdrawn; availability work for a retired model or
  an undelivered one that is no longer desired is withdrawn.
* Missing desired replicas get load (unless the exact artifact is cached) then warm. The warm
  waits for its load to succeed (deferred, issued on a later tick so its lease TTL is not spent
  queueing behind a transfer) and is deferred with it when the load is deferred.
* An obsolete ready replica is drained only when every desired replica of that model reports
  ready (make-before-break, invariants 3 and 5), the model has no shortfall to protect (the last
  replica is kept), minimum residency and the scale-down cooldown have elapsed. The deliberate
  exception is an explicit staged preemption from the plan: the victim drains first.
* A draining residency is unloaded only when it reports zero requests in flight (invariant 6).
* Observation-time fencing: a heartbeat not newer than a successful ack of the same kind for the
  same host/model cannot trigger a duplicate.
* Slots: availability and preemption work first (by priority, evidence, replica round,
  estimated cold start), routine destructive work after; global and per-host mutation limits,
  exact-artifact fanout and per (kind, host, model) exponential failure backoff (invariant 8).
* Stable ids: sha256(kind|host|model|artifact sha|basis) where basis is the log sequence of the
  last finished or withdrawn command for the same intent, so a retried tick reproduces the same
  id (Nats-Msg-Id dedupes it) while a genuinely new lifecycle gets a new one (invariant 9).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from grid.events.commands import DESTRUCTIVE_KINDS
from grid.events.control import ModelProfile
from grid.planner.types import EVIDENCE_ORDER, HostSnapshot, Placement, Plan, Preemption, ResidencyView
from grid.projections.actions import ActionRecord, ActionsState
from grid.controller.governor import Governor, Limits, artifact_key, backoff_index

# --- action reasons ---------------------------------------------------------------------------
LOAD_FOR_PLACEMENT = "load_for_placement"
PREFETCH_FOR_PREEMPTION = "prefetch_for_preemption"
WARM_FOR_PLACEMENT = "warm_for_placement"
DRAIN_OBSOLETE = "drain_obsolete"
DRAIN_SCALE_DOWN = "drain_scale_down"
DRAIN_RETIRED = "drain_retired"
DRAIN_UNCONFIGURED = "drain_unconfigured"
DRAIN_PREEMPTION = "drain_preemption"
DRAIN_FAILED = "drain_failed_residency"
UNLOAD_DRAINED = "unload_drained"

# --- deferral reasons -------------------------------------------------------------------------
OBSERVE_ONLY = "observe_only"
IN_FLIGHT = "pending_equivalent"
HOST_UNKNOWN = "host_unknown"
HOST_STALE = "host_stale"
HOST_NOT_ACCEPTING = "host_not_accepting"
NO_CAPABILITY = "actuator_capability_missing"
RESTART_GRACE = "restart_grace"
DESTRUCTIVE_BLOCKED = "destructive_blocked_by_withdrawal"
AWAITING_OBSERVATION = "awaiting_fresh_observation"
BACKOFF = "failure_backoff"
DEPENDENCY_DEFERRED = "dependency_deferred"
AWAITING_DEPENDENCY = "awaiting_dependency"
MIN_RESIDENCY = "min_residency"
SCALE_DOWN_COOLDOWN = "scale_down_cooldown"
AWAITING_REPLACEMENT = "awaiting_ready_replacement"
LAST_REPLICA = "protect_last_replica"
REQUESTS_IN_FLIGHT = "requests_in_flight"
TRANSITION_IN_PROGRESS = "transition_in_progress"
INSUFFICIENT_MEMORY = "insufficient_free_memory"
ARTIFACT_MISMATCH = "artifact_mismatch"
UNKNOWN_PROFILE = "unknown_profile"
# GLOBAL_LIMIT / HOST_LIMIT / ARTIFACT_FANOUT come from the governor.

# --- ignored (never actuated) -----------------------------------------------------------------
IGNORED_UNMANAGED = "unmanaged_residency"
IGNORED_PINNED = "pinned_residency"

# --- withdrawal reasons -----------------------------------------------------------------------
WITHDRAW_UNSAFE_DESTRUCTIVE = "destructive_batch_unsafe"
WITHDRAW_RETIRED = "model_retired"
WITHDRAW_NOT_DESIRED = "no_longer_desired"
WITHDRAW_ARTIFACT_CHANGED = "artifact_changed"
WITHDRAW_MODE = "left_automatic_mode"

# --- blocked ----------------------------------------------------------------------------------
BLOCKED_WITHDRAWN_DESTRUCTIVE = "withdrawn_destructive_unconfirmed"

SERVING_STATES = frozenset({"warming", "ready", "draining", "unloading", "failed"})
ROUTABLE_HOST_STATES = frozenset({"accepting", "throttled"})
_STATE_RANK = {"ready": 7, "warming": 6, "loading": 5, "draining": 4, "unloading": 3, "failed": 2, "cached": 1}


class Guards(msgspec.Struct, frozen=True, kw_only=True):
    """Service-held facts the pure reconciler cannot derive from the log."""

    # Restart grace: no destructive action before this time...
    destructive_not_before: float = 0.0
    # ...and none on a host whose latest heartbeat was not received after this time.
    fresh_after: float | None = None
    # Withdrawn destructive commands whose postcondition a heartbeat already proved.
    cleared_withdrawals: frozenset[str] = frozenset()


class Action(msgspec.Struct, frozen=True, kw_only=True):
    action_id: str
    kind: str
    host_id: str
    model_id: str
    memory_mb: int
    reason: str
    runtime: str = "llama.cpp"
    artifact_sha256: str | None = None
    artifact_source: str | None = None
    artifact_size_mb: int | None = None
    context_size: int = 2048
    slots: int = 1
    dependencies: tuple[str, ...] = ()
    priority: int = 0
    destructive: bool = False
    # A drain/unload staged by the plan for a higher-priority beneficiary.
    preemption_for: str | None = None
    detail: str = ""


class Deferral(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    host_id: str
    model_id: str
    reason: str
    action_id: str = ""
    detail: str = ""
    not_before: float | None = None


class Ignored(msgspec.Struct, frozen=True, kw_only=True):
    host_id: str
    model_id: str
    reason: str
    state: str = ""


class BlockedModel(msgspec.Struct, frozen=True, kw_only=True):
    model_id: str
    reason: str
    action_ids: tuple[str, ...]


class Withdrawal(msgspec.Struct, frozen=True, kw_only=True):
    action_id: str
    host_id: str
    model_id: str
    kind: str
    reason: str
    # True when the node may already have it (it acknowledged acceptance).
    delivered: bool = False


class ReconcileResult(msgspec.Struct, frozen=True, kw_only=True):
    mode: str
    now: float
    actions: tuple[Action, ...] = ()
    deferred: tuple[Deferral, ...] = ()
    ignored: tuple[Ignored, ...] = ()
    blocked: tuple[BlockedModel, ...] = ()
    withdrawals: tuple[Withdrawal, ...] = ()
    # Withdrawn destructive commands whose postcondition is now proven (the service remembers).
    cleared_withdrawals: tuple[str, ...] = ()
    # Open (issued, not terminal) action ids that still count as in flight.
    in_flight: tuple[str, ...] = ()
    satisfied: int = 0

    @property
    def converged(self) -> bool:
        return not self.actions and not self.deferred and not self.in_flight and not self.withdrawals


def action_id(kind: str, host_id: str, model_id: str, artifact_sha256: str | None, basis: int) -> str:
    """Same intent, same id. `basis` distinguishes a genuinely new lifecycle of that intent."""
    raw = f"{kind}|{host_id}|{model_id}|{artifact_sha256 or ''}|{basis}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


# --- helpers ----------------------------------------------------------------------------------


class _HostModel:
    __slots__ = ("managed", "foreign")

    def __init__(self) -> None:
        self.managed: ResidencyView | None = None
        self.foreign: ResidencyView | None = None


def _index_residencies(host: HostSnapshot) -> dict[str, _HostModel]:
    out: dict[str, _HostModel] = {}
    for r in host.residencies:
        hm = out.get(r.model_id)
        if hm is None:
            hm = out[r.model_id] = _HostModel()
        if r.managed and not r.pinned:
            if hm.managed is None or _STATE_RANK.get(r.state, 0) > _STATE_RANK.get(hm.managed.state, 0):
                hm.managed = r
        else:
            if hm.foreign is None or _STATE_RANK.get(r.state, 0) > _STATE_RANK.get(hm.foreign.state, 0):
                hm.foreign = r
    return out


def _fresh(host: HostSnapshot | None, now: float, limits: Limits) -> bool:
    if host is None or host.heartbeat_at is None:
        return False
    if host.heartbeat_at > now + limits.future_skew_seconds:
        return False
    return now - host.heartbeat_at <= limits.heartbeat_timeout_seconds


def _sha_ok(r: ResidencyView, profile: ModelProfile | None) -> bool:
    want = profile.artifact_sha256 if profile is not None else None
    return want is None or (r.artifact_sha256 or "").lower() == want.lower()


def _cached(host: HostSnapshot, model_id: str, profile: ModelProfile, hm: _HostModel | None) -> bool:
    want = profile.artifact_sha256
    for c in host.cached:
        if c.model_id == model_id and (want is None or c.sha256.lower() == want.lower()):
            return True
    r = hm.managed if hm is not None else None
    return r is not None and r.state == "cached" and _sha_ok(r, profile)


def _memory_for(profile: ModelProfile, runtime: str) -> int:
    return int(profile.runtime_memory_mb.get(runtime, profile.memory_mb))


def _free_memory(host: HostSnapshot) -> int:
    used = sum(r.memory_mb for r in host.residencies if r.state in SERVING_STATES)
    res = host.resources
    return int(res.capacity_mb - res.reserved_mb - host.unmanaged_memory_mb - used)


def _postcondition(kind: str, hm: _HostModel | None) -> bool:
    """A destructive action's durable postcondition as a heartbeat shows it."""
    state = hm.managed.state if hm is not None and hm.managed is not None else None
    if kind == "drain":
        return state in (None, "draining", "unloading", "cached")
    return state in (None, "cached")


class _Candidate:
    __slots__ = ("sort_key", "steps")

    def __init__(self, sort_key: tuple, steps: list[tuple[Action, list[str]]]) -> None:
        self.sort_key = sort_key
        # Each step: an action (id precomputed) and deferral reasons found before slotting.
        self.steps = steps


# --- the reconciler ---------------------------------------------------------------------------


def reconcile(
    plan: Plan,
    hosts: Sequence[HostSnapshot],
    history: ActionsState,
    profiles: Mapping[str, ModelProfile],
    now: float,
    *,
    retired: Iterable[str] = (),
    mode: str = "recommend",
    limits: Limits = Limits(),
    guards: Guards = Guards(),
) -> ReconcileResult:
    retired_set = frozenset(retired) - frozenset(profiles)
    hosts_by_id = {h.host_id: h for h in hosts}
    fresh = {h.host_id: _fresh(h, now, limits) for h in hosts}
    residencies = {h.host_id: _index_residencies(h) for h in hosts}

    desired: dict[tuple[str, str], Placement] = {}
    desired_by_model: dict[str, list[Placement]] = {}
    for p in sorted(plan.placements, key=lambda p: (p.model_id, p.host_id)):
        if (p.host_id, p.model_id) in desired:
            continue
        desired[(p.host_id, p.model_id)] = p
        desired_by_model.setdefault(p.model_id, []).append(p)
    victims: dict[tuple[str, str], Preemption] = {}
    beneficiaries: dict[tuple[str, str], Preemption] = {}
    for pre in sorted(plan.preemptions, key=lambda x: (x.host_id, x.victim_model, x.beneficiary_model)):
        victims.setdefault((pre.host_id, pre.victim_model), pre)
        beneficiaries.setdefault((pre.host_id, pre.beneficiary_model), pre)
    shortfall_models = frozenset(s.model_id for s in plan.shortfalls if s.wanted > s.placed)
    evidence_rank = {e.model_id: EVIDENCE_ORDER.get(e.evidence, 1) for e in plan.explanations}
    # Eligible hosts per model when the explanation lists them completely (it may be bounded).
    explained_hosts = {
        e.model_id: frozenset(e.eligible_hosts)
        for e in plan.explanations
        if getattr(e, "eligible_count", 0) <= len(e.eligible_hosts)
    }

    def hm_of(host_id: str, model_id: str) -> _HostModel | None:
        return residencies.get(host_id, {}).get(model_id)

    def ready_at(host_id: str, model_id: str) -> bool:
        host = hosts_by_id.get(host_id)
        if host is None or not fresh[host_id] or host.state not in ROUTABLE_HOST_STATES:
            return False
        hm = hm_of(host_id, model_id)
        if hm is None:
            return False
        profile = profiles.get(model_id)
        return any(r is not None and r.state == "ready" and _sha_ok(r, profile) for r in (hm.managed, hm.foreign))

    all_desired_ready: dict[str, bool] = {
        m: all(ready_at(p.host_id, m) for p in ps) for m, ps in desired_by_model.items()
    }

    # --- index the action history once -------------------------------------------------------
    records = sorted(history.actions.values(), key=lambda r: r.issued_seq)
    open_records = [r for r in records if r.terminal_at is None]
    basis: dict[tuple[str, str, str, str], int] = {}
    last_success: dict[tuple[str, str, str], float] = {}
    open_by_intent: dict[tuple[str, str, str], ActionRecord] = {}
    for r in records:
        cmd = r.command
        if r.terminal_at is not None or r.withdrawn:
            key4 = (cmd.kind, cmd.host_id, cmd.model_id, (cmd.artifact_sha256 or "").lower())
            basis[key4] = max(basis.get(key4, 0), r.issued_seq)
        if r.terminal_at is not None and r.status == "succeeded":
            key3 = (cmd.kind, cmd.host_id, cmd.model_id)
            last_success[key3] = max(last_success.get(key3, 0.0), r.terminal_at)
        if r.terminal_at is None and not r.withdrawn:
            open_by_intent.setdefault((cmd.kind, cmd.host_id, cmd.model_id), r)
    backoffs = backoff_index(limits, records)

    deferred: list[Deferral] = []
    ignored: list[Ignored] = []
    withdrawals: list[Withdrawal] = []
    withdrawn_now: set[str] = set()

    # --- 1. the withdrawn-destructive guard --------------------------------------------------
    blocked: dict[str, list[str]] = {}
    cleared: list[str] = []
    for r in open_records:
        cmd = r.command
        if not r.withdrawn or cmd.kind not in DESTRUCTIVE_KINDS:
            continue
        if cmd.action_id in guards.cleared_withdrawals:
            continue
        host = hosts_by_id.get(cmd.host_id)
        if (
            host is not None
            and host.heartbeat_at is not None
            and host.heartbeat_at > r.issued_at
            and _postcondition(cmd.kind, hm_of(cmd.host_id, cmd.model_id))
        ):
            cleared.append(cmd.action_id)
            continue
        blocked.setdefault(cmd.model_id, []).append(cmd.action_id)

    # --- 2. re-validate open commands ----------------------------------------------------------
    def destructive_unsafe(r: ActionRecord) -> bool:
        cmd = r.command
        host = hosts_by_id.get(cmd.host_id)
        hm = hm_of(cmd.host_id, cmd.model_id)
        observed_after = host is not None and host.heartbeat_at is not None and host.heartbeat_at > r.issued_at
        if observed_after and _postcondition(cmd.kind, hm):
            return False  # already done: nothing left to make unsafe
        m = cmd.model_id
        if cmd.kind == "drain":
            if (cmd.host_id, m) in desired:
                return True
            if (cmd.host_id, m) in victims or m in retired_set or m not in profiles:
                return False
            if hm is not None and hm.managed is not None and hm.managed.state == "failed":
                return False
            if m in shortfall_models:
                return True
            return not all_desired_ready.get(m, True)
        # unload
        state = hm.managed if hm is not None else None
        if state is None:
            return False
        if observed_after and state.state in ("ready", "warming", "loading"):
            return True
        return state.state == "draining" and state.active_requests > 0

    destructive_open: dict[str, list[ActionRecord]] = {}
    for r in open_records:
        if not r.withdrawn and r.command.kind in DESTRUCTIVE_KINDS:
            destructive_open.setdefault(r.command.model_id, []).append(r)
    for m in sorted(destructive_open):
        batch = destructive_open[m]
        if any(destructive_unsafe(r) for r in batch):
            for r in batch:
                cmd = r.command
                withdrawals.append(Withdrawal(
                    action_id=cmd.action_id, host_id=cmd.host_id, model_id=m, kind=cmd.kind,
                    reason=WITHDRAW_UNSAFE_DESTRUCTIVE, delivered=r.status == "accepted",
                ))
                withdrawn_now.add(cmd.action_id)
                blocked.setdefault(m, []).append(cmd.action_id)

    for r in open_records:
        cmd = r.command
        if r.withdrawn or cmd.kind in DESTRUCTIVE_KINDS:
            continue
        profile = profiles.get(cmd.model_id)
        reason = None
        if cmd.model_id in retired_set or profile is None:
            reason = WITHDRAW_RETIRED
        elif r.status == "pending":
            want_sha = (profile.artifact_sha256 or "").lower()
            if (cmd.artifact_sha256 or "").lower() != want_sha:
                reason = WITHDRAW_ARTIFACT_CHANGED
            elif (cmd.host_id, cmd.model_id) not in desired and not (
                cmd.kind == "load" and (cmd.host_id, cmd.model_id) in beneficiaries
            ):
                reason = WITHDRAW_NOT_DESIRED
        if reason is not None:
            withdrawals.append(Withdrawal(
                action_id=cmd.action_id, host_id=cmd.host_id, model_id=cmd.model_id, kind=cmd.kind,
                reason=reason, delivered=r.status == "accepted",
            ))
            withdrawn_now.add(cmd.action_id)

    # --- 3. the governor: open commands hold their slots --------------------------------------
    gov = Governor(limits)
    in_flight: list[str] = []
    for r in open_records:
        cmd = r.command
        still_open = not r.withdrawn and cmd.action_id not in withdrawn_now
        if still_open:
            in_flight.append(cmd.action_id)
        if still_open or r.status == "accepted":
            gov.charge_open(
                cmd.host_id, cmd.kind, artifact_key(cmd.model_id, cmd.artifact_sha256),
                counts_globally=fresh.get(cmd.host_id, False),
            )
    open_intents = {k: r for k, r in open_by_intent.items() if r.command.action_id not in withdrawn_now}

    def new_id(kind: str, host_id: str, model_id: str, sha: str | None) -> str:
        return action_id(kind, host_id, model_id, sha, basis.get((kind, host_id, model_id, (sha or "").lower()), 0))

    def common_checks(kind: str, host_id: str, model_id: str) -> list[str]:
        """Reasons that hold for any action of `kind` on this host/model right now."""
        reasons: list[str] = []
        host = hosts_by_id.get(host_id)
        if host is None:
            return [HOST_UNKNOWN]
        if not fresh[host_id]:
            return [HOST_STALE]
        destructive = kind in DESTRUCTIVE_KINDS
        if not destructive and host.state not in ROUTABLE_HOST_STATES:
            reasons.append(HOST_NOT_ACCEPTING)
        if kind not in host.actuator_capabilities:
            reasons.append(NO_CAPABILITY)
        if destructive:
            if now < guards.destructive_not_before or (
                guards.fresh_after is not None and (host.heartbeat_at or 0.0) <= guards.fresh_after
            ):
                reasons.append(RESTART_GRACE)
            if model_id in blocked:
                reasons.append(DESTRUCTIVE_BLOCKED)
        success_at = last_success.get((kind, host_id, model_id))
        if success_at is not None and (host.heartbeat_at or 0.0) <= success_at:
            reasons.append(AWAITING_OBSERVATION)
        bo = backoffs.get((kind, host_id, model_id))
        if bo is not None and now < bo.not_before:
            reasons.append(BACKOFF)
        return reasons

    def make_action(kind: str, host_id: str, model_id: str, profile: ModelProfile | None, memory_mb: int,
                    reason: str, runtime: str, *, deps: tuple[str, ...] = (), preemption_for: str | None = None,
                    priority: int = 0, detail: str = "") -> Action:
        sha = profile.artifact_sha256.lower() if profile is not None and profile.artifact_sha256 else None
        return Action(
            action_id=new_id(kind, host_id, model_id, sha), kind=kind, host_id=host_id, model_id=model_id,
            memory_mb=memory_mb, reason=reason, runtime=runtime, artifact_sha256=sha,
            artifact_source=profile.artifact_source if profile is not None else None,
            artifact_size_mb=profile.artifact_size_mb if profile is not None else None,
            context_size=profile.context_size if profile is not None else 2048,
            slots=profile.replica_concurrency if profile is not None else 1,
            dependencies=deps, priority=priority, destructive=kind in DESTRUCTIVE_KINDS,
            preemption_for=preemption_for, detail=detail,
        )

    candidates: list[_Candidate] = []
    satisfied = 0

    # --- 4. availability: missing desired replicas --------------------------------------------
    round_of: dict[str, int] = {}
    for (host_id, model_id), p in sorted(desired.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        profile = profiles.get(model_id)
        hm = hm_of(host_id, model_id)
        if not getattr(p, "managed", True):
            # An external residency the planner counted: evidence only, never actuated.
            if hm is not None and hm.foreign is not None and hm.foreign.state == "ready":
                satisfied += 1
            continue
        if profile is None:
            deferred.append(Deferral(kind="warm", host_id=host_id, model_id=model_id, reason=UNKNOWN_PROFILE))
            continue
        host = hosts_by_id.get(host_id)
        if hm is not None and hm.foreign is not None:
            if hm.foreign.state == "ready" and _sha_ok(hm.foreign, profile):
                satisfied += 1
            else:
                ignored.append(Ignored(
                    host_id=host_id, model_id=model_id, state=hm.foreign.state,
                    reason=IGNORED_PINNED if hm.foreign.pinned else IGNORED_UNMANAGED,
                ))
            continue
        r = hm.managed if hm is not None else None
        state = r.state if r is not None else None
        if state == "ready":
            if _sha_ok(r, profile):  # type: ignore[arg-type]
                satisfied += 1
            else:
                deferred.append(Deferral(kind="warm", host_id=host_id, model_id=model_id, reason=ARTIFACT_MISMATCH,
                                         detail=f"resident {r.artifact_sha256} != profile {profile.artifact_sha256}"))  # type: ignore[union-attr]
            continue
        if state in ("loading", "warming", "unloading", "draining"):
            # A draining desired copy is unloaded below (it is not serving) and warmed again later.
            if state != "draining":
                deferred.append(Deferral(kind="warm", host_id=host_id, model_id=model_id,
                                         reason=TRANSITION_IN_PROGRESS, detail=state))
            continue
        # absent, cached or failed: (load) + warm
        runtime = p.runtime or "llama.cpp"
        memory = p.memory_mb or _memory_for(profile, runtime)
        steps: list[tuple[Action, list[str]]] = []
        load_dep: tuple[str, ...] = ()
        load_success = last_success.get(("load", host_id, model_id))
        cached = host is not None and (
            _cached(host, model_id, profile, hm)
            or (load_success is not None and (host.heartbeat_at or 0.0) <= load_success)
        )
        open_warm = open_intents.get(("warm", host_id, model_id))
        if open_warm is not None:
            deferred.append(Deferral(kind="warm", host_id=host_id, model_id=model_id, reason=IN_FLIGHT,
                                     action_id=open_warm.command.action_id))
            continue
        warm_reasons = common_checks("warm", host_id, model_id)
        if not cached:
            # The warm waits for its load to finish (it is issued on a later tick, so its lease
            # TTL is not spent queueing behind a long transfer); a deferred load defers it.
            open_load = open_intents.get(("load", host_id, model_id))
            if open_load is not None:
                load_dep = (open_load.command.action_id,)
                warm_reasons.insert(0, AWAITING_DEPENDENCY)
            else:
                load = make_action("load", host_id, model_id, profile, memory, LOAD_FOR_PLACEMENT, runtime,
                                   priority=profile.priority)
                steps.append((load, common_checks("load", host_id, model_id)))
                load_dep = (load.action_id,)
        warm = make_action("warm", host_id, model_id, profile, memory, WARM_FOR_PLACEMENT, runtime,
                           deps=load_dep, priority=profile.priority)
        steps.append((warm, warm_reasons))
        rnd = round_of.get(model_id, 0)
        round_of[model_id] = rnd + 1
        est = (0.0 if cached else profile.load_seconds) + profile.warm_seconds
        key = (0, -profile.priority, evidence_rank.get(model_id, 1), rnd, est, model_id, host_id)
        candidates.append(_Candidate(key, steps))

    # Prefetch the beneficiary's exact artifact before its victim drains (disk only, never warm).
    for (host_id, model_id), pre in sorted(beneficiaries.items()):
        profile = profiles.get(model_id)
        host = hosts_by_id.get(host_id)
        if profile is None or host is None or not profile.artifact_source or not profile.artifact_sha256:
            continue
        if (host_id, model_id) in desired or _cached(host, model_id, profile, hm_of(host_id, model_id)):
            continue
        if open_intents.get(("load", host_id, model_id)) is not None:
            continue
        load = make_action("load", host_id, model_id, profile, _memory_for(profile, "llama.cpp"),
                           PREFETCH_FOR_PREEMPTION, "llama.cpp", priority=profile.priority,
                           detail=f"victim {pre.victim_model}")
        key = (0, -profile.priority, evidence_rank.get(model_id, 1), 0, profile.load_seconds, model_id, host_id)
        candidates.append(_Candidate(key, [(load, common_checks("load", host_id, model_id))]))

    # --- 5. destructive: obsolete and draining managed residencies ----------------------------
    for host in sorted(hosts, key=lambda h: h.host_id):
        host_id = host.host_id
        for model_id in sorted(residencies[host_id]):
            hm = residencies[host_id][model_id]
            if hm.foreign is not None and (host_id, model_id) not in desired:
                ignored.append(Ignored(
                    host_id=host_id, model_id=model_id, state=hm.foreign.state,
                    reason=IGNORED_PINNED if hm.foreign.pinned else IGNORED_UNMANAGED,
                ))
            r = hm.managed
            if r is None or hm.foreign is not None and (host_id, model_id) in desired:
                continue
            profile = profiles.get(model_id)
            is_desired = (host_id, model_id) in desired
            pre = victims.get((host_id, model_id))
            if r.state == "draining":
                open_unload = open_intents.get(("unload", host_id, model_id))
                if open_unload is not None:
                    deferred.append(Deferral(kind="unload", host_id=host_id, model_id=model_id, reason=IN_FLIGHT,
                                             action_id=open_unload.command.action_id))
                    continue
                act = make_action("unload", host_id, model_id, profile, r.memory_mb, UNLOAD_DRAINED, r.runtime,
                                  preemption_for=pre.beneficiary_model if pre else None,
                                  priority=_priority(profiles, pre, profile))
                reasons = common_checks("unload", host_id, model_id)
                if r.active_requests > 0:
                    reasons.append(REQUESTS_IN_FLIGHT)
                candidates.append(_Candidate(_destructive_key(act, pre, profiles, profile), [(act, reasons)]))
                continue
            if is_desired or r.state in ("cached",):
                continue
            if r.state in ("loading", "warming", "unloading"):
                deferred.append(Deferral(kind="drain", host_id=host_id, model_id=model_id,
                                         reason=TRANSITION_IN_PROGRESS, detail=r.state))
                continue
            # ready or failed, and not desired here: drain.
            open_drain = open_intents.get(("drain", host_id, model_id))
            if open_drain is not None:
                deferred.append(Deferral(kind="drain", host_id=host_id, model_id=model_id, reason=IN_FLIGHT,
                                         action_id=open_drain.command.action_id))
                continue
            retiring = model_id in retired_set
            reasons = common_checks("drain", host_id, model_id)
            if r.state == "failed":
                reason = DRAIN_FAILED
            elif pre is not None:
                reason = DRAIN_PREEMPTION
            elif retiring:
                reason = DRAIN_RETIRED
            elif profile is None:
                reason = DRAIN_UNCONFIGURED
            else:
                # Scale-down: the planner could have kept this copy (the host is still eligible)
                # but wants fewer. Otherwise it is a relocation away from an unfit host.
                expl = explained_hosts.get(model_id)
                still_eligible = host_id in expl if expl is not None else host.state in ROUTABLE_HOST_STATES
                reason = DRAIN_SCALE_DOWN if still_eligible else DRAIN_OBSOLETE
            if r.state == "ready" and pre is None and not retiring and profile is not None:
                if model_id in shortfall_models:
                    reasons.append(LAST_REPLICA)
                elif not all_desired_ready.get(model_id, True):
                    reasons.append(AWAITING_REPLACEMENT)
                if reason == DRAIN_SCALE_DOWN and r.last_used_at is not None and (
                    now - r.last_used_at < profile.scale_down_cooldown_seconds
                ):
                    reasons.append(SCALE_DOWN_COOLDOWN)
            if r.state == "ready" and not retiring and profile is not None and r.loaded_at is not None and (
                now - r.loaded_at < profile.min_residency_seconds
            ):
                reasons.append(MIN_RESIDENCY)
            elif pre is not None and getattr(pre, "not_before", None) is not None and now < pre.not_before:  # type: ignore[operator]
                reasons.append(MIN_RESIDENCY)
            act = make_action("drain", host_id, model_id, profile, r.memory_mb, reason, r.runtime,
                              preemption_for=pre.beneficiary_model if pre else None,
                              priority=_priority(profiles, pre, profile))
            candidates.append(_Candidate(_destructive_key(act, pre, profiles, profile), [(act, reasons)]))

    # --- 6. slot the candidates in service order ----------------------------------------------
    # Memory a warm may still claim on each host: free memory in the latest heartbeat minus
    # warms already in flight (and those admitted below). Defence in depth for invariant 1.
    free_mb: dict[str, int] = {}
    for host in hosts:
        free_mb[host.host_id] = _free_memory(host)
    for (k, h, _m), o in open_intents.items():
        if k == "warm" and h in free_mb:
            free_mb[h] -= o.command.memory_mb
    actions: list[Action] = []
    for cand in sorted(candidates, key=lambda c: c.sort_key):
        chain_deferred = False
        for i, (act, reasons) in enumerate(cand.steps):
            if chain_deferred:
                deferred.append(_defer(act, DEPENDENCY_DEFERRED))
                continue
            if i > 0:
                deferred.append(_defer(act, AWAITING_DEPENDENCY))
                continue
            if reasons:
                deferred.append(_defer(act, reasons[0], _not_before(act, reasons[0], backoffs)))
                chain_deferred = True
                continue
            if act.kind == "warm" and free_mb.get(act.host_id, 0) < act.memory_mb:
                deferred.append(_defer(act, INSUFFICIENT_MEMORY))
                chain_deferred = True
                continue
            akey = artifact_key(act.model_id, act.artifact_sha256)
            refusal = gov.refusal(act.host_id, act.kind, akey)
            if refusal is not None:
                deferred.append(_defer(act, refusal))
                chain_deferred = True
                continue
            gov.admit(act.host_id, act.kind, akey)
            if act.kind == "warm":
                free_mb[act.host_id] = free_mb.get(act.host_id, 0) - act.memory_mb
            actions.append(act)

    if mode == "observe":
        deferred = [_defer(a, OBSERVE_ONLY) for a in actions] + deferred
        actions = []

    return ReconcileResult(
        mode=mode,
        now=now,
        actions=tuple(actions),
        deferred=tuple(deferred),
        ignored=tuple(ignored),
        blocked=tuple(
            BlockedModel(model_id=m, reason=BLOCKED_WITHDRAWN_DESTRUCTIVE, action_ids=tuple(sorted(set(ids))))
            for m, ids in sorted(blocked.items())
        ),
        withdrawals=tuple(withdrawals),
        cleared_withdrawals=tuple(sorted(cleared)),
        in_flight=tuple(in_flight),
        satisfied=satisfied,
    )


def _priority(profiles: Mapping[str, ModelProfile], pre: Preemption | None, profile: ModelProfile | None) -> int:
    if pre is not None:
        beneficiary = profiles.get(pre.beneficiary_model)
        return beneficiary.priority if beneficiary is not None else int(getattr(pre, "priority", 0))
    return profile.priority if profile is not None else 0


def _destructive_key(act: Action, pre: Preemption | None, profiles: Mapping[str, ModelProfile],
                     profile: ModelProfile | None) -> tuple:
    # A preemption drain inherits its beneficiary's priority and runs with availability work;
    # routine cleanup waits behind every availability action.
    cls = 0 if pre is not None else 1
    kind_rank = 0 if act.kind == "unload" else 1  # finishing a release beats starting a new one
    return (cls, -act.priority, 1, kind_rank, 0.0, act.model_id, act.host_id)


def _defer(act: Action, reason: str, not_before: float | None = None) -> Deferral:
    return Deferral(kind=act.kind, host_id=act.host_id, model_id=act.model_id, reason=reason,
                    action_id=act.action_id, detail=act.reason, not_before=not_before)


def _not_before(act: Action, reason: str, backoffs: Mapping[tuple[str, str, str], object]) -> float | None:
    if reason == BACKOFF:
        bo = backoffs.get((act.kind, act.host_id, act.model_id))
        return getattr(bo, "not_before", None)
    return None


def open_commands(history: ActionsState) -> list[ActionRecord]:
    """Issued, not terminal and not withdrawn, in issue order."""
    return [r for r in sorted(history.actions.values(), key=lambda r: r.issued_seq)
            if r.terminal_at is None and not r.withdrawn]


def withdraw_all(history: ActionsState, reason: str = WITHDRAW_MODE) -> tuple[Withdrawal, ...]:
    """Every open command, withdrawn (leaving automatic mode)."""
    return tuple(
        Withdrawal(action_id=r.command.action_id, host_id=r.command.host_id, model_id=r.command.model_id,
                   kind=r.command.kind, reason=reason, delivered=r.status == "accepted")
        for r in open_commands(history)
    )
