"""Hard constraints as a chain of small checks, each returning a named reason (or None).

Nomad's feasible.go habit: every check is a tiny function that either passes (None) or returns
``(REASON, detail)``. The order of the chain is written once, in ``FeasibilityChain.__init__``,
with the reason for the order next to each group.

Three levels of evaluation keep a 4096-host fleet cheap:

* host lifecycle checks depend on one host only and run once per host;
* compatibility and static capacity checks depend only on a host's *class* (its resources,
  lifecycle verdict, throttling, load level and whether it reports disk telemetry) and the
  model's requirements, so they run once per (class, model requirement signature);
* operator policy checks (deny/allow/pins) are per host id and are set lookups.

Dynamic checks (the two memory ledgers, model slots, co-location, the cumulative disk ledger)
look at the evolving ``HostState`` during placement.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from grid.events.control import DATA_TIERS, ModelProfile
from grid.events.host import HostResources
from grid.fleet import ADMITTING_HOST_STATES, heartbeat_ahead, heartbeat_fresh
from grid.fleet import reasons as R
from grid.fleet.planning import Policy
from grid.fleet.views import HostView, raw_allocatable_mb

Rejection = tuple[str, str]  # (REASON, detail)

DEFAULT_RUNTIMES: tuple[str, ...] = ("llama.cpp",)
MB = 1 << 20


def tier_index(tier: str) -> int | None:
    try:
        return DATA_TIERS.index(tier)
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------
# Compiled requirements and host classes
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelReq:
    """A profile compiled for fast checks. ``excludes`` is already made symmetric."""

    model_id: str
    profile: ModelProfile
    runtimes: tuple[str, ...]
    backends: frozenset[str]
    tier: int  # unknown tiers are treated as the most sensitive
    required_tags: frozenset[str]
    forbidden_tags: frozenset[str]
    allow: frozenset[str] | None
    deny: frozenset[str]
    pins: tuple[str, ...]
    max_colocated: int
    excludes: frozenset[str]
    sha: str | None
    disk_bytes: int | None
    compat_key: tuple
    # Hosts with a passing qualification (grid.fleet.qualification); None: none required.
    qualified: frozenset[str] | None = None
    # Devices one replica spans on a VRAM host: the profile's declared GPU count, else one.
    tensor_parallel: int = 1

    @staticmethod
    def compile(profile: ModelProfile, excludes: frozenset[str],
                qualified: frozenset[str] | None = None) -> ModelReq:
        runtimes = tuple(profile.runtimes) or DEFAULT_RUNTIMES
        tier = tier_index(profile.data_tier)
        tier_i = len(DATA_TIERS) - 1 if tier is None else tier
        sha = profile.artifact_sha256.lower() if profile.artifact_sha256 else None
        disk = None
        if profile.artifact_size_mb is not None and profile.artifact_size_mb > 0:
            disk = int(profile.artifact_size_mb) * MB
        backends = frozenset(profile.backends)
        required = frozenset(profile.required_tags)
        forbidden = frozenset(profile.forbidden_tags)
        compat_key = (
            tuple(sorted(set(runtimes))),
            tuple(sorted(backends)),
            tier_i,
            tuple(sorted(required)),
            tuple(sorted(forbidden)),
            int(profile.min_gpu_count),
            int(profile.min_gpu_memory_mb),
            disk is not None,
        )
        return ModelReq(
            model_id=profile.model_id,
            profile=profile,
            runtimes=runtimes,
            backends=backends,
            tier=tier_i,
            required_tags=required,
            forbidden_tags=forbidden,
            allow=frozenset(profile.allow_hosts) if profile.allow_hosts else None,
            deny=frozenset(profile.deny_hosts),
            pins=tuple(sorted(set(profile.pins))),
            max_colocated=max(0, int(profile.max_colocated_models)),
            excludes=excludes,
            sha=sha,
            disk_bytes=disk,
            compat_key=compat_key,
            qualified=qualified,
            tensor_parallel=max(1, int(profile.min_gpu_count)),
        )


@dataclass(slots=True, eq=False)
class Bucket:
    """Hosts of one class that also share load level and throttling: within a bucket every
    scorer except best fit is constant, so the open list sorted by ``(free_b, host_id)`` gives
    the bucket's best candidate as the first feasible entry from ``bisect(memory)``."""

    cls: HostClass
    load_level: int
    throttled: bool
    # Sorted (free_b, host_id, host_idx) of hosts that can still take new work.
    open: list[tuple[int, str, int]] = field(default_factory=list)
    domains: set[str] = field(default_factory=set)


