"""The typed observation a tick reads, the planner's input built from it, and the fleet facts the
forecast needs (pure).

grid.controller.tick composes these into a tick; the controller and replay both go through it,
so a recorded plan's input can be rebuilt byte for byte. Without a forecast, demand is the
baseline (each profile's min_replicas).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from grid.demand.fold import DemandState
from grid.events.control import ModelProfile
from grid.fleet import AUTHORITATIVE_SAMPLES, FreshnessPolicy, heartbeat_fresh
from grid.fleet.planning import (
    DemandTarget,
    FlapQuarantine,
    PendingPlacement,
    PlannerInput,
    Policy,
    TimingSample,
)
from grid.fleet.views import HostView
from grid.projections import catalog as catalog_proj
from grid.fleet import quarantine as quarantine_mod
from grid.projections import fleet as fleet_proj
from grid.projections import lifecycle as lifecycle_proj
from grid.projections import placed as placed_proj
from grid.projections import routes as routes_proj
from grid.projections import throughput as throughput_proj
from grid.projections.actions import ActionsState


def baseline_demand(profiles: tuple[ModelProfile, ...]) -> tuple[DemandTarget, ...]:
    return tuple(
        DemandTarget(model_id=p.model_id, replicas=p.min_replicas, evidence="baseline", reason="min_replicas")
        for p in profiles
        if p.min_replicas > 0
    )


def timing_samples(actions: ActionsState) -> tuple[TimingSample, ...]:
    """Learned per host/model/artifact load and warm seconds (cold fetch preferred for load)."""
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for key in sorted(actions.timings):
        t = actions.timings[key]
        if not math.isfinite(t.ewma_seconds):
            continue
        k = (t.host_id, t.model_id, t.artifact_sha256 or "")
        slot = merged.setdefault(k, {"samples": 0})
        if t.kind == "warm":
            slot["warm"] = t.ewma_seconds
        elif t.kind == "load_fetch" or "load" not in slot:
            slot["load"] = t.ewma_seconds
        slot["samples"] = max(slot["samples"], t.samples)
    return tuple(
        TimingSample(
            host_id=h, model_id=m, artifact_sha256=sha or None,
            load_seconds=v.get("load"), warm_seconds=v.get("warm"), samples=v["samples"],
        )
        for (h, m, sha), v in sorted(merged.items())
        if v["samples"] >= 1
    )


def pending_placements(actions: ActionsState) -> tuple[PendingPlacement, ...]:
    """Replicas already commanded: an open (not finished, not withdrawn) load or warm per host and
    model. A plan that moved them to an equal host would withdraw them and start over there."""
    pairs = {
        (r.command.host_id, r.command.model_id)
        for r in actions.actions.values()
        if r.command.kind in ("load", "warm") and r.terminal_at is None and not r.withdrawn
    }
    return tuple(PendingPlacement(host_id=h, model_id=m) for h, m in sorted(pairs))


def authoritative(sample: TimingSample) -> bool:
    return sample.samples >= AUTHORITATIVE_SAMPLES


def with_measured_throughput(
    hosts: tuple[HostView, ...], measured: Mapping[str, Mapping[str, float]]
) -> tuple[HostView, ...]:
    """Each host's measured tokens/s per model, from the gateway's measurements only.

    The map is replaced, never merged: measured performance is proxy-owned, so nothing a host
    reports can stand in for it.
    """
    return tuple(
        h if not (h.measured_tokens_per_second or measured.get(h.host_id))
        else msgspec.structs.replace(h, measured_tokens_per_second=dict(measured.get(h.host_id, {})))
        for h in hosts
    )


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """The projection states one tick reads, typed (the tick's observe step). The optional ones
    are absent where a caller runs without them (a plain projection runner, some tests)."""

    catalog: catalog_proj.CatalogState
    fleet: fleet_proj.FleetState
    actions: ActionsState
    # Which replicas the controller commanded and its hosts confirmed.
    placed: placed_proj.PlacedState | None = None
    # Request demand (the forecast's input); None: plan for the baseline.
    demand: DemandState | None = None
    # The gateway's measured tokens/s per host and model.
    throughput: throughput_proj.ThroughputState | None = None
    # When hosts' and models' lifecycles changed (flap quarantine); None: nothing is quarantined.
    lifecycle: lifecycle_proj.LifecycleState | None = None


def observe(states: Mapping[str, Any] | Observation) -> Observation:
    """The typed view of a projection runner's states (an `Observation` is returned as is)."""
    if isinstance(states, Observation):
        return states
    return Observation(
        catalog=states["catalog"], fleet=states["fleet"], actions=states["actions"],
        placed=states.get("placed"), demand=states.get("demand"), throughput=states.get("throughput"),
        lifecycle=states.get("lifecycle"),
    )


def build_planner_input(
    states: Mapping[str, Any] | Observation,
    now: float,
    *,
    demand: tuple[DemandTarget, ...] | None = None,
    policy: Policy = Policy(),
) -> PlannerInput:
    obs = observe(states)
    profiles = catalog_proj.sorted_profiles(obs.catalog)
    hosts = fleet_proj.snapshots(obs.fleet, now)
    if obs.placed is not None:
        # A heartbeat's claim of a replica nobody commanded there is no incumbent: counted as
        # one, a hostile host could make the plan drop an honest replica for its fake.
        hosts = tuple(placed_proj.without_uncommanded(h, obs.placed) for h in hosts)
    # An external engine no operator admitted (grid.projections.routes.admission, the gateway's
    # own rule) is no supply either, and so never the reconciler's proof that a replacement is
    # ready: the planner input's hosts are what both of them read.
    routes = obs.catalog.routes
    by_model = obs.catalog.profiles
    hosts = tuple(routes_proj.supply_view(h, routes=routes, profiles=by_model) for h in hosts)
    if obs.throughput is not None:
        hosts = with_measured_throughput(hosts, throughput_proj.measured(obs.throughput, profiles, now))
    return PlannerInput(
        now=now,
        profiles=profiles,
        hosts=hosts,
        demand=baseline_demand(profiles) if demand is None else demand,
        policy=policy,
        timings=timing_samples(obs.actions),
        retired=tuple(sorted(obs.catalog.retired)),
        flap_quarantines=flap_quarantines(obs.lifecycle, now, policy),
        pending=pending_placements(obs.actions),
    )


def flap_quarantines(
    lifecycle: lifecycle_proj.LifecycleState | None, now: float, policy: Policy
) -> tuple[FlapQuarantine, ...]:
    """Hosts and models whose flapping lifecycle holds them out of new placement at `now`."""
    if lifecycle is None:
        return ()
    return quarantine_mod.quarantines(lifecycle_proj.host_transitions(lifecycle),
                                      lifecycle_proj.model_transitions(lifecycle), now, policy)


def ready_replicas(hosts: Sequence[HostView], now: float, policy: FreshnessPolicy) -> dict[str, int]:
    """Ready replicas per model on hosts whose heartbeat is fresh at `now` (the forecast's supply)."""
    ready: dict[str, int] = {}
    for h in hosts:
        if not heartbeat_fresh(h.heartbeat_at, now, policy):
            continue
        for r in h.residencies:
            if r.state == "ready":
                ready[r.model_id] = ready.get(r.model_id, 0) + 1
    return ready
