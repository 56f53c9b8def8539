"""Route admission: which residencies may take traffic, count as supply, or prove a replacement.

One pure function, `admission`, answers for every residency, managed or external, and every
reader goes through it, so they cannot disagree:

- the gateway's routing table (grid.gateway.state builds it from `unadmitted_claims`),
- the planner's supply and the forecast's ready count (grid.controller.inputs builds the
  planner input's hosts with `supply_view`), and
- the reconciler's proof that a replacement is ready (it reads the same planner input's hosts).

A managed residency is admitted by the placed rule (grid.projections.placed.verdict: the
latest plan assigns it, the host's warm ack confirms it, the controller's plan recorded the
pair as corroborated, its artifact is the profile's) when the reader holds those facts (the
gateway and status); the controller, which writes them, counts a managed copy it commanded
(grid.projections.placed.without_uncommanded) as before.

An external residency (`managed=False`, an engine Grid did not start) is admitted only by an
operator fact: a signed `RouteAdmitted` on the control stream (hosts may not write there, so a
host's own claim or a host-signed copy that landed there is rejected before any fold) naming
its host, model, kind and endpoint fingerprint, not withdrawn since, and only while every
profile constraint holds for that host (allowed/denied hosts, pins, qualification, data tier,
required/forbidden tags). A residency no one admitted is never routed, never supply, never
proof of a replacement, and is listed as an unadmitted claim with its reason.

The admissions fold (`apply`) keeps the latest admission per (host, model), bounded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

import msgspec

from grid.events.base import Event
from grid.events.control import DATA_TIERS, ModelProfile, RouteAdmitted, RouteWithdrawn
from grid.fleet import CLAIM_STATES, PROCESS_STATES, FreshnessPolicy, heartbeat_fresh
from grid.fleet.qualification import host_qualifies
from grid.fleet.views import HostView, ResidencyView
from grid.projections import placed as placed_proj
from grid.projections.placed import PlacedState, UnplacedClaim, pair_key
from grid.projections.position import Position

# Admissions kept (one per (host, model)); the oldest dropped first past it: a bound, not a policy.
MAX_ROUTES = 65_536

# Why an external residency gets no route (the `reason` of its unadmitted claim).
REASON_NOT_ADMITTED = "route_not_admitted"
REASON_KIND_MISMATCH = "route_kind_mismatch"
REASON_ENDPOINT_MISMATCH = "route_endpoint_mismatch"
# Profile constraints, applied to external routes as the planner applies them to placements.
REASON_HOST_DENIED = "host_denied"
REASON_HOST_NOT_ALLOWED = "host_not_allowed"
REASON_HOST_NOT_PINNED = "host_not_pinned"
REASON_NOT_QUALIFIED = "host_not_qualified"
REASON_DATA_TIER = "data_tier"
REASON_MISSING_TAG = "missing_required_tag"
REASON_FORBIDDEN_TAG = "forbidden_tag"

ROUTE_REASONS: tuple[str, ...] = (
    REASON_NOT_ADMITTED, REASON_KIND_MISMATCH, REASON_ENDPOINT_MISMATCH, REASON_HOST_DENIED,
    REASON_HOST_NOT_ALLOWED, REASON_HOST_NOT_PINNED, REASON_NOT_QUALIFIED, REASON_DATA_TIER,
    REASON_MISSING_TAG, REASON_FORBIDDEN_TAG,
)


# --- the endpoint fingerprint --------------------------------------------------------------------


def normalise_url(url: str) -> str:
    """An engine's base URL as one string: scheme and host lower-cased, no query, fragment or
    trailing slash, no trailing /v1 (grid.agent.external.base_url gives the same for what it
    accepts). Credentials in the URL are dropped (they are never part of the fingerprint)."""
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme.lower(), netloc, path.rstrip("/"), "", ""))


def url_fingerprint(url: str) -> str:
    """sha256 hex of the normalised base URL: what an admission names (never the URL's key)."""
    return hashlib.sha256(normalise_url(url).encode("utf-8")).hexdigest()


# --- the admissions fold -------------------------------------------------------------------------


class RouteRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One admitted external route, as its signed RouteAdmitted said."""

    host_id: str
    model_id: str
    kind: str
    url_fingerprint: str
    seq: int
    admitted_at: float
    reason: str = ""


class RoutesState(msgspec.Struct, frozen=True, kw_only=True):
    # pair_key(host, model) -> the standing admission.
    admitted: dict[str, RouteRecord] = {}


def initial() -> RoutesState:
    return RoutesState()


def apply(state: RoutesState, event: Event, position: Position) -> RoutesState:
    match event:
        case RouteAdmitted():
            key = pair_key(event.host_id, event.model_id)
            admitted = dict(state.admitted)
            admitted[key] = RouteRecord(host_id=event.host_id, model_id=event.model_id, kind=event.kind,
                                        url_fingerprint=event.url_fingerprint, seq=position.seq,
                                        admitted_at=position.time, reason=event.reason)
            if len(admitted) > MAX_ROUTES:
                del admitted[min(admitted.items(), key=lambda kv: (kv[1].seq, kv[0]))[0]]
            return msgspec.structs.replace(state, admitted=admitted)
        case RouteWithdrawn():
            key = pair_key(event.host_id, event.model_id)
            if key not in state.admitted:
                return state
            return msgspec.structs.replace(state, admitted={k: v for k, v in state.admitted.items() if k != key})
    return state


def admitted_route(state: RoutesState, host_id: str, model_id: str) -> RouteRecord | None:
    return state.admitted.get(pair_key(host_id, model_id))


# --- the rule -------------------------------------------------------------------------------------


def _tier(tier: str) -> int:
    try:
        return DATA_TIERS.index(tier)
    except ValueError:
        return len(DATA_TIERS) - 1  # an unknown tier is treated as the most sensitive


def profile_refusal(profile: ModelProfile | None, host_id: str, host: HostView | None = None) -> str | None:
    """Which profile constraint forbids `host_id` serving the profile's model (None: none does).

    Host-id constraints need only the id; qualification, data tier and tags are judged on the
    host's view when there is one (the readers of `admission` always pass it)."""
    if profile is None:
        return None
    if host_id in profile.deny_hosts:
        return REASON_HOST_DENIED
    if profile.allow_hosts and host_id not in profile.allow_hosts:
        return REASON_HOST_NOT_ALLOWED
    if profile.pins and host_id not in profile.pins:
        return REASON_HOST_NOT_PINNED
    if host is None:
        return None
    if profile.require_qualified and not host_qualifies(host, profile):
        return REASON_NOT_QUALIFIED
    if _tier(host.resources.data_tier) < _tier(profile.data_tier):
        return REASON_DATA_TIER
    tags = frozenset(host.resources.tags)
    if frozenset(profile.required_tags) - tags:
        return REASON_MISSING_TAG
    if frozenset(profile.forbidden_tags) & tags:
        return REASON_FORBIDDEN_TAG
    return None


def admission(host_id: str, residency: ResidencyView, *, routes: RoutesState, profile: ModelProfile | None,
              host: HostView | None = None, placed: PlacedState | None = None) -> str | None:
    """Why `residency` on `host_id` may not take traffic, count as supply or prove a replacement
    (None: it may). The one rule for every reader (see the module docstring).

    Managed: the placed rule, judged when `placed` is given. External: the standing operator
    admission of exactly this host, model, kind and endpoint, and every profile constraint."""
    if residency.managed:
        if placed is None:
            return None
        return placed_proj.verdict(placed, host_id, residency, profile.artifact_sha256 if profile else None)
    record = admitted_route(routes, host_id, residency.model_id)
    if record is None:
        return REASON_NOT_ADMITTED
    if record.kind != residency.runtime:
        return REASON_KIND_MISMATCH
    if not residency.endpoint or url_fingerprint(residency.endpoint) != record.url_fingerprint:
        return REASON_ENDPOINT_MISMATCH
    return profile_refusal(profile, host_id, host)


def unadmitted_claims(snapshots: Iterable[HostView], *, routes: RoutesState, profiles: Mapping[str, ModelProfile],
                      placed: PlacedState | None, now: float | None = None,
                      policy: FreshnessPolicy | None = None) -> list[UnplacedClaim]:
    """Every ready or warming claim, managed or external, that `admission` refuses, sorted by
    host, model and state. Managed claims are judged only with `placed` (None: only external).

    With `now` and `policy`, only hosts whose heartbeat is fresh claim anything."""
    out: list[UnplacedClaim] = []
    for snap in snapshots:
        if now is not None and policy is not None and not heartbeat_fresh(snap.heartbeat_at, now, policy):
            continue
        for r in snap.residencies:
            if r.state not in CLAIM_STATES or (r.managed and placed is None):
                continue
            why = admission(snap.host_id, r, routes=routes, profile=profiles.get(r.model_id), host=snap,
                            placed=placed)
            if why is not None:
                out.append(UnplacedClaim(host_id=snap.host_id, model_id=r.model_id, state=r.state, reason=why,
                                         artifact_sha256=r.artifact_sha256, managed=r.managed))
    out.sort(key=lambda c: (c.host_id, c.model_id, c.state, c.managed))
    return out


def supply_view(snapshot: HostView, *, routes: RoutesState, profiles: Mapping[str, ModelProfile]) -> HostView:
    """The host as the planner, the forecast and the reconciler may count it: an external
    residency `admission` refuses is a claim, not supply (nor proof that a replacement serves).
    Its memory still counts as used (the host says it is), as memory Grid does not manage."""
    keep: list[ResidencyView] = []
    claimed_mb = 0
    dropped = False
    for r in snapshot.residencies:
        if not r.managed and admission(snapshot.host_id, r, routes=routes, profile=profiles.get(r.model_id),
                                       host=snapshot) is not None:
            dropped = True
            if r.state in PROCESS_STATES:
                claimed_mb += max(0, int(r.memory_mb))
        else:
            keep.append(r)
    if not dropped:
        return snapshot
    return msgspec.structs.replace(snapshot, residencies=tuple(keep),
                                   unmanaged_memory_mb=snapshot.unmanaged_memory_mb + claimed_mb)