@dataclass(slots=True, eq=False)
class HostClass:
    """Hosts that are indistinguishable to every compatibility check and class-level scorer.

    The key leaves out what only the ledgers or the best-fit scorer need (memory, failure
    domain, model ceiling) and the per-host load/throttle penalties (buckets). Lifecycle
    ineligible hosts form classes of their own, keyed by their lifecycle reason.
    """

    idx: int
    key: tuple
    resources: (
        HostResources  # of the first member (the compatibility fields are shared)
    )
    eligible: bool
    lifecycle_reason: str | None
    hw_score: float
    disk_known: bool
    runtime_set: frozenset[str]
    backend_set: frozenset[str]
    tag_set: frozenset[str]
    tier: int
    hosts: list[int] = field(
        default_factory=list
    )  # host idx, ascending (= host id order)
    caps: list[int] = field(
        default_factory=list
    )  # sorted new-work allocatable memory of members
    buckets: list[Bucket] = field(default_factory=list)
    domains: set[str] = field(default_factory=set)


def new_work_allocatable_mb(res: HostResources, state: str) -> int:
    """A throttled host offers only its throttle fraction of raw allocatable memory."""
    raw = raw_allocatable_mb(res)
    if state == "throttled":
        frac = min(1.0, max(0.0, float(res.throttle_fraction)))
        return int(raw * frac)
    return raw


def load_level(host: HostView) -> int:
    """Host load quantised to five levels (0 idle .. 4 saturated): part of the class key."""
    pressure = max(0, host.load.active_tasks) + 2 * max(0, host.load.queue_depth)
    if pressure <= 0:
        return 0
    if pressure <= 2:
        return 1
    if pressure <= 8:
        return 2
    if pressure <= 32:
        return 3
    return 4


# ------------------------------------------------------------------------------------------
# Host lifecycle checks (host, now, policy)
# ------------------------------------------------------------------------------------------


def check_heartbeat_missing(
    host: HostView, now: float, policy: Policy
) -> Rejection | None:
    if host.heartbeat_at is None or not math.isfinite(host.heartbeat_at):
        return (R.HEARTBEAT_MISSING, "registered but never heard from")
    return None


def check_host_state(
    host: HostView, now: float, policy: Policy
) -> Rejection | None:
    if host.state not in ADMITTING_HOST_STATES:
        return (R.HOST_NOT_ELIGIBLE_STATE, host.state)
    return None


def check_heartbeat_stale(
    host: HostView, now: float, policy: Policy
) -> Rejection | None:
    assert host.heartbeat_at is not None
    if not heartbeat_fresh(host.heartbeat_at, now, policy):
        age = now - host.heartbeat_at
        return (
            R.HEARTBEAT_STALE,
            f"age {age:.1f}s > {policy.heartbeat_timeout_seconds:g}s",
        )
    return None


def check_heartbeat_future(
    host: HostView, now: float, policy: Policy
) -> Rejection | None:
    assert host.heartbeat_at is not None
    if heartbeat_ahead(host.heartbeat_at, now, policy):
        ahead = host.heartbeat_at - now
        return (
            R.HEARTBEAT_FUTURE,
            f"{ahead:.1f}s ahead > {policy.future_skew_seconds:g}s skew",
        )
    return None


# ------------------------------------------------------------------------------------------
# Operator placement policy (host id, model)
# ------------------------------------------------------------------------------------------


def check_denied(host_id: str, req: ModelReq) -> Rejection | None:
    if host_id in req.deny:
        return (R.DENIED, "host in deny list")
    return None


def check_allowed(host_id: str, req: ModelReq) -> Rejection | None:
    if req.allow is not None and host_id not in req.allow:
        return (R.NOT_ALLOWED, "host not in allow list")
    return None


