"""A seeded workday: demand curves per workload and fleet incidents, minute by minute.

Two shapes, both phases as fractions of the scenario (jittered by the seed):

* the classic day (`build_workday`): morning ramp, coding surge, creative campaign, thermal
  throttle on one machine, a node outage and its recovery, and the evening cooldown;
* the full day (`build_full_workday`, meant for 8 hours): morning ramp, coding surge, a lunch
  lull, a node outage, an afternoon with the creative campaign and a throttle, and an evening
  cooldown long enough (the last 1.5 of 8 hours) that resident memory can be seen to fall.

The same seed gives the same day for every strategy.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from grid.events.requests import WORKLOADS

SURGE = "coding_surge"
CAMPAIGN = "creative_campaign"
THROTTLE = "thermal_throttle"
OUTAGE = "node_outage"
COOLDOWN = "cooldown"
RAMP = "morning_ramp"
LUNCH = "lunch"
AFTERNOON = "afternoon"

# Day shapes a scenario may ask for (grid.sim.scenario.ScenarioConfig.day).
CLASSIC_DAY = "classic"
FULL_DAY = "full"
DAYS: tuple[str, ...] = (CLASSIC_DAY, FULL_DAY)
# The full day's length when the graduate matrix runs it.
FULL_DAY_MINUTES = 8 * 60

# The lunch lull's multiplier (people away from their desks, not an evening).
LUNCH_LEVEL = 0.5
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


def _curves(minutes: int, *, ramp: tuple[int, int], ramp_level: tuple[float, float], surge: tuple[int, int],
            campaign: tuple[int, int], cooldown: tuple[int, int],
            lunch: tuple[int, int] | None = None) -> dict[str, tuple[float, ...]]:
    """Each workload's demand multiplier per minute. The ramp climbs from `ramp_level[0]` by
    `ramp_level[1]` (two numbers, not a floor and 1 - floor, so each day's floats stay its own)."""
    floor, rise = ramp_level
    curves: dict[str, list[float]] = {w: [1.0] * minutes for w in WORKLOADS}
    for m in range(minutes):
        for w in WORKLOADS:
            level = 1.0
            if ramp[0] <= m < ramp[1]:
                level *= floor + rise * (m - ramp[0]) / max(1, ramp[1] - ramp[0])
            if surge[0] <= m < surge[1]:
                level *= SURGE_BOOST.get(w, 1.0)
            if lunch is not None and lunch[0] <= m < lunch[1]:
                level *= LUNCH_LEVEL
            if campaign[0] <= m < campaign[1]:
                level *= CAMPAIGN_BOOST.get(w, 1.0)
            if m >= cooldown[0]:
                level *= EVENING_LEVEL
            curves[w][m] = round(level, 6)
    return {w: tuple(c) for w, c in curves.items()}


def _incident_hosts(rng: random.Random, host_ids: tuple[str, ...]) -> tuple[str, str] | None:
    """The host throttled and the host that goes down (possibly the same one); none on one host."""
    hosts = sorted(host_ids)
    if len(hosts) < 2:
        return None
    throttled = hosts[rng.randrange(len(hosts))]
    down = hosts[rng.randrange(len(hosts))]
    return throttled, down


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
    curves = _curves(minutes, ramp=ramp, ramp_level=(0.4, 0.6), surge=surge, campaign=campaign, cooldown=cooldown)
    incidents: tuple[Incident, ...] = ()
    if (chosen := _incident_hosts(rng, host_ids)) is not None:
        throttled, down = chosen
        incidents = (Incident(THROTTLE, throttled, *throttle), Incident(OUTAGE, down, *outage))
    phases = (Phase(RAMP, *ramp), Phase(SURGE, *surge), Phase(CAMPAIGN, *campaign), Phase(THROTTLE, *throttle),
              Phase(OUTAGE, *outage), Phase(COOLDOWN, *cooldown))
    return Workday(minutes, curves, incidents, phases)


def build_full_workday(minutes: int, seed: int, host_ids: tuple[str, ...]) -> Workday:
    """The full office day: fractions below are of an 8-hour day (0.125 = one hour)."""
    if minutes < 1:
        raise ValueError("a scenario needs at least one minute")
    rng = random.Random(f"full-workday:{seed}")
    ramp = _span(rng, minutes, 0.0, 0.09)
    surge = _span(rng, minutes, 0.125, 0.31)
    lunch = _span(rng, minutes, 0.44, 0.53)
    outage = _span(rng, minutes, 0.56, 0.66)
    campaign = _span(rng, minutes, 0.62, 0.76)
    throttle = _span(rng, minutes, 0.66, 0.78)
    afternoon = (lunch[1], int(0.8125 * minutes))
    cooldown = (int(0.8125 * minutes), minutes)
    curves = _curves(minutes, ramp=ramp, ramp_level=(0.3, 0.7), surge=surge, campaign=campaign, cooldown=cooldown,
                     lunch=lunch)
    incidents: tuple[Incident, ...] = ()
    if (chosen := _incident_hosts(rng, host_ids)) is not None:
        throttled, down = chosen
        incidents = (Incident(OUTAGE, down, *outage), Incident(THROTTLE, throttled, *throttle))
    phases = (Phase(RAMP, *ramp), Phase(SURGE, *surge), Phase(LUNCH, *lunch), Phase(OUTAGE, *outage),
              Phase(AFTERNOON, *afternoon), Phase(CAMPAIGN, *campaign), Phase(THROTTLE, *throttle),
              Phase(COOLDOWN, *cooldown))
    return Workday(minutes, curves, incidents, phases)


def day_builder(day: str) -> Callable[[int, int, tuple[str, ...]], Workday]:
    """The workday function for a day shape."""
    if day == CLASSIC_DAY:
        return build_workday
    if day == FULL_DAY:
        return build_full_workday
    raise ValueError(f"unknown day {day!r} (one of: {', '.join(DAYS)})")


def with_curve(day: Workday, workload: str, curve: tuple[float, ...]) -> Workday:
    if len(curve) != day.minutes:
        raise ValueError("a trace curve must cover every minute of the scenario")
    return Workday(day.minutes, {**day.curves, workload: curve}, day.incidents, day.phases)
