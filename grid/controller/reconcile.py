"""Pure reconciler: (plan, observed fleet and catalog, action history, now) -> lifecycle actions.

It reads the plan's decisions and its per-model ``basis`` (never the explanations, which are
presentation), and the hosts, profiles and retired models from the same ``PlannerInput`` the
plan was made from.

Nomad's generic_sched habit: the result is buckets of values (actions to issue, deferrals,
ignored residencies, blocked models, withdrawals), every entry with a reason constant. Nothing
here reads a clock, touches the log or iterates an unordered collection without sorting.

Transitions are deliberately small: load (acquire/verify the artifact), warm (start and probe),
drain (stop routing new work), unload (release memory once drained and idle).

Rules, in the order they are applied:

* Never actuate what Grid does not own: unmanaged and pinned residencies are only evidence
  (safety invariant 7).
* A command no host accepted before its lease ran out, to a host that is now stale or unknown,
  expires (withdrawal reason ``WITHDRAW_EXPIRED_UNDELIVERED``, which ends it): no agent admits an
  expired lease, so it can never run, and it must not hold its slot (or a pending drain its
  model) until a host that may never return answers it. A command the host accepted stays open
  (it may be running); the stale host's copies are no replicas anyway (freshness).
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
  replica is kept), minimum residency and the scale-down cooldown have elapsed. The cooldown
  yields on a host where a model with direct demand is short and would fit once the copies the
  plan no longer wants there are gone: those surplus copies are the first memory given up.
  The deliberate exception is an explicit staged preemption from the plan: the victim drains
  first, at most ``PREEMPTIONS_PER_MODEL`` times per model per ``PREEMPTION_WINDOW_SECONDS`` while the
  beneficiary already has a ready replica (``preemption_budget``; bounds ping-pong).
  An operator drain is the same make-before-break evacuation (the planner retains the draining
  host's ready copy until its replacement is ready, and the gateway keeps routing to it) with a
  deadline: once the host has been draining for ``Limits.evacuation_deadline_seconds`` (since
  ``Guards.evacuating_since``) its placements are no longer desired and its replicas drain even
  without a ready replacement; minimum residency no longer holds them. Except the model's last
  ready copy (invariant 5, "protect the last required replica"): with no ready replica on any
  other fresh admitting host it stays, serving, until its replacement is ready; the drain says so
  at once (grid.controller.drain_check).
* A draining residency is unloaded only when it reports zero requests in flight (invariant 6).
* The plan's cache-only advisories become loads with reason PREDICTIVE_PREFETCH (fetch and
  verify, never a warm), slotted after all demanded and routine work; its predictive cache
  expiries become evicts of the exact SHA, revalidated against the latest heartbeat (still
  cached, still predictive, nothing wants the model there) before issue and while open.
* Observation-time fencing: a heartbeat not newer than a successful ack of the same kind for the
  same host/model cannot trigger a duplicate.
* Slots: availability and preemption work first (by priority, evidence, replica round,
  estimated cold start), routine destructive work after; global and per-host mutation limits,
  exact-artifact fanout and per (kind, host, model) exponential failure backoff (invariant 8).
* Stable ids: sha256(kind|host|model|artifact sha|basis) where basis is the log sequence of the
  last finished or withdrawn command for the same intent, so a retried tick reproduces the same
  id (Nats-Msg-Id dedupes it) while a genuinely new lifecycle gets a new one (invariant 9).

`reconcile()` builds a `Reconciler` (one method per phase, in the order above) and runs it. The
file is longer than our usual 600 lines on purpose: the result types, the rules above and the
phase methods that apply them read top to bottom in one place, and every phase shares the
per-tick indexes the constructor builds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import msgspec

from grid.controller.governor import Governor, Limits, artifact_key, backoff_index
from grid.events.commands import DESTRUCTIVE_KINDS, PREDICTIVE_PREFETCH
from grid.events.control import ModelProfile
from grid.events.host import CachedArtifact
from grid.fleet import (
    ADMITTING_HOST_STATES,
    EVACUATING_HOST_STATES,
    HOLDS_MEMORY_STATES,
    RESIDENCY_STATE_RANK,
    heartbeat_live,
)
from grid.fleet.planning import (
    EVIDENCE_ORDER,
    CacheEviction,
    Placement,
    Plan,
    PlannerInput,
    Preemption,
    PrefetchAdvisory,
)
from grid.fleet.reasons import RELOCATION
from grid.fleet.views import HostView, ResidencyView
from grid.projections.actions import EXPIRED_UNDELIVERED, ActionRecord, ActionsState

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
# A predictive cache entry the plan expired (exact SHA; the agent deletes it only if unused).
EVICT_PREDICTIVE_EXPIRED = "evict_predictive_expired"
# (A cache-only advisory's load carries grid.events.commands.PREDICTIVE_PREFETCH.)

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
PREEMPTION_BUDGET = "preemption_budget"
TRANSITION_IN_PROGRESS = "transition_in_progress"
INSUFFICIENT_FREE_MEMORY = "insufficient_free_memory"
ARTIFACT_MISMATCH = "artifact_mismatch"
UNKNOWN_PROFILE = "unknown_profile"
# The latest heartbeat no longer shows the exact unused predictive entry an eviction names.
CACHE_ENTRY_CHANGED = "cache_entry_changed"
# A cache-only advisory the profile no longer matches (source or SHA changed since the plan).
ADVISORY_STALE = "advisory_stale"
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
WITHDRAW_EXPIRED_UNDELIVERED = EXPIRED_UNDELIVERED

# --- blocked ----------------------------------------------------------------------------------
BLOCKED_WITHDRAWN_DESTRUCTIVE = "withdrawn_destructive_unconfirmed"

# Preemption budget: a model is drained by staged preemptions at most this often per window
# while the beneficiary already serves from a ready replica (its first replica keeps strict
# priority). Bounds ping-pong between models whose demand alternates.
PREEMPTIONS_PER_MODEL = 1
PREEMPTION_WINDOW_SECONDS = 1800.0


class Guards(msgspec.Struct, frozen=True, kw_only=True):
    """Service-held facts the pure reconciler cannot derive from the log."""

    # Restart grace: no destructive action before this time...
    destructive_not_before: float = 0.0
    # ...and none on a host whose latest heartbeat was not received after this time.
    fresh_after: float | None = None
    # Withdrawn destructive commands whose postcondition a heartbeat already proved.
    cleared_withdrawals: frozenset[str] = frozenset()
    # Host id -> log time it entered the draining (evacuating) state, for the hosts in it.
    evacuating_since: dict[str, float] = {}


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
    embeddings: bool = False
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


def _rank(r: ResidencyView) -> int:
    return RESIDENCY_STATE_RANK.get(r.state, 0)


def _index_residencies(host: HostView) -> dict[str, _HostModel]:
    out: dict[str, _HostModel] = {}
    for r in host.residencies:
        hm = out.get(r.model_id)
        if hm is None:
            hm = out[r.model_id] = _HostModel()
        if r.managed and not r.pinned:
            if hm.managed is None or _rank(r) > _rank(hm.managed):
                hm.managed = r
        else:
            if hm.foreign is None or _rank(r) > _rank(hm.foreign):
                hm.foreign = r
    return out


def _fresh(host: HostView | None, now: float, limits: Limits) -> bool:
    at = host.heartbeat_at if host is not None else None
    return heartbeat_live(at, now, limits)


def _sha_ok(r: ResidencyView, profile: ModelProfile | None) -> bool:
    want = profile.artifact_sha256 if profile is not None else None
    return want is None or (r.artifact_sha256 or "").lower() == want.lower()


def _cached(host: HostView, model_id: str, profile: ModelProfile, hm: _HostModel | None) -> bool:
    want = profile.artifact_sha256
    for c in host.cached:
        if c.model_id == model_id and (want is None or c.sha256.lower() == want.lower()):
            return True
    r = hm.managed if hm is not None else None
    return r is not None and r.state == "cached" and _sha_ok(r, profile)


def _cache_entry(host: HostView, model_id: str, sha: str | None) -> CachedArtifact | None:
    """The host's cache entry of exactly this model and SHA, if its latest heartbeat shows one."""
    want = (sha or "").lower()
    for c in host.cached:
        if c.model_id == model_id and want and c.sha256.lower() == want:
            return c
    return None


