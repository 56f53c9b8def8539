"""A seeded workday: demand curves per workload and fleet incidents, minute by minute.

Phases as fractions of the scenario (jittered by the seed): morning ramp, coding surge,
creative campaign, thermal throttle on one machine, a node outage and its recovery, and the
evening cooldown. The same seed gives the same day for every strategy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from grid.events.requests import WORKLOADS

SURGE = "coding_surge"
CAMPAIGN = "creative_campaign"
THROTTLE = "thermal_throttle"
OUTAGE = "node_outage"
COOLDOWN = "cooldown"
RAMP = "morning_ramp"

# The evening multiplier every workload falls to (the lull in which memory should fall too).
EVENING_LEVEL = 0.15
SURGE_BOOST = {"coding": 2.5, "research": 1.5}
CAMPAIGN_BOOST = {"marketing": 2.5, "image": 2.5, "video": 2.0, "design": 2.0, "sales": 1.5}


@dataclass(frozen=True, slots=True)
class Incident:
    kind: str  # THROTTLE | OUTAGE
    host_id: str
    start: int  # first minute affected
    end: int  # first minute no longer affected


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Workday:
    minutes: int
    # workload -> multiplier per minute
    curves: dict[str, tuple[float, ...]]
    incidents: tuple[Incident, ...]
    phases: tuple[Phase, ...]

    def evening_start(self) -> int:
        return next((p.start for p in self.phases if p.name == COOLDOWN), self.minutes)

    def incident_state(self, host_id: str, minute: int) -> str | None:
        for inc in self.incidents:
            if inc.host_id == host_id and inc.start <= minute < inc.end:
                return inc.kind
        return None


def _span(rng: random.Random, minutes: int, lo: float, hi: float) -> tuple[int, int]:
    jitter = 0.03
    a = max(0.0, lo + rng.uniform(-jitter, jitter))
    b = min(1.0, hi + rng.uniform(-jitter, jitter))
    start, end = int(a * minutes), max(int(a * minutes) + 1, int(b * minutes))
    return min(start, minutes), min(end, minutes)


def build_workday(minutes: int, seed: int, host_ids: tuple[str, ...]) -> Workday:
    if minutes < 1:
        raise ValueError("a scenario needs at least one minute")
    rng = random.Random(f"workday:{seed}")
    ramp = _span(rng, minutes, 0.0, 0.10)
    surge = _span(rng, minutes, 0.15, 0.35)
    campaign = _span(rng, minutes, 0.40, 0.60)
    throttle = _span(rng, minutes, 0.30, 0.45)
    outage = _span(rng, minutes, 0.50, 0.65)
    cooldown = (int(0.80 * minutes), minutes)
    curves: dict[str, list[float]] = {w: [1.0] * minutes for w in WORKLOADS}
    for m in range(minutes):
        for w in WORKLOADS:
            level = 1.0
            if ramp[0] <= m < ramp[1]:
                level *= 0.4 + 0.6 * (m - ramp[0]) / max(1, ramp[1] - ramp[0])
            if surge[0] <= m < surge[1]:
                level *= SURGE_BOOST.get(w, 1.0)
            if campaign[0] <= m < campaign[1]:
                level *= CAMPAIGN_BOOST.get(w, 1.0)
            if m >= cooldown[0]:
                level *= EVENING_LEVEL
            curves[w][m] = round(level, 6)
    hosts = sorted(host_ids)
    incidents: list[Incident] = []
    if len(hosts) >= 2:
        throttled = hosts[rng.randrange(len(hosts))]
        down = hosts[rng.randrange(len(hosts))]
        incidents.append(Incident(THROTTLE, throttled, *throttle))
        incidents.append(Incident(OUTAGE, down, *outage))
    phases = (Phase(RAMP, *ramp), Phase(SURGE, *surge), Phase(CAMPAIGN, *campaign), Phase(THROTTLE, *throttle),
              Phase(OUTAGE, *outage), Phase(COOLDOWN, *cooldown))
    return Workday(minutes, {w: tuple(c) for w, c in curves.items()}, tuple(incidents), phases)


def with_curve(day: Workday, workload: str, curve: tuple[float, ...]) -> Workday:
    if len(curve) != day.minutes:
        raise ValueError("a trace curve must cover every minute of the scenario")
    return Workday(day.minutes, {**day.curves, workload: curve}, day.incidents, day.phases)