def check_pinned(host_id: str, req: ModelReq) -> Rejection | None:
    if req.pins and host_id not in req.pins:
        return (R.PIN_MISMATCH, "model pinned to " + ",".join(req.pins))
    return None


def check_qualified(host_id: str, req: ModelReq) -> Rejection | None:
    if req.qualified is not None and host_id not in req.qualified:
        return (R.NOT_QUALIFIED, "no passing qualification of " + "/".join(req.runtimes) + " for this model")
    return None


# ------------------------------------------------------------------------------------------
# Compatibility (host class, model)
# ------------------------------------------------------------------------------------------


def check_data_tier(cls: HostClass, req: ModelReq) -> Rejection | None:
    if cls.tier < req.tier:
        return (
            R.DATA_TIER,
            f"host tier {cls.resources.data_tier} < model tier {req.profile.data_tier}",
        )
    return None


def matching_runtimes(cls: HostClass, req: ModelReq) -> tuple[str, ...]:
    return tuple(rt for rt in req.runtimes if rt in cls.runtime_set)


def check_runtime(cls: HostClass, req: ModelReq) -> Rejection | None:
    if not matching_runtimes(cls, req):
        return (R.RUNTIME_MISMATCH, "needs " + ",".join(req.runtimes))
    return None


def check_backend(cls: HostClass, req: ModelReq) -> Rejection | None:
    if req.backends and not (req.backends & cls.backend_set):
        return (R.BACKEND_MISMATCH, "needs " + ",".join(sorted(req.backends)))
    return None


def check_required_tags(cls: HostClass, req: ModelReq) -> Rejection | None:
    missing = req.required_tags - cls.tag_set
    if missing:
        return (R.MISSING_REQUIRED_TAG, ",".join(sorted(missing)))
    return None


def check_forbidden_tags(cls: HostClass, req: ModelReq) -> Rejection | None:
    bad = req.forbidden_tags & cls.tag_set
    if bad:
        return (R.FORBIDDEN_TAG, ",".join(sorted(bad)))
    return None


def check_gpu_count(cls: HostClass, req: ModelReq) -> Rejection | None:
    if cls.resources.gpu_count < req.profile.min_gpu_count:
        return (R.GPU_COUNT, f"{cls.resources.gpu_count} < {req.profile.min_gpu_count}")
    return None


def check_gpu_memory(cls: HostClass, req: ModelReq) -> Rejection | None:
    if cls.resources.gpu_memory_mb < req.profile.min_gpu_memory_mb:
        return (
            R.GPU_MEMORY,
            f"{cls.resources.gpu_memory_mb} < {req.profile.min_gpu_memory_mb} MB",
        )
    return None


# ------------------------------------------------------------------------------------------
# Static capacity (host class, model)
# ------------------------------------------------------------------------------------------


def runtime_memory(req: ModelReq, runtimes: tuple[str, ...]) -> tuple[str, int] | None:
    """Runtime and memory for a placement among the host's matching runtimes.

    Memory is the *largest* matching estimate (profile.runtime_memory_mb, else memory_mb): the
    engine that finally runs is the agent's choice, so admission is conservative. The runtime
    reported is the one with that estimate (ties: the name that sorts first).
    """
    if not runtimes:
        return None
    rm = req.profile.runtime_memory_mb
    best: tuple[int, str] | None = None
    for rt in runtimes:
        mem = max(0, int(rm.get(rt, req.profile.memory_mb)))
        if best is None or mem > best[0] or (mem == best[0] and rt < best[1]):
            best = (mem, rt)
    assert best is not None
    return best[1], best[0]


def check_static_memory(
    cls: HostClass, cap_new: int, mem: int, req: ModelReq, cached: bool
) -> Rejection | None:
    """The largest matching runtime estimate can never fit this host's new-work memory."""
    if mem > cap_new:
        return (
            R.INSUFFICIENT_MEMORY,
            f"needs {mem} MB, host offers {cap_new} MB for new work",
        )
    return None


def check_disk_telemetry(
    cls: HostClass, cap_new: int, mem: int, req: ModelReq, cached: bool
) -> Rejection | None:
    """An uncached artifact that declares a size needs a free-disk observation."""
    if not cached and req.disk_bytes is not None and not cls.disk_known:
        return (R.INSUFFICIENT_DISK, "no disk telemetry for an uncached artifact")
    return None