def _memory_for(profile: ModelProfile, runtime: str) -> int:
    return int(profile.runtime_memory_mb.get(runtime, profile.memory_mb))


def _free_memory(host: HostView) -> int:
    used = sum(r.memory_mb for r in host.residencies if r.state in HOLDS_MEMORY_STATES)
    res = host.resources
    return int(res.capacity_mb - res.reserved_mb - host.unmanaged_memory_mb - used)


def _postcondition(kind: str, hm: _HostModel | None) -> bool:
    """A destructive action's durable postcondition as a heartbeat shows it."""
    state = hm.managed.state if hm is not None and hm.managed is not None else None
    if kind == "drain":
        return state in (None, "draining", "unloading", "cached")
    return state in (None, "cached")


class _Proposal:
    __slots__ = ("sort_key", "steps")

    def __init__(self, sort_key: tuple, steps: list[tuple[Action, list[str]]]) -> None:
        self.sort_key = sort_key
        # Each step: an action (id precomputed) and deferral reasons found before slotting.
        self.steps = steps


# --- the reconciler ---------------------------------------------------------------------------


def reconcile(
    plan: Plan,
    observed: PlannerInput,
    history: ActionsState,
    now: float,
    *,
    mode: str = "recommend",
    limits: Limits = Limits(),
    guards: Guards = Guards(),
) -> ReconcileResult:
    """The lifecycle actions that move the observed hosts toward `plan` at `now` (pure).

    `observed` is what the plan was made from (hosts, profiles, retired models); its demand and
    policy are the planner's business and are not read here."""
    return Reconciler(plan, observed, history, now, mode=mode, limits=limits, guards=guards).run()


