"""The flapping-host scenario: one machine goes down and comes back again and again.

The day's single node outage is replaced by a series on the same machine: down for
`down_minutes`, up for `up_minutes`, over the middle half of the day. Every return looks like
free capacity; without flap quarantine the planner fills it and the next outage kills what it
started. `compare` runs smart with the controller's policy (quarantine on) and with quarantine
off over the same trace and reports, for each: starts on the flapping machine, replicas it
lost to its outages, the run's flaps and churn, served demand and safety violations.

`transition_peaks` measures the evidence the defaults are chosen from: the most lifecycle
transitions any host had within the quarantine window, on an ordinary day and on this one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import msgspec

from grid.events.base import Event
from grid.events.commands import CommandIssued
from grid.events.host import HostHeartbeat
from grid.fleet.planning import Policy
from grid.projections import lifecycle as lifecycle_proj
from grid.projections.position import Position
from grid.sim import strategies
from grid.sim.fleet import MachineSpec
from grid.sim.run import run
from grid.sim.scenario import Scenario
from grid.sim.workday import OUTAGE, Incident, Workday

DOWN_MINUTES = 2
UP_MINUTES = 4
# FlapQuarantine off: the same policy with both thresholds at 0 (grid.fleet.quarantine: never).
QUARANTINE_OFF = Policy(flap_host_transitions=0, flap_model_transitions=0)


def flapping_host(fleet: tuple[MachineSpec, ...]) -> str | None:
    """The machine that flaps: the fleet's largest (ties: the first by id), the one placement
    likes best, so its flapping costs the most; None on a one-machine fleet."""
    if len(fleet) < 2:
        return None
    return min(fleet, key=lambda m: (-m.memory_mb, m.host_id)).host_id


def flapping_day(day: Workday, host_id: str, *, down_minutes: int = DOWN_MINUTES,
                 up_minutes: int = UP_MINUTES) -> Workday:
    """`day` with the machine's outages replaced by a down/up series over the middle half."""
    start, end = day.minutes // 4, (3 * day.minutes) // 4
    series = []
    m = start
    while m < end:
        series.append(Incident(OUTAGE, host_id, m, min(end, m + down_minutes)))
        m += down_minutes + up_minutes
    kept = tuple(i for i in day.incidents if not (i.kind == OUTAGE and i.host_id == host_id))
    return dataclasses.replace(day, incidents=kept + tuple(series))


def flapping_scenario(sc: Scenario, **kw: int) -> tuple[Scenario, str]:
    host = flapping_host(sc.fleet)
    if host is None:
        raise ValueError("a flapping host needs a fleet of at least two machines")
    return dataclasses.replace(sc, day=flapping_day(sc.day, host, **kw)), host


class Figures(msgspec.Struct, frozen=True, kw_only=True):
    quarantine: bool
    # Warm commands issued to the flapping machine, and how many of those replicas its outages killed.
    starts_on_flapping_host: int
    replicas_lost: int
    flaps: int
    churn: int
    served_demand: float
    least_workload_service: float
    safety_violations: int
    # Minutes the flapping machine spent quarantined (plan inputs that held it out).
    quarantined_minutes: int


@dataclass(slots=True)
class _Watch:
    host: str
    starts: int = 0
    quarantined_minutes: int = 0


def measure(sc: Scenario, host: str, policy: Policy, *, strategy: str = strategies.SMART) -> Figures:
    """One run of `sc` under `policy`, with what the flapping machine `host` went through."""
    watch = _Watch(host)
    lost = 0
    up: set[str] = set()

    def on_event(stream: str, event: Event) -> None:
        if isinstance(event, CommandIssued) and event.host_id == host and event.kind == "warm":
            watch.starts += 1
        if isinstance(event, HostHeartbeat) and event.host_id == host:
            up.clear()
            up.update(r.model_id for r in event.residencies if r.state in ("warming", "ready"))

    def on_tick(minute, pin, plan, result) -> None:
        nonlocal lost
        if any(q.kind == "host" and q.subject == host for q in pin.flap_quarantines):
            watch.quarantined_minutes += 1
        fresh = any(h.host_id == host and h.heartbeat_at == pin.now for h in pin.hosts)
        if not fresh and up:
            # The machine is down: every replica its last heartbeat reported is gone.
            lost += len(up)
            up.clear()

    rep = run(sc, strategy, policy=policy, on_event=on_event, on_tick=on_tick).report()
    return Figures(
        quarantine=policy.flap_host_transitions > 0, starts_on_flapping_host=watch.starts, replicas_lost=lost,
        flaps=rep.flaps, churn=rep.churn, served_demand=rep.served_demand,
        least_workload_service=rep.least_workload_service, safety_violations=rep.safety_violations,
        quarantined_minutes=watch.quarantined_minutes,
    )


def compare(sc: Scenario, **kw: int) -> tuple[Figures, Figures]:
    """The flapping-host variant of `sc` with quarantine on (the default policy) and off."""
    flapping, host = flapping_scenario(sc, **kw)
    return measure(flapping, host, Policy()), measure(flapping, host, QUARANTINE_OFF)


def transition_peaks(sc: Scenario, window_seconds: float) -> dict[str, int]:
    """Per host, the most lifecycle transitions inside any window of `window_seconds` in one
    quarantine-off run of `sc` (the evidence a host threshold must stay above on ordinary days)."""
    state = lifecycle_proj.initial()
    seq = 0

    def on_event(stream: str, event: Event) -> None:
        nonlocal state, seq
        if isinstance(event, HostHeartbeat):
            seq += 1
            state = lifecycle_proj.apply(state, event, Position(stream, seq, event.at))

    run(sc, strategies.SMART, policy=QUARANTINE_OFF, on_event=on_event)
    peaks: dict[str, int] = {}
    for host in sorted(m.host_id for m in sc.fleet):
        track = state.hosts.get(host)
        times = sorted(track.transitions) if track is not None else []
        best = 0
        for i, t in enumerate(times):
            best = max(best, sum(1 for u in times[: i + 1] if u > t - window_seconds))
        peaks[host] = best
    return peaks
