"""Per-host gauges of the fleet as the gateway sees it: heartbeat age and memory by residency state.

Read at scrape time from the fleet projection the gateway routes with, so a panel of heartbeat
freshness shows exactly the hosts routing considers, and memory per host needs no scrape of
every agent (agents on borrowed machines are often not reachable by Prometheus). The `host`
label is a host id from a signed heartbeat: one series per host the log knows, never user data.
"""

from __future__ import annotations

from collections.abc import Callable

from grid.events.host import RESIDENCY_STATES
from grid.metrics import GaugeSource, Sample
from grid.projections.fleet import FleetState

# Memory the heartbeat reports outside any residency (processes Grid does not manage).
UNMANAGED = "unmanaged"
MEMORY_STATES: tuple[str, ...] = (*RESIDENCY_STATES, UNMANAGED)


def host_gauges(fleet: Callable[[], FleetState], now: Callable[[], float]) -> list[GaugeSource]:
    """`grid_gateway_host_heartbeat_age_seconds{host}`, `grid_gateway_host_capacity_mb{host}` and
    `grid_gateway_host_memory_mb{host,state}` of the hosts in `fleet()` at `now()`."""

    def heartbeat_age() -> list[Sample]:
        t = now()
        return [((h,), max(0.0, t - r.heartbeat_at)) for h, r in sorted(fleet().hosts.items())
                if r.heartbeat_at is not None]

    def capacity() -> list[Sample]:
        return [((h,), float(r.resources.capacity_mb - r.resources.reserved_mb))
                for h, r in sorted(fleet().hosts.items()) if r.resources is not None]

    def memory() -> list[Sample]:
        out: list[Sample] = []
        for h, r in sorted(fleet().hosts.items()):
            hb = r.heartbeat
            if hb is None:
                continue
            by_state = dict.fromkeys(MEMORY_STATES, 0.0)
            for res in hb.residencies:
                by_state[res.state] = by_state.get(res.state, 0.0) + res.memory_mb
            by_state[UNMANAGED] = float(hb.unmanaged_memory_mb)
            out += [((h, state), mb) for state, mb in by_state.items()]
        return out

    return [
        GaugeSource("grid_gateway_host_heartbeat_age_seconds",
                    "Seconds since the gateway last received each host's heartbeat (stale past the heartbeat "
                    "timeout, 30 s by default: routed nothing).", ("host",), heartbeat_age),
        GaugeSource("grid_gateway_host_capacity_mb", "Memory each host offers Grid (capacity less reserved), MiB.",
                    ("host",), capacity),
        GaugeSource("grid_gateway_host_memory_mb",
                    "Memory each host's latest heartbeat reports, MiB, by residency state (unmanaged: processes "
                    "Grid does not manage).", ("host", "state"), memory),
    ]
