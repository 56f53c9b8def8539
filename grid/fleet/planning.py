"""The planner's contract: its input and output values and the plan codec.

Pure data: everything the planner needs is in PlannerInput, everything it decides is in Plan.
Same PlannerInput bytes (``grid.events.codec.encode_value``) give the same Plan bytes; the
plan's ``inputs_digest`` is the sha256 of that deterministic encoding. The demand forecaster
builds inputs, the controller records plans, the gateway and status read them; none of them
needs the planner's algorithm (grid.planner) for that.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from grid.events.codec import encode_value
from grid.events.control import ModelProfile
from grid.fleet.freshness import FUTURE_SKEW_SECONDS, HEARTBEAT_TIMEOUT_SECONDS
from grid.fleet.views import HostView, Value

Evidence = Literal["baseline", "direct", "inferred"]
EVIDENCE_ORDER: dict[str, int] = {"baseline": 0, "direct": 1, "inferred": 2}


class Harm(Value, frozen=True, kw_only=True):
    """Attributable service harm used to break partial fair rounds (all >= 0)."""

    queue: float = 0.0
    latency_ratio: float = 0.0
    errors: float = 0.0
    concurrency: float = 0.0
    rate: float = 0.0


class DemandTarget(Value, frozen=True, kw_only=True):
    model_id: str
    replicas: int
    evidence: Evidence
    harm: Harm = Harm()
    offered_concurrency: float = 0.0
    # One-replica canary cap for weak evidence.
    canary: bool = False
    reason: str = ""


class TimingSample(Value, frozen=True, kw_only=True):
    """Learned load/warm seconds for one host/model/artifact revision (bounded EWMA)."""

    host_id: str
    model_id: str
    artifact_sha256: str | None = None
    load_seconds: float | None = None
    warm_seconds: float | None = None
    samples: int = 0


class PendingPlacement(Value, frozen=True, kw_only=True):
    """A replica the controller already commanded (an open load or warm) and the host has not
    yet reported: the planner keeps it over an equal alternative while it is still feasible."""

    host_id: str
    model_id: str


class Policy(Value, frozen=True, kw_only=True):
    max_evictions: int = 64
    # Bytes that must stay free on an artifact disk after a demanded download.
    disk_reserve_bytes: int = 1 << 30
    # Speculative (predictive cache) transfers must leave this much free.
    predictive_disk_reserve_bytes: int = 10 << 30
    # Extra fraction of a new allocation that must fit (admission headroom for new work).
    admission_headroom_fraction: float = 0.05
    heartbeat_timeout_seconds: float = HEARTBEAT_TIMEOUT_SECONDS
    future_skew_seconds: float = FUTURE_SKEW_SECONDS
    max_repair_steps: int = 2000
    max_new_placements: int = 1_000_000
    # Per-model bound on host ids listed in a plan's explanation (eligible hosts and per-host
    # rejections); counts per reason stay complete. grid.planner.plan.explain_model gives
    # the unbounded per-host breakdown for one model on demand.
    explain_host_limit: int = 8
    # Flap quarantine (grid.fleet.quarantine): a host with at least `flap_host_transitions`
    # lifecycle transitions (state changes, going silent, coming back), or a model with at least
    # `flap_model_transitions` residency failures, within `flap_window_seconds` takes no new
    # placement for `flap_backoff_seconds`, doubled for each quarantine that follows the last
    # release within `flap_backoff_max_seconds` and capped there. Incumbents stay, a model with
    # no replica still gets one, and a plan that a host quarantine would cost a replica is made
    # without it (grid.planner.plan.build_plan). 0: never.
    # Host defaults from the lab (grid.sim.flapping.transition_peaks): on ordinary days (the
    # classic day on 4, 8 and 16 machines; the full day on 4) no host had more than 2 transitions
    # in any 30 minutes (one outage: silent and back; one throttle: in and out), while a machine
    # down 2 of every 6 minutes has 10; 6 (three outages in half an hour) sits between with room
    # on both sides. The backoff outlasts two such cycles and doubles up to 2 hours. The model
    # threshold is not from the lab (its machines never report a failed residency): 3 failures
    # in 30 minutes is a crash loop, beyond the reconciler's own per-host retry backoff.
    flap_window_seconds: float = 1800.0
    flap_host_transitions: int = 6
    flap_model_transitions: int = 3
    flap_backoff_seconds: float = 900.0
    flap_backoff_max_seconds: float = 7200.0
    # Cache-only advisories (grid.planner.prefetch) one plan may stage for correlation-only
    # predictions that got no serving slot: each is a whole artifact transfer, so few. 0: none.
    max_prefetch_per_plan: int = 2
    # An unused predictive cache entry at least this old whose model has no demand left may be
    # evicted (exact SHA, hosts that advertise the evict actuator only).
    predictive_cache_ttl_seconds: float = 6 * 3600.0


FlapQuarantineKind = Literal["host", "model"]


class FlapQuarantine(Value, frozen=True, kw_only=True):
    """A host or model held out of new placement because its lifecycle flaps (its incumbents
    stay). Computed from the log by grid.fleet.quarantine; `until` is the automatic release."""

    kind: FlapQuarantineKind
    subject: str  # host id or model id
    reason: str
    since: float
    until: float
    # Transitions inside the window when the quarantine began, and how many quarantines in a row
    # (0: the first; the backoff doubles with each).
    transitions: int = 0
    level: int = 0


class PlannerInput(Value, frozen=True, kw_only=True):
    now: float
    profiles: tuple[ModelProfile, ...]
    hosts: tuple[HostView, ...]
    demand: tuple[DemandTarget, ...] = ()
    policy: Policy = Policy()
    timings: tuple[TimingSample, ...] = ()
    # Model ids with a retirement tombstone: target zero, drain managed copies.
    retired: tuple[str, ...] = ()
    # Hosts and models held out of new placement at `now` (flap quarantine), by kind and subject.
    flap_quarantines: tuple[FlapQuarantine, ...] = ()
    # Open load/warm commands, sorted by host and model.
    pending: tuple[PendingPlacement, ...] = ()


PlacementStatus = Literal["existing", "new"]


class Placement(Value, frozen=True, kw_only=True):
    model_id: str
    host_id: str
    runtime: str
    memory_mb: int
    status: PlacementStatus
    score: float = 0.0
    scores: dict[str, float] = {}
    reason: str = ""
    # False for external (unmanaged) residencies that satisfy demand but are never actuated.
    managed: bool = True
    # Device indexes the replica's memory was counted on (VRAM hosts only; UNSET elsewhere,
    # which keeps a RAM host's plan bytes unchanged).
    devices: tuple[int, ...] | UnsetType = UNSET


class Preemption(Value, frozen=True, kw_only=True):
    """Drain and unload `victim_model` on `host_id` so `beneficiary_model` can later be placed."""

    host_id: str
    victim_model: str
    beneficiary_model: str
    reason: str
    memory_mb: int = 0
    # The beneficiary's priority: a preemption drain inherits it when scheduling mutations.
    priority: int = 0
    # Reconciler fence: do not start the drain before this time (minimum residency of a
    # convergence victim); None means immediately.
    not_before: float | None = None


class Shortfall(Value, frozen=True, kw_only=True):
    model_id: str
    wanted: int
    placed: int
    reason: str
    detail: str = ""


class HostVerdict(Value, frozen=True, kw_only=True):
    host_id: str
    eligible: bool
    reason: str = ""
    detail: str = ""


class ModelExplanation(Value, frozen=True, kw_only=True):
    model_id: str
    wanted: int
    evidence: str = ""
    eligible_hosts: tuple[str, ...] = ()
    rejected: tuple[HostVerdict, ...] = ()
    chosen: tuple[Placement, ...] = ()
    shortfall_reason: str = ""
    priority: int = 0
    placed: int = 0
    # Complete counts behind the (bounded) eligible_hosts / rejected lists: hosts rejected by
    # a static check; and, for a model with a shortfall, statically eligible hosts that cannot
    # take one more replica now (HostVerdict.eligible=True in `rejected`), counted over the
    # first max(64, policy.explain_host_limit) eligible hosts by id (``detail`` says when that
    # bound applied).
    eligible_count: int = 0
    rejected_counts: dict[str, int] = {}
    capacity_counts: dict[str, int] = {}
    detail: str = ""


class ModelBasis(Value, frozen=True, kw_only=True):
    """What reconciliation reads of one model's planning, as data: explanations are presentation
    only (and their host lists are bounded by ``Policy.explain_host_limit``)."""

    model_id: str
    # The demand evidence the model was planned on (the explanation's label): orders availability work.
    evidence: str = ""
    # Every host holding a managed copy of the model that is still statically eligible for it:
    # dropping a copy there is a scale-down; elsewhere it moves away from an unfit host.
    eligible_holders: tuple[str, ...] = ()


class PrefetchAdvisory(Value, frozen=True, kw_only=True):
    """A cache-only advisory: fetch and verify `artifact_sha256` on `host_id` for a correlation-only
    prediction that got no serving slot. No model slot, no memory, never a warm."""

    host_id: str
    model_id: str
    artifact_sha256: str
    size_bytes: int
    reason: str
    # Confidence- and pressure-weighted cold-start seconds the transfer would save, per artifact
    # MB (the rank), and the seconds and concurrency it was computed from.
    value_per_mb: float = 0.0
    load_seconds: float = 0.0
    concurrency: float = 0.0
    # Free artifact disk on the host after this plan's placements and this transfer.
    disk_free_after_bytes: int = 0


class CacheEviction(Value, frozen=True, kw_only=True):
    """Delete one unused predictive cache entry (exactly this SHA) from `host_id`."""

    host_id: str
    model_id: str
    artifact_sha256: str
    size_bytes: int
    reason: str
    age_seconds: float = 0.0


class Plan(Value, frozen=True, kw_only=True):
    planner_version: str
    inputs_digest: str
    now: float
    # The complete desired set: a managed residency not listed here is obsolete.
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    shortfalls: tuple[Shortfall, ...] = ()
    explanations: tuple[ModelExplanation, ...] = ()
    # One entry per planned model: the reconciler decides from these, never from `explanations`.
    basis: tuple[ModelBasis, ...] = ()
    # Cache-only advisories (in the order they were chosen) and predictive cache expiries.
    prefetch: tuple[PrefetchAdvisory, ...] = ()
    evictions: tuple[CacheEviction, ...] = ()


_plan_decoder = msgspec.json.Decoder(Plan)


def encode_plan(p: Plan) -> bytes:
    """Deterministic bytes of a plan (grid.events.codec.encode_value)."""
    return encode_value(p)


def decode_plan(data: bytes) -> Plan:
    return _plan_decoder.decode(data)