# ------------------------------------------------------------------------------------------
# Dynamic checks (evolving host state during placement). ``hs`` is a planner.state.HostState.
# ------------------------------------------------------------------------------------------


def check_flap_quarantine(
    hs, req: ModelReq, mem: int, disk: int, headroom: float
) -> Rejection | None:
    if hs.flap_quarantined:
        return (R.FLAP_QUARANTINE, "host lifecycle flaps")
    if req.model_id in hs.held_models:
        return (R.FLAP_QUARANTINE, "model lifecycle flaps")
    return None


def check_present(
    hs, req: ModelReq, mem: int, disk: int, headroom: float
) -> Rejection | None:
    if req.model_id in hs.desired or req.model_id in hs.live_models:
        return (R.ALREADY_PRESENT, "model already resident, leaving or reserved here")
    return None


def check_model_limit(
    hs, req: ModelReq, mem: int, disk: int, headroom: float
) -> Rejection | None:
    if hs.limit and hs.present_n + 1 > hs.limit:
        return (R.MODEL_LIMIT, f"{hs.present_n} of {hs.limit} model slots used")
    return None


def check_colocation_limit(
    hs, req: ModelReq, mem: int, disk: int, headroom: float
) -> Rejection | None:
    n = hs.present_n + 1
    if req.max_colocated and n > req.max_colocated:
        return (
            R.COLOCATION_LIMIT,
            f"model allows {req.max_colocated} co-located, host would have {n}",
        )
    if hs.col_min and n > hs.col_min:
        return (R.COLOCATION_LIMIT, f"a resident model allows {hs.col_min} co-located")
    return None


def check_colocation_excluded(
    hs, req: ModelReq, mem: int, disk: int, headroom: float
) -> Rejection | None:
    if hs.excl_counts.get(req.model_id, 0) > 0:
        return (R.COLOCATION_EXCLUDED, "excluded pairing with a resident model")
    return None


def check_desired_memory(
    hs, req: ModelReq, mem: int, disk: int, headroom: float
) -> Rejection | None:
    if hs.free_b < mem:
        return (
            R.INSUFFICIENT_MEMORY,
            f"desired footprint: {hs.free_b} MB free < {mem} MB",
        )
    return None


def check_live_memory(
    hs, req: ModelReq, mem: int, disk: int, headroom: float
) -> Rejection | None:
    need = mem * (1.0 + headroom)
    if hs.free_a < need:
        return (
            R.INSUFFICIENT_MEMORY,
            f"live processes: {hs.free_a} MB free < {need:.0f} MB with headroom",
        )
    return None


def check_device_memory(
    hs, req: ModelReq, mem: int, disk: int, headroom: float
) -> Rejection | None:
    """On a VRAM host the weights must fit one device (or the declared tensor-parallel set),
    not only the host's sum of device memory."""
    dev = hs.dev
    if dev is None or dev.fits(mem, req.tensor_parallel, headroom):
        return None
    # Cheap to build: candidate scans reject many hosts this way and never read the detail.
    return (R.INSUFFICIENT_MEMORY, f"no {req.tensor_parallel} device(s) with {mem} MB / {req.tensor_parallel} free")


def check_disk(
    hs, req: ModelReq, mem: int, disk: int, headroom: float
) -> Rejection | None:
    if disk <= 0:
        return None
    if hs.disk_budget is None:
        return (R.INSUFFICIENT_DISK, "no disk telemetry for an uncached artifact")
    if hs.disk_used + disk > hs.disk_budget:
        free = max(0, hs.disk_budget - hs.disk_used)
        return (
            R.INSUFFICIENT_DISK,
            f"artifact {disk // MB} MB > {free // MB} MB free after reserve",
        )
    return None


HostCheck = Callable[[HostView, float, Policy], "Rejection | None"]
PolicyCheck = Callable[[str, ModelReq], "Rejection | None"]
ClassCheck = Callable[[HostClass, ModelReq], "Rejection | None"]
CapacityCheck = Callable[[HostClass, int, int, ModelReq, bool], "Rejection | None"]
DynamicCheck = Callable[..., "Rejection | None"]