class Reconciler:
    """One reconciliation, in the shape of Nomad's allocReconciler.

    The constructor indexes the inputs once (plan, fleet, action history); each phase method
    reads those indexes and fills the result buckets. `run()` applies the phases in the order
    of the rules in the module docstring, and that order is behaviour: the destructive guard and
    the withdrawals decide what later phases see as blocked or still open, open commands hold
    their governor slots before any candidate is admitted, and availability candidates are
    gathered before destructive ones so equal sort keys keep their order. Single use.
    """

    def __init__(
        self,
        plan: Plan,
        observed: PlannerInput,
        history: ActionsState,
        now: float,
        *,
        mode: str = "recommend",
        limits: Limits = Limits(),
        guards: Guards = Guards(),
    ) -> None:
        hosts = observed.hosts
        self.hosts = hosts
        self.profiles: dict[str, ModelProfile] = {p.model_id: p for p in observed.profiles}
        self.now = now
        self.mode = mode
        self.limits = limits
        self.guards = guards
        self.retired = frozenset(observed.retired) - frozenset(self.profiles)
        self.hosts_by_id = {h.host_id: h for h in hosts}
        self.fresh = {h.host_id: _fresh(h, now, limits) for h in hosts}
        self.residencies = {h.host_id: _index_residencies(h) for h in hosts}
        self._index_plan(plan)
        self._index_history(history)

        # The result buckets, filled by the phases.
        self.deferred: list[Deferral] = []
        self.ignored: list[Ignored] = []
        self.withdrawals: list[Withdrawal] = []
        self.withdrawn_now: set[str] = set()
        self.blocked: dict[str, list[str]] = {}
        self.cleared: list[str] = []
        self.in_flight: list[str] = []
        self.candidates: list[_Proposal] = []
        self.actions: list[Action] = []
        self.satisfied = 0
        self.gov = Governor(limits)
        # Open commands by (kind, host, model) minus this tick's withdrawals (set by phase 3).
        self.open_intents: dict[tuple[str, str, str], ActionRecord] = {}
        # Replica round per model: spreads one model's missing replicas across service order.
        self._round_of: dict[str, int] = {}

    def run(self) -> ReconcileResult:
        self.expire_undelivered()
        self.guard_withdrawn_destructive()
        self.withdraw_unsafe_destructive()
        self.withdraw_stale_availability()
        self.charge_open_commands()
        self.place_missing_replicas()
        self.prefetch_for_preemptions()
        self.prefetch_predictions()
        self.release_obsolete()
        self.expire_predictive_cache()
        self.slot_candidates()
        return self.result()

    # --- indexes --------------------------------------------------------------------------------

    def _index_plan(self, plan: Plan) -> None:
        self.desired: dict[tuple[str, str], Placement] = {}
        self.desired_by_model: dict[str, list[Placement]] = {}
        for p in sorted(plan.placements, key=lambda p: (p.model_id, p.host_id)):
            if (p.host_id, p.model_id) in self.desired:
                continue
            host = self.hosts_by_id.get(p.host_id)
            if host is not None and self._evacuation_releases(host, p.model_id):
                # The planner retains a draining host's copy until its replacement is ready;
                # past the evacuation deadline it is no longer desired there (unless it is the last).
                continue
            self.desired[(p.host_id, p.model_id)] = p
            self.desired_by_model.setdefault(p.model_id, []).append(p)
        self.victims: dict[tuple[str, str], Preemption] = {}
        self.beneficiaries: dict[tuple[str, str], Preemption] = {}
        for pre in sorted(plan.preemptions, key=lambda x: (x.host_id, x.victim_model, x.beneficiary_model)):
            self.victims.setdefault((pre.host_id, pre.victim_model), pre)
            self.beneficiaries.setdefault((pre.host_id, pre.beneficiary_model), pre)
        # Cache-only advisories (in the plan's order) and predictive cache expiries.
        self.prefetch: dict[tuple[str, str], tuple[int, PrefetchAdvisory]] = {}
        for i, adv in enumerate(plan.prefetch):
            self.prefetch.setdefault((adv.host_id, adv.model_id), (i, adv))
        self.evictions: tuple[CacheEviction, ...] = tuple(
            sorted(plan.evictions, key=lambda e: (e.host_id, e.model_id, e.artifact_sha256)))
        self.shortfall_models = frozenset(s.model_id for s in plan.shortfalls if s.wanted > s.placed)
        self.evidence_rank = {b.model_id: EVIDENCE_ORDER.get(b.evidence, 1) for b in plan.basis}
        # Models with direct demand the plan could not place in full: a scale-down the cooldown
        # alone would hold gives way to them (``_cooldown_yields``).
        direct = frozenset(b.model_id for b in plan.basis if b.evidence == "direct")
        self.direct_short = tuple(sorted(m for m in self.shortfall_models if m in direct))
        # Per planned model, the holders of a managed copy that are still eligible for it.
        self.eligible_holders = {b.model_id: frozenset(b.eligible_holders) for b in plan.basis}
        self.all_desired_ready: dict[str, bool] = {
            m: all(self._ready_at(p.host_id, m) for p in ps) for m, ps in self.desired_by_model.items()
        }

    def _index_history(self, history: ActionsState) -> None:
        records = sorted(history.actions.values(), key=lambda r: r.issued_seq)
        self.open_records = [r for r in records if r.terminal_at is None]
        # Log sequence of the last finished or withdrawn command per intent and artifact.
        self.basis: dict[tuple[str, str, str, str], int] = {}
        self.last_success: dict[tuple[str, str, str], float] = {}
        self.open_by_intent: dict[tuple[str, str, str], ActionRecord] = {}
        # victim model id -> issue times of its preemption drains inside the budget window
        self.preempted_at: dict[str, list[float]] = {}
        for r in records:
            cmd = r.command
            if (
                cmd.kind == "drain" and cmd.reason == DRAIN_PREEMPTION and not r.withdrawn
                and r.status not in ("rejected", "cancelled")
                and self.now - r.issued_at < PREEMPTION_WINDOW_SECONDS
            ):
                self.preempted_at.setdefault(cmd.model_id, []).append(r.issued_at)
            if r.terminal_at is not None or r.withdrawn:
                key4 = (cmd.kind, cmd.host_id, cmd.model_id, (cmd.artifact_sha256 or "").lower())
                self.basis[key4] = max(self.basis.get(key4, 0), r.issued_seq)
            if r.terminal_at is not None and r.status == "succeeded":
                key3 = (cmd.kind, cmd.host_id, cmd.model_id)
                self.last_success[key3] = max(self.last_success.get(key3, 0.0), r.terminal_at)
            if r.terminal_at is None and not r.withdrawn:
                self.open_by_intent.setdefault((cmd.kind, cmd.host_id, cmd.model_id), r)
        self.backoffs = backoff_index(self.limits, records)

    def _hm_of(self, host_id: str, model_id: str) -> _HostModel | None:
        return self.residencies.get(host_id, {}).get(model_id)

    def _ready_at(self, host_id: str, model_id: str) -> bool:
        host = self.hosts_by_id.get(host_id)
        if host is None or not self.fresh[host_id] or host.state not in ADMITTING_HOST_STATES:
            return False
        hm = self._hm_of(host_id, model_id)
        if hm is None:
            return False
        profile = self.profiles.get(model_id)
        return any(r is not None and r.state == "ready" and _sha_ok(r, profile) for r in (hm.managed, hm.foreign))

    def _observed_after(self, host_id: str, at: float) -> bool:
        """A heartbeat from `host_id` was received after `at`."""
        host = self.hosts_by_id.get(host_id)
        return host is not None and host.heartbeat_at is not None and host.heartbeat_at > at

    # --- 0. commands that can no longer be delivered ---------------------------------------------

    def expire_undelivered(self) -> None:
        """A never-accepted command whose lease ran out, to a stale or unknown host, ends."""
        expired = [r for r in self.open_records if self._undeliverable(r)]
        for r in expired:
            self._withdraw(r, WITHDRAW_EXPIRED_UNDELIVERED)
        if expired:
            # Gone for every later phase: it neither blocks, nor is re-validated, nor holds a slot.
            self.open_records = [r for r in self.open_records if r.command.action_id not in self.withdrawn_now]

    def _undeliverable(self, r: ActionRecord) -> bool:
        cmd = r.command
        if r.status != "pending" or self.fresh.get(cmd.host_id, False):
            return False
        # The agent judges the lease from the log's receipt time (`issued_at`); the skew allowance
        # keeps a controller clock ahead of the server's from calling it early.
        return self.now - r.issued_at >= cmd.lease_ttl_seconds + self.limits.future_skew_seconds

    # --- 1. the withdrawn-destructive guard -------------------------------------------------------

    def guard_withdrawn_destructive(self) -> None:
        """A withdrawn drain/unload the node may be running blocks its model until proven done."""
        for r in self.open_records:
            cmd = r.command
            if not r.withdrawn or cmd.kind not in DESTRUCTIVE_KINDS:
                continue
            if cmd.action_id in self.guards.cleared_withdrawals:
                continue
            if self._observed_after(cmd.host_id, r.issued_at) and self._done(cmd):
                self.cleared.append(cmd.action_id)
                continue
            self.blocked.setdefault(cmd.model_id, []).append(cmd.action_id)

    # --- 2. re-validate open commands -------------------------------------------------------------

    def _done(self, cmd) -> bool:
        """The destructive command's postcondition holds in the latest heartbeat."""
        if cmd.kind == "evict":
            # Gone, or warmed since (no longer predictive): the agent evicts only an unused
            # predictive entry, so nothing of it can still run.
            host = self.hosts_by_id.get(cmd.host_id)
            entry = _cache_entry(host, cmd.model_id, cmd.artifact_sha256) if host is not None else None
            return host is not None and (entry is None or not entry.predictive)
        return _postcondition(cmd.kind, self._hm_of(cmd.host_id, cmd.model_id))

    def _destructive_unsafe(self, r: ActionRecord) -> bool:
        cmd = r.command
        if cmd.kind == "evict":
            # Revalidated against the latest heartbeat: the exact entry still unused, nothing wants it.
            host = self.hosts_by_id.get(cmd.host_id)
            if host is None or _cache_entry(host, cmd.model_id, cmd.artifact_sha256) is None:
                return False  # gone: nothing left to make unsafe
            return self._eviction_blocked(cmd.host_id, cmd.model_id, cmd.artifact_sha256) is not None
        hm = self._hm_of(cmd.host_id, cmd.model_id)
        observed_after = self._observed_after(cmd.host_id, r.issued_at)
        if observed_after and self._done(cmd):
            return False  # already done: nothing left to make unsafe
        m = cmd.model_id
        if cmd.kind == "drain":
            if (cmd.host_id, m) in self.desired:
                return True
            if (cmd.host_id, m) in self.victims or m in self.retired or m not in self.profiles:
                return False
            if hm is not None and hm.managed is not None and hm.managed.state == "failed":
                return False
            host = self.hosts_by_id.get(cmd.host_id)
            if host is not None and self._evacuation_releases(host, m):
                return False
            if m in self.shortfall_models:
                return True
            return not self.all_desired_ready.get(m, True)
        # unload
        state = hm.managed if hm is not None else None
        if state is None:
            return False
        if observed_after and state.state in ("ready", "warming", "loading"):
            return True
        return state.state == "draining" and state.active_requests > 0

    def withdraw_unsafe_destructive(self) -> None:
        """A delivered drain/unload that fresh evidence makes unsafe withdraws its model's whole batch."""
        destructive_open: dict[str, list[ActionRecord]] = {}
        for r in self.open_records:
            if not r.withdrawn and r.command.kind in DESTRUCTIVE_KINDS:
                destructive_open.setdefault(r.command.model_id, []).append(r)
        for m in sorted(destructive_open):
            batch = destructive_open[m]
            if not any(self._destructive_unsafe(r) for r in batch):
                continue
            for r in batch:
                self._withdraw(r, WITHDRAW_UNSAFE_DESTRUCTIVE)
                self.blocked.setdefault(m, []).append(r.command.action_id)

    def withdraw_stale_availability(self) -> None:
        """Load/warm for a retired model, or undelivered and no longer wanted, is withdrawn."""
        for r in self.open_records:
            cmd = r.command
            if r.withdrawn or cmd.kind in DESTRUCTIVE_KINDS:
                continue
            profile = self.profiles.get(cmd.model_id)
            reason = None
            if cmd.model_id in self.retired or profile is None:
                reason = WITHDRAW_RETIRED
            elif r.status == "pending":
                want_sha = (profile.artifact_sha256 or "").lower()
                if (cmd.artifact_sha256 or "").lower() != want_sha:
                    reason = WITHDRAW_ARTIFACT_CHANGED
                elif (cmd.host_id, cmd.model_id) not in self.desired and not (
                    cmd.kind == "load" and (cmd.host_id, cmd.model_id) in self.beneficiaries
                ) and not (cmd.kind == "load" and (cmd.host_id, cmd.model_id) in self.prefetch):
                    reason = WITHDRAW_NOT_DESIRED
            if reason is not None:
                self._withdraw(r, reason)

    def _withdraw(self, r: ActionRecord, reason: str) -> None:
        cmd = r.command
        self.withdrawals.append(Withdrawal(
            action_id=cmd.action_id, host_id=cmd.host_id, model_id=cmd.model_id, kind=cmd.kind,
            reason=reason, delivered=r.status == "accepted",
        ))
        self.withdrawn_now.add(cmd.action_id)

    # --- 3. the governor: open commands hold their slots ------------------------------------------

    def charge_open_commands(self) -> None:
        for r in self.open_records:
            cmd = r.command
            still_open = not r.withdrawn and cmd.action_id not in self.withdrawn_now
            if still_open:
                self.in_flight.append(cmd.action_id)
            # A withdrawal the node already accepted may still be running: it keeps its slot.
            if still_open or r.status == "accepted":
                self.gov.charge_open(
                    cmd.host_id, cmd.kind, artifact_key(cmd.model_id, cmd.artifact_sha256),
                    counts_globally=self.fresh.get(cmd.host_id, False),
                )
        self.open_intents = {
            k: r for k, r in self.open_by_intent.items() if r.command.action_id not in self.withdrawn_now
        }

    # --- shared by the candidate phases -----------------------------------------------------------

    def _new_id(self, kind: str, host_id: str, model_id: str, sha: str | None) -> str:
        basis = self.basis.get((kind, host_id, model_id, (sha or "").lower()), 0)
        return action_id(kind, host_id, model_id, sha, basis)

    def _common_checks(self, kind: str, host_id: str, model_id: str) -> list[str]:
        """Reasons that hold for any action of `kind` on this host/model right now."""
        reasons: list[str] = []
        host = self.hosts_by_id.get(host_id)
        if host is None:
            return [HOST_UNKNOWN]
        if not self.fresh[host_id]:
            return [HOST_STALE]
        destructive = kind in DESTRUCTIVE_KINDS
        if not destructive and host.state not in ADMITTING_HOST_STATES:
            reasons.append(HOST_NOT_ACCEPTING)
        if kind not in host.actuator_capabilities:
            reasons.append(NO_CAPABILITY)
        if destructive:
            if self.now < self.guards.destructive_not_before or (
                self.guards.fresh_after is not None and (host.heartbeat_at or 0.0) <= self.guards.fresh_after
            ):
                reasons.append(RESTART_GRACE)
            if model_id in self.blocked:
                reasons.append(DESTRUCTIVE_BLOCKED)
        success_at = self.last_success.get((kind, host_id, model_id))
        if success_at is not None and (host.heartbeat_at or 0.0) <= success_at:
            reasons.append(AWAITING_OBSERVATION)
        bo = self.backoffs.get((kind, host_id, model_id))
        if bo is not None and self.now < bo.not_before:
            reasons.append(BACKOFF)
        return reasons

    def _make_action(self, kind: str, host_id: str, model_id: str, profile: ModelProfile | None, memory_mb: int,
                     reason: str, runtime: str, *, deps: tuple[str, ...] = (), preemption_for: str | None = None,
                     priority: int = 0, detail: str = "", sha: str | None = None) -> Action:
        if sha is not None:
            sha = sha.lower()  # an evict names the exact cached SHA, whatever the profile says now
        elif profile is not None and profile.artifact_sha256:
            sha = profile.artifact_sha256.lower()
        return Action(
            action_id=self._new_id(kind, host_id, model_id, sha), kind=kind, host_id=host_id, model_id=model_id,
            memory_mb=memory_mb, reason=reason, runtime=runtime, artifact_sha256=sha,
            artifact_source=profile.artifact_source if profile is not None else None,
            artifact_size_mb=profile.artifact_size_mb if profile is not None else None,
            context_size=profile.context_size if profile is not None else 2048,
            slots=profile.replica_concurrency if profile is not None else 1,
            embeddings=profile.embeddings if profile is not None else False,
            dependencies=deps, priority=priority, destructive=kind in DESTRUCTIVE_KINDS,
            preemption_for=preemption_for, detail=detail,
        )

    def _defer_in_flight(self, kind: str, host_id: str, model_id: str) -> bool:
        """Defer `kind` here when an equivalent command is still open (True when deferred)."""
        open_cmd = self.open_intents.get((kind, host_id, model_id))
        if open_cmd is None:
            return False
        self.deferred.append(Deferral(kind=kind, host_id=host_id, model_id=model_id, reason=IN_FLIGHT,
                                      action_id=open_cmd.command.action_id))
        return True

    # --- 4. availability: missing desired replicas ------------------------------------------------

    def place_missing_replicas(self) -> None:
        for (host_id, model_id), p in sorted(self.desired.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            self._place(host_id, model_id, p)

    def _place(self, host_id: str, model_id: str, p: Placement) -> None:
        profile = self.profiles.get(model_id)
        hm = self._hm_of(host_id, model_id)
        if not getattr(p, "managed", True):
            # An external residency the planner counted: evidence only, never actuated.
            if hm is not None and hm.foreign is not None and hm.foreign.state == "ready":
                self.satisfied += 1
            return
        if profile is None:
            self.deferred.append(Deferral(kind="warm", host_id=host_id, model_id=model_id, reason=UNKNOWN_PROFILE))
            return
        host = self.hosts_by_id.get(host_id)
        if hm is not None and hm.foreign is not None:
            if hm.foreign.state == "ready" and _sha_ok(hm.foreign, profile):
                self.satisfied += 1
            else:
                self.ignored.append(Ignored(
                    host_id=host_id, model_id=model_id, state=hm.foreign.state,
                    reason=IGNORED_PINNED if hm.foreign.pinned else IGNORED_UNMANAGED,
                ))
            return
        r = hm.managed if hm is not None else None
        state = r.state if r is not None else None
        if state == "ready":
            if _sha_ok(r, profile):  # type: ignore[arg-type]
                self.satisfied += 1
            else:
                self.deferred.append(Deferral(
                    kind="warm", host_id=host_id, model_id=model_id, reason=ARTIFACT_MISMATCH,
                    detail=f"resident {r.artifact_sha256} != profile {profile.artifact_sha256}",  # type: ignore[union-attr]
                ))
            return
        if state in ("loading", "warming", "unloading", "draining"):
            # A draining desired copy is unloaded below (it is not serving) and warmed again later.
            if state != "draining":
                self.deferred.append(Deferral(kind="warm", host_id=host_id, model_id=model_id,
                                              reason=TRANSITION_IN_PROGRESS, detail=state))
            return
        # absent, cached or failed: (load) + warm
        runtime = p.runtime or "llama.cpp"
        memory = p.memory_mb or _memory_for(profile, runtime)
        steps: list[tuple[Action, list[str]]] = []
        load_dep: tuple[str, ...] = ()
        load_success = self.last_success.get(("load", host_id, model_id))
        cached = host is not None and (
            _cached(host, model_id, profile, hm)
            or (load_success is not None and (host.heartbeat_at or 0.0) <= load_success)
        )
        if self._defer_in_flight("warm", host_id, model_id):
            return
        warm_reasons = self._common_checks("warm", host_id, model_id)
        if not cached:
            # The warm waits for its load to finish (it is issued on a later tick, so its lease
            # TTL is not spent queueing behind a long transfer); a deferred load defers it.
            open_load = self.open_intents.get(("load", host_id, model_id))
            if open_load is not None:
                load_dep = (open_load.command.action_id,)
                warm_reasons.insert(0, AWAITING_DEPENDENCY)
            else:
                load = self._make_action("load", host_id, model_id, profile, memory, LOAD_FOR_PLACEMENT, runtime,
                                         priority=profile.priority)
                steps.append((load, self._common_checks("load", host_id, model_id)))
                load_dep = (load.action_id,)
        warm = self._make_action("warm", host_id, model_id, profile, memory, WARM_FOR_PLACEMENT, runtime,
                                 deps=load_dep, priority=profile.priority)
        steps.append((warm, warm_reasons))
        rnd = self._round_of.get(model_id, 0)
        self._round_of[model_id] = rnd + 1
        est = (0.0 if cached else profile.load_seconds) + profile.warm_seconds
        key = (0, -profile.priority, self.evidence_rank.get(model_id, 1), rnd, est, model_id, host_id)
        self.candidates.append(_Proposal(key, steps))

    def prefetch_for_preemptions(self) -> None:
        """Fetch the beneficiary's exact artifact before its victim drains (disk only, never warm)."""
        for (host_id, model_id), pre in sorted(self.beneficiaries.items()):
            profile = self.profiles.get(model_id)
            host = self.hosts_by_id.get(host_id)
            if profile is None or host is None or not profile.artifact_source or not profile.artifact_sha256:
                continue
            if (host_id, model_id) in self.desired:
                continue
            if _cached(host, model_id, profile, self._hm_of(host_id, model_id)):
                continue
            if self.open_intents.get(("load", host_id, model_id)) is not None:
                continue
            load = self._make_action("load", host_id, model_id, profile, _memory_for(profile, "llama.cpp"),
                                     PREFETCH_FOR_PREEMPTION, "llama.cpp", priority=profile.priority,
                                     detail=f"victim {pre.victim_model}")
            evidence = self.evidence_rank.get(model_id, 1)
            key = (0, -profile.priority, evidence, 0, profile.load_seconds, model_id, host_id)
            self.candidates.append(_Proposal(key, [(load, self._common_checks("load", host_id, model_id))]))

    def prefetch_predictions(self) -> None:
        """The plan's cache-only advisories become loads (PREDICTIVE_PREFETCH): fetch and verify,
        never a warm. They slot after every demanded and routine action (the mutation budget
        serves real work first); an advisory the profile no longer matches is not acted on."""
        for (host_id, model_id), (order, adv) in sorted(self.prefetch.items(), key=lambda kv: kv[1][0]):
            profile = self.profiles.get(model_id)
            host = self.hosts_by_id.get(host_id)
            if host is None or (host_id, model_id) in self.desired or (host_id, model_id) in self.beneficiaries:
                continue  # a placement's own load (or a preemption prefetch) fetches it
            if (
                profile is None or not profile.artifact_source or not profile.artifact_sha256
                or profile.artifact_sha256.lower() != adv.artifact_sha256.lower()
            ):
                self.deferred.append(Deferral(kind="load", host_id=host_id, model_id=model_id, reason=ADVISORY_STALE,
                                              detail=PREDICTIVE_PREFETCH))
                continue
            if _cached(host, model_id, profile, self._hm_of(host_id, model_id)):
                continue
            if self._defer_in_flight("load", host_id, model_id):
                continue
            load = self._make_action("load", host_id, model_id, profile, _memory_for(profile, "llama.cpp"),
                                     PREDICTIVE_PREFETCH, "llama.cpp", priority=profile.priority,
                                     detail=f"value {adv.value_per_mb:g}/MB")
            key = (2, -profile.priority, 2, order, adv.load_seconds, model_id, host_id)
            self.candidates.append(_Proposal(key, [(load, self._common_checks("load", host_id, model_id))]))

    def _eviction_blocked(self, host_id: str, model_id: str, sha: str | None) -> str | None:
        """Why the exact unused predictive entry may not be evicted now (None: it may)."""
        host = self.hosts_by_id.get(host_id)
        if host is None:
            return HOST_UNKNOWN
        entry = _cache_entry(host, model_id, sha)
        if entry is None or not entry.predictive:
            return CACHE_ENTRY_CHANGED
        if (host_id, model_id) in self.desired or (host_id, model_id) in self.prefetch or (
            (host_id, model_id) in self.beneficiaries
        ):
            return CACHE_ENTRY_CHANGED
        if any(r.model_id == model_id and r.state != "cached" for r in host.residencies):
            return CACHE_ENTRY_CHANGED
        if ("load", host_id, model_id) in self.open_by_intent or ("warm", host_id, model_id) in self.open_by_intent:
            return CACHE_ENTRY_CHANGED
        return None

    def expire_predictive_cache(self) -> None:
        """The plan's predictive cache expiries become evicts of the exact SHA, each revalidated
        against the latest heartbeat first: still cached, still predictive (never warmed), same
        SHA, and nothing wants the model on that host."""
        for ev in self.evictions:
            host_id, model_id = ev.host_id, ev.model_id
            if self._defer_in_flight("evict", host_id, model_id):
                continue
            why = self._eviction_blocked(host_id, model_id, ev.artifact_sha256)
            if why is not None:
                self.deferred.append(Deferral(kind="evict", host_id=host_id, model_id=model_id, reason=why,
                                              detail=ev.artifact_sha256))
                continue
            profile = self.profiles.get(model_id)
            act = self._make_action("evict", host_id, model_id, profile, 0, EVICT_PREDICTIVE_EXPIRED, "llama.cpp",
                                    priority=profile.priority if profile is not None else 0,
                                    detail=f"unused {ev.age_seconds:g}s", sha=ev.artifact_sha256)
            key = (1, -act.priority, 1, 2, 0.0, model_id, host_id)
            self.candidates.append(_Proposal(key, [(act, self._common_checks("evict", host_id, model_id))]))

    # --- 5. destructive: obsolete and draining managed residencies --------------------------------

    def release_obsolete(self) -> None:
        for host in sorted(self.hosts, key=lambda h: h.host_id):
            host_id = host.host_id
            for model_id in sorted(self.residencies[host_id]):
                hm = self.residencies[host_id][model_id]
                is_desired = (host_id, model_id) in self.desired
                if hm.foreign is not None and not is_desired:
                    self.ignored.append(Ignored(
                        host_id=host_id, model_id=model_id, state=hm.foreign.state,
                        reason=IGNORED_PINNED if hm.foreign.pinned else IGNORED_UNMANAGED,
                    ))
                r = hm.managed
                # A desired copy beside a foreign one was judged by phase 4: never actuated.
                if r is None or hm.foreign is not None and is_desired:
                    continue
                if r.state == "draining":
                    self._unload_drained(host_id, model_id, r)
                elif not is_desired and r.state != "cached":
                    self._drain(host, model_id, r)

    def _evacuation_due(self, host: HostView) -> bool:
        """The host is evacuating (draining) and its deadline has passed."""
        if host.state not in EVACUATING_HOST_STATES:
            return False
        since = self.guards.evacuating_since.get(host.host_id)
        return since is not None and self.now - since >= self.limits.evacuation_deadline_seconds

    def _evacuation_releases(self, host: HostView, model_id: str) -> bool:
        """Past its evacuation deadline a draining host's copy of `model_id` goes without waiting
        for its replacement, as long as another fresh admitting host serves the model: the last
        ready copy is kept until a replacement is ready (invariant 5; the drain warned of it)."""
        return self._evacuation_due(host) and any(
            self._ready_at(h.host_id, model_id) for h in self.hosts if h.host_id != host.host_id)

    def _unload_drained(self, host_id: str, model_id: str, r: ResidencyView) -> None:
        if self._defer_in_flight("unload", host_id, model_id):
            return
        profile = self.profiles.get(model_id)
        pre = self.victims.get((host_id, model_id))
        act = self._make_action("unload", host_id, model_id, profile, r.memory_mb, UNLOAD_DRAINED, r.runtime,
                                preemption_for=pre.beneficiary_model if pre else None,
                                priority=_priority(self.profiles, pre, profile))
        reasons = self._common_checks("unload", host_id, model_id)
        if r.active_requests > 0:
            reasons.append(REQUESTS_IN_FLIGHT)
        self.candidates.append(_Proposal(_destructive_key(act, pre, self.profiles, profile), [(act, reasons)]))

    def _drain(self, host: HostView, model_id: str, r: ResidencyView) -> None:
        """A ready or failed managed residency that is not desired here."""
        host_id = host.host_id
        if r.state in ("loading", "warming", "unloading"):
            self.deferred.append(Deferral(kind="drain", host_id=host_id, model_id=model_id,
                                          reason=TRANSITION_IN_PROGRESS, detail=r.state))
            return
        if self._defer_in_flight("drain", host_id, model_id):
            return
        profile = self.profiles.get(model_id)
        pre = self.victims.get((host_id, model_id))
        retiring = model_id in self.retired
        reasons = self._common_checks("drain", host_id, model_id)
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
            holders = self.eligible_holders.get(model_id)
            still_eligible = host_id in holders if holders is not None else host.state in ADMITTING_HOST_STATES
            reason = DRAIN_SCALE_DOWN if still_eligible else DRAIN_OBSOLETE
        now = self.now
        # An evacuation past its deadline: the draining host's replica goes without a ready
        # replacement and inside its minimum residency (the operator asked for the machine back),
        # but never the model's last ready copy (invariant 5).
        overdue = self._evacuation_releases(host, model_id)
        if r.state == "ready" and pre is None and not retiring and profile is not None and not overdue:
            if model_id in self.shortfall_models:
                reasons.append(LAST_REPLICA)
            elif not self.all_desired_ready.get(model_id, True):
                reasons.append(AWAITING_REPLACEMENT)
            if reason == DRAIN_SCALE_DOWN and r.last_used_at is not None and (
                now - r.last_used_at < profile.scale_down_cooldown_seconds
            ) and not self._cooldown_yields(host):
                reasons.append(SCALE_DOWN_COOLDOWN)
        if r.state == "ready" and not retiring and profile is not None and r.loaded_at is not None and (
            now - r.loaded_at < profile.min_residency_seconds
        ) and not overdue:
            reasons.append(MIN_RESIDENCY)
        elif pre is not None and getattr(pre, "not_before", None) is not None and now < pre.not_before:  # type: ignore[operator]
            reasons.append(MIN_RESIDENCY)
        if (
            pre is not None and pre.reason == RELOCATION and r.state == "ready"
            and not any(self._ready_at(h.host_id, model_id) for h in self.hosts if h.host_id != host_id)
        ):
            # A relocation moves a replica, never removes the last one: the new copy must serve.
            reasons.append(AWAITING_REPLACEMENT)
        if (
            pre is not None and reason == DRAIN_PREEMPTION
            and len(self.preempted_at.get(model_id, ())) >= PREEMPTIONS_PER_MODEL
            and any(self._ready_at(h.host_id, pre.beneficiary_model) for h in self.hosts)
        ):
            reasons.append(PREEMPTION_BUDGET)
        act = self._make_action("drain", host_id, model_id, profile, r.memory_mb, reason, r.runtime,
                                preemption_for=pre.beneficiary_model if pre else None,
                                priority=_priority(self.profiles, pre, profile))
        self.candidates.append(_Proposal(_destructive_key(act, pre, self.profiles, profile), [(act, reasons)]))

    def _cooldown_yields(self, host: HostView) -> bool:
        """Whether the scale-down cooldown stops holding surplus copies on `host`: a model with
        direct demand is short and would fit here once the copies the plan no longer wants on the
        host are gone (the cooldown damps churn; it must not keep named demand waiting)."""
        if not self.direct_short:
            return False
        res = host.resources
        surplus = sum(r.memory_mb for r in host.residencies
                      if r.managed and not r.pinned and r.state == "ready"
                      and (host.host_id, r.model_id) not in self.desired)
        room = _free_memory(host) + surplus
        for model_id in self.direct_short:
            p = self.profiles.get(model_id)
            if p is None or (host.host_id, model_id) in self.desired:
                continue
            if not set(p.runtimes) & set(res.runtimes) or (p.backends and not set(p.backends) & set(res.backends)):
                continue
            if p.memory_mb <= room:
                return True
        return False

    # --- 6. slot the candidates in service order --------------------------------------------------

    def slot_candidates(self) -> None:
        # Memory a warm may still claim on each host: free memory in the latest heartbeat minus
        # warms already in flight (and those admitted below). Defence in depth for invariant 1.
        free_mb: dict[str, int] = {}
        for host in self.hosts:
            free_mb[host.host_id] = _free_memory(host)
        for (k, h, _m), o in self.open_intents.items():
            if k == "warm" and h in free_mb:
                free_mb[h] -= o.command.memory_mb
        for cand in sorted(self.candidates, key=lambda c: c.sort_key):
            chain_deferred = False
            for i, (act, reasons) in enumerate(cand.steps):
                if chain_deferred:
                    self.deferred.append(_defer(act, DEPENDENCY_DEFERRED))
                    continue
                if i > 0:
                    self.deferred.append(_defer(act, AWAITING_DEPENDENCY))
                    continue
                if reasons:
                    self.deferred.append(_defer(act, reasons[0], _not_before(act, reasons[0], self.backoffs)))
                    chain_deferred = True
                    continue
                if act.kind == "warm" and free_mb.get(act.host_id, 0) < act.memory_mb:
                    self.deferred.append(_defer(act, INSUFFICIENT_FREE_MEMORY))
                    chain_deferred = True
                    continue
                akey = artifact_key(act.model_id, act.artifact_sha256)
                refusal = self.gov.refusal(act.host_id, act.kind, akey)
                if refusal is not None:
                    self.deferred.append(_defer(act, refusal))
                    chain_deferred = True
                    continue
                self.gov.admit(act.host_id, act.kind, akey)
                if act.kind == "warm":
                    free_mb[act.host_id] = free_mb.get(act.host_id, 0) - act.memory_mb
                self.actions.append(act)

    # --- the result -------------------------------------------------------------------------------

    def result(self) -> ReconcileResult:
        actions, deferred = self.actions, self.deferred
        if self.mode == "observe":
            deferred = [_defer(a, OBSERVE_ONLY) for a in actions] + deferred
            actions = []
        return ReconcileResult(
            mode=self.mode,
            now=self.now,
            actions=tuple(actions),
            deferred=tuple(deferred),
            ignored=tuple(self.ignored),
            blocked=tuple(
                BlockedModel(model_id=m, reason=BLOCKED_WITHDRAWN_DESTRUCTIVE, action_ids=tuple(sorted(set(ids))))
                for m, ids in sorted(self.blocked.items())
            ),
            withdrawals=tuple(self.withdrawals),
            cleared_withdrawals=tuple(sorted(self.cleared)),
            in_flight=tuple(self.in_flight),
            satisfied=self.satisfied,
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
