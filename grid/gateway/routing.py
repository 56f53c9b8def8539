"""Pure request routing: HostViews + private measurements + breaker state + now -> a route.

The order of the gates is written once, in `choose`:

1. eligibility (hard): a READY residency with an endpoint, on a host whose effective state is
   accepting, throttled or draining (an evacuating host serves what it holds until the
   reconciler drains it: make-before-break), with a heartbeat that is neither stale nor
   implausibly in the future. Draining residencies and paused, unhealthy or quarantined hosts
   never receive new requests (invariant 4);
   requests already running on them are not touched by this module. A residency must also be
   admitted (`RouteCandidate.unplaced` is None, judged by grid.projections.routes.admission when
   the table is built): a managed one the controller placed and the host confirmed, an external
   one an operator admitted by a signed event. A claim alone attracts nothing.
2. admission (hard): zero advertised capacity is closed; active requests (the proxy-owned
   counter, or the heartbeat's for a route the proxy never used) must stay below the effective
   concurrency
   (a throttled host advertises only its throttle fraction of it); an open circuit is closed.
3. protection class: accepting hosts before throttled ones, evacuating (draining) hosts last.
4. expected completion: the request's service wave (active + queued work over concurrency)
   times a latency estimate blended from this route's confidence/freshness-weighted EWMA
   toward the comparable routes' median (or the prior), with a max_tokens throughput bound.
   Then load fraction, then heartbeat freshness (clamped at zero age), then the engine name.
5. affinity: with a hashed X-Grid-Affinity-Key, rendezvous hashing among routes of the best
   class whose expected completion is within 20% of the best.

No wall clock, no randomness: the same inputs give the same choice. O(replicas) per request
(plus a median over the replicas that have measurements).
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from grid.events.control import ModelProfile
from grid.fleet import FUTURE_SKEW_SECONDS, HEARTBEAT_TIMEOUT_SECONDS, ROUTABLE_HOST_STATES, heartbeat_ahead, heartbeat_fresh
from grid.fleet.views import HostView
from grid.gateway.affinity import rendezvous_pick
from grid.gateway.measure import RouteMeasurement

RouteKey = tuple[str, str, str]  # (host_id, endpoint, model_id)

# Order within the routable host states: a throttled host only takes what accepting ones cannot,
# an evacuating (draining) host only what no admitting host can.
PROTECTION_RANK: dict[str, int] = {"accepting": 0, "throttled": 1, "draining": 2}
assert set(PROTECTION_RANK) == set(ROUTABLE_HOST_STATES)

# Decision reasons
ROUTED = "routed"
REASON_NO_READY = "no_ready_replica"
REASON_AT_CAPACITY = "at_capacity"
REASON_CIRCUIT_OPEN = "circuit_open"
REASON_CLOSED = "zero_capacity"
# Per-candidate exclusion reasons
EXCLUDED_NOT_READY = "residency_not_ready"
EXCLUDED_DRAINING = "residency_draining"
# A managed claim the latest plan does not assign to its host, or no warm ack of that host
# confirms, or with another artifact than the profile's (grid.projections.placed says which);
# or an external one no operator admitted (grid.projections.routes says why).
EXCLUDED_UNPLACED = "unplaced_claim"
EXCLUDED_HOST_FENCED = "host_not_accepting"
EXCLUDED_NO_ENDPOINT = "no_endpoint"
EXCLUDED_NO_HEARTBEAT = "no_heartbeat"
EXCLUDED_STALE = "heartbeat_stale"
EXCLUDED_FUTURE = "heartbeat_in_future"
# NATS said "no responders" for this host's inference subject (its agent is gone): unroutable at
# once, until the host heartbeats again (a heartbeat newer than the one seen when it was marked).
EXCLUDED_NO_RESPONDERS = "no_responders"
# The host's agent stopped answering within the bound its own evidence sets (no first message
# within the connect timeout, or no progress marker for several promised gaps): unroutable at once,
# until it heartbeats again, so a stopped or cut-off agent fails at most the request that found it.
EXCLUDED_SILENT = "agent_silent"

TEXT_WORKLOADS = frozenset({"coding", "research", "marketing", "sales", "design", "general"})
DEFAULT_AUTO_RETRY_SECONDS = 30.0
MAX_AUTO_RETRY_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    heartbeat_timeout_seconds: float = HEARTBEAT_TIMEOUT_SECONDS
    future_skew_seconds: float = FUTURE_SKEW_SECONDS
    affinity_slack: float = 0.20
    default_latency_seconds: float = 1.0


DEFAULT_POLICY = RoutingPolicy()


@dataclass(frozen=True, slots=True)
class RouteCandidate:
    key: RouteKey
    host_id: str
    model_id: str
    endpoint: str | None
    state: str  # residency state
    host_state: str
    heartbeat_at: float | None
    active_requests: int = 0
    max_concurrency: int | None = None
    throttle_fraction: float = 0.5
    queue_depth: int = 0
    artifact_sha256: str | None = None
    loaded_at: float | None = None
    last_used_at: float | None = None
    # Why this claim is not admitted (grid.projections.routes.admission: a managed one the plan
    # does not corroborate, an external one no operator admitted), None when it is.
    unplaced: str | None = None
    # Why the gateway routes this host nothing until its next heartbeat (EXCLUDED_NO_RESPONDERS,
    # EXCLUDED_SILENT), None when it does not.
    unresponsive: str | None = None

    @property
    def engine(self) -> str:
        """Stable engine name used for rendezvous hashing and display."""
        return f"{self.host_id}|{self.endpoint or ''}"


def build_table(
    snapshots: Iterable[HostView], unplaced: Mapping[tuple[str, str], str] | None = None,
    unresponsive: Mapping[str, tuple[float | None, str]] | None = None,
    unadmitted: Mapping[tuple[str, str], str] | None = None,
) -> dict[str, tuple[RouteCandidate, ...]]:
    """Every residency of every host, grouped by model (sorted: deterministic).

    `unplaced` maps (host id, model id) of the managed claims that are not corroborated to the
    reason, `unadmitted` the same for external claims no operator admitted (both from
    grid.projections.routes.unadmitted_claims); those candidates are never eligible.
    `unresponsive` maps a host id to the heartbeat time seen when it was found unresponsive (NATS
    answered "no responders", or its agent went silent) and why: its candidates are not eligible
    until a newer heartbeat (`still_unresponsive`).
    """
    unplaced = unplaced or {}
    unadmitted = unadmitted or {}
    unresponsive = unresponsive or {}
    by_model: dict[str, list[RouteCandidate]] = {}
    for snap in snapshots:
        marked = unresponsive.get(snap.host_id)
        silent = marked[1] if marked is not None and still_unresponsive(marked[0], snap.heartbeat_at) else None
        throttle = snap.resources.throttle_fraction
        queue = snap.load.queue_depth
        for r in snap.residencies:
            c = RouteCandidate(
                key=(snap.host_id, r.endpoint or "", r.model_id),
                host_id=snap.host_id,
                model_id=r.model_id,
                endpoint=r.endpoint,
                state=r.state,
                host_state=snap.state,
                heartbeat_at=snap.heartbeat_at,
                active_requests=max(0, r.active_requests),
                max_concurrency=r.max_concurrency,
                throttle_fraction=throttle,
                queue_depth=max(0, queue),
                artifact_sha256=r.artifact_sha256,
                loaded_at=r.loaded_at,
                last_used_at=r.last_used_at,
                unplaced=(unplaced if r.managed else unadmitted).get((snap.host_id, r.model_id)),
                unresponsive=silent,
            )
            by_model.setdefault(r.model_id, []).append(c)
    return {m: tuple(sorted(cs, key=lambda c: c.key)) for m, cs in sorted(by_model.items())}


def still_unresponsive(marked_heartbeat_at: float | None, heartbeat_at: float | None) -> bool:
    """A host marked unresponsive stays unroutable until a heartbeat newer than the one seen when
    it was marked arrives (its agent is back, subscribed and running again)."""
    if heartbeat_at is None:
        return True
    return marked_heartbeat_at is not None and heartbeat_at <= marked_heartbeat_at


def exclusion(c: RouteCandidate, now: float, policy: RoutingPolicy = DEFAULT_POLICY) -> str | None:
    """Why `c` may not take new requests at `now`, or None when it is eligible."""
    if c.state != "ready":
        return EXCLUDED_DRAINING if c.state == "draining" else EXCLUDED_NOT_READY
    if c.unplaced is not None:
        return EXCLUDED_UNPLACED
    if c.host_state not in ROUTABLE_HOST_STATES:
        return EXCLUDED_HOST_FENCED
    if not c.endpoint:
        return EXCLUDED_NO_ENDPOINT
    if c.unresponsive is not None:
        return c.unresponsive
    if c.heartbeat_at is None:
        return EXCLUDED_NO_HEARTBEAT
    if heartbeat_ahead(c.heartbeat_at, now, policy):
        return EXCLUDED_FUTURE
    if not heartbeat_fresh(c.heartbeat_at, now, policy):
        return EXCLUDED_STALE
    return None


def eligible(candidates: Iterable[RouteCandidate], now: float, policy: RoutingPolicy = DEFAULT_POLICY) -> list[RouteCandidate]:
    return [c for c in candidates if exclusion(c, now, policy) is None]


def ready_models(
    table: Mapping[str, Sequence[RouteCandidate]], now: float, policy: RoutingPolicy = DEFAULT_POLICY
) -> list[str]:
    """Admitted READY model ids (the /v1/models identity list), sorted."""
    return [m for m in sorted(table) if any(exclusion(c, now, policy) is None for c in table[m])]


def effective_concurrency(c: RouteCandidate) -> int | None:
    """None: capacity unknown (conservative raw load). 0: closed."""
    mc = c.max_concurrency
    if mc is None:
        return None
    if mc <= 0:
        return 0
    if c.host_state == "throttled":
        return max(1, int(mc * max(0.0, min(1.0, c.throttle_fraction))))
    return mc


@dataclass(frozen=True, slots=True)
class Scored:
    candidate: RouteCandidate
    rank: int
    expected_seconds: float
    load: float
    age: float
    active: int


@dataclass(frozen=True, slots=True)
class Decision:
    route: RouteCandidate | None
    reason: str
    expected_seconds: float = 0.0
    # How many routes were eligible / admissible (for stats and error messages).
    eligible: int = 0
    admissible: int = 0
    # Routes that were only refused by their circuit (for Retry-After).
    circuit_blocked: tuple[RouteKey, ...] = ()


def _median_without(values: list[float], own: float | None) -> float | None:
    """Median of sorted `values` with one copy of `own` left out (None: leave nothing out)."""
    n = len(values)
    skip = -1
    if own is not None:
        skip = bisect.bisect_left(values, own)
        if skip >= n or values[skip] != own:
            skip = -1
        else:
            n -= 1
    if n <= 0:
        return None

    def at(j: int) -> float:
        return values[j + 1] if 0 <= skip <= j else values[j]

    mid = n // 2
    return at(mid) if n % 2 else 0.5 * (at(mid - 1) + at(mid))


def _own(m: RouteMeasurement | None, c: RouteCandidate, now: float) -> tuple[float, float, float, float]:
    """(latency, latency weight, tokens/s, tokens/s weight) bound to the artifact revision."""
    if m is None or m.artifact_sha256 != c.artifact_sha256:
        return 0.0, 0.0, 0.0, 0.0
    return m.latency.value, m.latency.weight(now), m.tokens_per_second.value, m.tokens_per_second.weight(now)


def choose(
    candidates: Sequence[RouteCandidate],
    *,
    now: float,
    measurements: Mapping[RouteKey, RouteMeasurement] | None = None,
    blocked: Collection[RouteKey] = (),
    proxy_active: Mapping[RouteKey, int] | None = None,
    affinity: bytes | None = None,
    max_tokens: int | None = None,
    prior_latency_seconds: float | None = None,
    policy: RoutingPolicy = DEFAULT_POLICY,
) -> Decision:
    measurements = measurements or {}
    proxy_active = proxy_active or {}
    elig = eligible(candidates, now, policy)
    if not elig:
        return Decision(None, REASON_NO_READY)

    # Evidence for the blend: every eligible route of this model (other models never count).
    own: dict[RouteKey, tuple[float, float, float, float]] = {}
    lat_peers: list[float] = []
    tps_peers: list[float] = []
    for c in elig:
        o = _own(measurements.get(c.key), c, now)
        own[c.key] = o
        if o[1] > 0.0:
            lat_peers.append(o[0])
        if o[3] > 0.0 and o[2] > 0.0:
            tps_peers.append(o[2])
    prior = prior_latency_seconds if prior_latency_seconds and prior_latency_seconds > 0 else policy.default_latency_seconds
    lat_peers.sort()
    tps_peers.sort()
    tokens = max_tokens if max_tokens is not None and 0 < max_tokens <= 10_000_000 else None

    scored: list[Scored] = []
    full = closed = 0
    circuit: list[RouteKey] = []
    for c in elig:
        conc = effective_concurrency(c)
        if conc == 0:
            closed += 1
            continue
        # Proxy-owned counters are authoritative once the proxy has routed to this engine; a
        # heartbeat's count (possibly seconds old) only stands in for routes it never used.
        active = proxy_active[c.key] if c.key in proxy_active else c.active_requests
        if conc is not None and active >= conc:
            full += 1
            continue
        if c.key in blocked:
            circuit.append(c.key)
            continue
        lat, lat_w, tps, tps_w = own[c.key]
        # Weak or missing evidence blends toward the comparable routes' median (this route
        # left out), else toward the prior; expired evidence (weight 0) falls back completely.
        lat_fallback = _median_without(lat_peers, lat if lat_w > 0.0 else None)
        if lat_fallback is None:
            lat_fallback = prior
        per_request = lat_w * lat + (1.0 - lat_w) * lat_fallback
        if tokens is not None:
            tps_fallback = _median_without(tps_peers, tps if (tps_w > 0.0 and tps > 0.0) else None)
            if tps_fallback is not None:
                tps_est = tps_w * tps + (1.0 - tps_w) * tps_fallback
            else:
                tps_est = tps if tps_w > 0.0 else 0.0
            if tps_est > 0.0:
                per_request = max(per_request, tokens / tps_est)
        width = conc if conc is not None else 1
        wave = (active + c.queue_depth) // width + 1
        load = active / conc if conc is not None else float(active)
        hb = c.heartbeat_at if c.heartbeat_at is not None else now
        scored.append(Scored(c, PROTECTION_RANK[c.host_state], wave * per_request, load, max(0.0, now - hb), active))

    if not scored:
        if full:
            return Decision(None, REASON_AT_CAPACITY, eligible=len(elig), circuit_blocked=tuple(circuit))
        if circuit:
            return Decision(None, REASON_CIRCUIT_OPEN, eligible=len(elig), circuit_blocked=tuple(circuit))
        return Decision(None, REASON_CLOSED, eligible=len(elig))

    best_rank = min(s.rank for s in scored)
    tier = [s for s in scored if s.rank == best_rank]
    best = min(tier, key=lambda s: (s.expected_seconds, s.load, s.age, s.candidate.engine))
    if affinity is not None and len(tier) > 1:
        limit = best.expected_seconds * (1.0 + policy.affinity_slack) + 1e-12
        near = [s for s in tier if s.expected_seconds <= limit]
        best = rendezvous_pick(affinity, near, lambda s: s.candidate.engine)
    return Decision(best.candidate, ROUTED, best.expected_seconds, eligible=len(elig), admissible=len(scored))


# --- model "auto" ----------------------------------------------------------------------------


def auto_model(
    workload: str,
    profiles: Mapping[str, ModelProfile],
    ready: Collection[str],
) -> str | None:
    """The best ready model for a workload by profile workload_scores (ties: model id).

    Models scoring the workload come first; a text workload may fall back to a model that
    scores "general". A model without a positive relevant score is never chosen.
    """
    best: tuple[float, float, str] | None = None
    for model_id in sorted(ready):
        profile = profiles.get(model_id)
        if profile is None:
            continue
        scores = profile.workload_scores
        direct = float(scores.get(workload, 0.0))
        general = float(scores.get("general", 0.0)) if workload in TEXT_WORKLOADS else 0.0
        if direct <= 0.0 and general <= 0.0:
            continue
        key = (-direct, -general, model_id) if direct > 0.0 else (1.0, -general, model_id)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def auto_retry_after(workload: str, profiles: Mapping[str, ModelProfile]) -> float:
    """An honest Retry-After for an unavailable workload: the quickest configured cold start."""
    waits = [
        p.load_seconds + p.warm_seconds
        for _, p in sorted(profiles.items())
        if float(p.workload_scores.get(workload, 0.0)) > 0.0
    ]
    if not waits:
        return DEFAULT_AUTO_RETRY_SECONDS
    return max(1.0, min(MAX_AUTO_RETRY_SECONDS, min(waits)))