class FeasibilityChain:
    """The one place the order of the checks is written down."""

    def __init__(self) -> None:
        # 1. Host lifecycle first: a host that gets nothing new should report *that*, not a
        #    model-specific mismatch. Missing heartbeat before the state (we know nothing
        #    else), state before freshness (an operator's pause is the more useful reason).
        self.lifecycle: tuple[HostCheck, ...] = (
            check_heartbeat_missing,
            check_host_state,
            check_heartbeat_stale,
            check_heartbeat_future,
        )
        # 2. Operator placement policy next: explicit deny beats allow, allow beats pins, pins
        #    beat a required qualification, and all four are exact statements that explain a
        #    rejection better than hardware.
        self.policy: tuple[PolicyCheck, ...] = (
            check_denied,
            check_allowed,
            check_pinned,
            check_qualified,
        )
        # 3. Compatibility: data tier first (a safety boundary), then runtime/backend (the
        #    model cannot run at all), then tags, then GPU shape.
        self.compat: tuple[ClassCheck, ...] = (
            check_data_tier,
            check_runtime,
            check_backend,
            check_required_tags,
            check_forbidden_tags,
            check_gpu_count,
            check_gpu_memory,
        )
        # 4. Static capacity last among static checks: it needs the matched runtime's memory,
        #    and "never fits" is only meaningful once the host could run the model at all.
        self.static_capacity: tuple[CapacityCheck, ...] = (
            check_static_memory,
            check_disk_telemetry,
        )
        # 5. Dynamic checks against the evolving plan: presence (one replica per model per
        #    host) first because it is exact, then model slots and co-location (the host's
        #    shape), then the desired-footprint ledger, the live make-before-break ledger with
        #    admission headroom, and finally the cumulative artifact-disk ledger.
        #    Flap quarantine comes right after presence: it holds back every new replica,
        #    whatever fits.
        self.dynamic: tuple[DynamicCheck, ...] = (
            check_present,
            check_flap_quarantine,
            check_model_limit,
            check_colocation_limit,
            check_colocation_excluded,
            check_desired_memory,
            check_live_memory,
            check_device_memory,
            check_disk,
        )

    def host_lifecycle(
        self, host: HostView, now: float, policy: Policy
    ) -> Rejection | None:
        for check in self.lifecycle:
            r = check(host, now, policy)
            if r is not None:
                return r
        return None

    def host_policy(self, host_id: str, req: ModelReq) -> Rejection | None:
        for check in self.policy:
            r = check(host_id, req)
            if r is not None:
                return r
        return None

    def class_compat(self, cls: HostClass, req: ModelReq) -> Rejection | None:
        for check in self.compat:
            r = check(cls, req)
            if r is not None:
                return r
        return None

    def class_disk(self, cls: HostClass, req: ModelReq) -> Rejection | None:
        """The class-level part of static capacity (uncached hosts): disk telemetry."""
        return check_disk_telemetry(cls, 0, 0, req, False)

    def host_capacity(
        self, cls: HostClass, cap_new: int, mem: int, req: ModelReq, cached: bool
    ) -> Rejection | None:
        for check in self.static_capacity:
            r = check(cls, cap_new, mem, req, cached)
            if r is not None:
                return r
        return None

    def dynamic_check(
        self, hs, req: ModelReq, mem: int, disk: int, headroom: float
    ) -> Rejection | None:
        for check in self.dynamic:
            r = check(hs, req, mem, disk, headroom)
            if r is not None:
                return r
        return None


CHAIN = FeasibilityChain()


def artifact_cached(host: HostView, req: ModelReq) -> bool:
    """Exact cached weights: sha match, or model id match when the profile has no sha."""
    if req.sha is not None:
        for art in host.cached:
            if art.sha256.lower() == req.sha:
                return True
        for r in host.residencies:
            if (
                r.model_id == req.model_id
                and r.artifact_sha256
                and r.artifact_sha256.lower() == req.sha
            ):
                return True
        return False
    for art in host.cached:
        if art.model_id == req.model_id:
            return True
    for r in host.residencies:
        if r.model_id == req.model_id and r.state != "failed":
            return True
    return False
