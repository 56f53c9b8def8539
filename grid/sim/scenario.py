"""A scenario's inputs, prepared once and shared by every strategy: fleet, catalog, population,
workday and the request trace (all from the seed; the strategy never changes them)."""

from __future__ import annotations

from dataclasses import dataclass

from grid.events.control import ModelProfile
from grid.fleet.planning import DemandTarget
from grid.sim import catalog as catalog_mod
from grid.sim import traffic
from grid.sim.fleet import MachineSpec, build_fleet
from grid.sim.personas import SERVICE_SECONDS, Persona, full_day_population, population
from grid.sim.strategies import best_model, targets_from_offered
from grid.sim.trace import curve
from grid.sim.workday import CLASSIC_DAY, DAYS, FULL_DAY, Workday, day_builder, with_curve

MAX_MINUTES = 24 * 60
MAX_USERS = 5000
# Simulated epoch (a whole minute): the day starts here for every run.
EPOCH = 1_800_000_000.0


@dataclass(frozen=True, slots=True)
class ScenarioConfig:
    machines: int = 4
    models: int = 8
    users: int = 50
    minutes: int = 120
    seed: int = 42
    # The day's shape (grid.sim.workday.DAYS): the classic day, or the full day with its long tail.
    day: str = CLASSIC_DAY
    # (workload, rows) from --workload-trace, already validated by grid.sim.trace.
    traces: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class Scenario:
    config: ScenarioConfig
    fleet: tuple[MachineSpec, ...]
    specs: tuple[catalog_mod.ModelSpec, ...]
    profiles: dict[str, ModelProfile]
    users: tuple[Persona, ...]
    day: Workday
    requests: tuple[tuple[traffic.Request, ...], ...]
    trace_digest: str

    def average_targets(self) -> tuple[DemandTarget, ...]:
        """The declared population's average demand, mapped to models (static's one plan)."""
        offered: dict[str, float] = {}
        for persona in self.users:
            minutes = self.day.minutes
            active = [persona.active(m, minutes) for m in range(minutes)]
            for w, weight in persona.mix:
                curve_ = self.day.curves[w]
                per_min = persona.rate * weight * sum(c for c, a in zip(curve_, active) if a) / len(curve_)
                load = per_min * SERVICE_SECONDS[w] / 60.0
                named = persona.named_model if persona.named_model in self.profiles else None
                share = persona.named_share if named else 0.0
                if named:
                    offered[named] = offered.get(named, 0.0) + load * share
                model = best_model(w, self.profiles, self.fleet)
                if model is not None:
                    offered[model] = offered.get(model, 0.0) + load * (1.0 - share)
        return targets_from_offered(offered, self.profiles, "static_average")


def validate(cfg: ScenarioConfig) -> None:
    if not 1 <= cfg.minutes <= MAX_MINUTES:
        raise ValueError(f"--hours must give between 1 and {MAX_MINUTES} minutes, got {cfg.minutes}")
    if not 1 <= cfg.users <= MAX_USERS:
        raise ValueError(f"--users must be between 1 and {MAX_USERS}, got {cfg.users}")
    if cfg.seed < 0:
        raise ValueError("--seed must be non-negative")
    if cfg.day not in DAYS:
        raise ValueError(f"unknown day {cfg.day!r} (one of: {', '.join(DAYS)})")


def prepare(cfg: ScenarioConfig) -> Scenario:
    validate(cfg)
    fleet = build_fleet(cfg.machines)
    specs = catalog_mod.catalog(cfg.models)
    profiles = {s.model_id: catalog_mod.profile(s) for s in specs}
    users = full_day_population(cfg.users) if cfg.day == FULL_DAY else population(cfg.users)
    day = day_builder(cfg.day)(cfg.minutes, cfg.seed, tuple(m.host_id for m in fleet))
    for workload, rows in cfg.traces:
        day = with_curve(day, workload, curve(list(rows), cfg.minutes, day.curves[workload]))
    requests = traffic.generate(users, day, cfg.seed, frozenset(profiles))
    return Scenario(cfg, fleet, specs, profiles, users, day, requests, traffic.digest(requests))
