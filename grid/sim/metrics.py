"""What a run measured, accumulated minute by minute, and the stable report it becomes.

Demand is counted in device seconds on a speed-1.0 machine (the request's cost), so a video
job weighs more than an embedding call and every strategy and the oracle share one unit.
Served demand is the share of offered device seconds that was routed to a ready replica with
room; SLO attainment is the share of requests that finished within twice their cost.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

import msgspec

from grid.events.requests import WORKLOADS
from grid.fleet.planning import Plan
from grid.sim.safety import DRAIN_BEFORE_UNLOAD, MEMORY
from grid.sim.strategies import best_model, feasible
from grid.sim.world import WARM_WITHOUT_MEMORY, PrefetchScore

if TYPE_CHECKING:
    from grid.sim.scenario import Scenario
    from grid.sim.traffic import Request
    from grid.sim.world import World

GIB = 1024.0
MAX_VIOLATION_SAMPLES = 10
# A workload is recommended more capacity when it lost at least this share of its demand.
RECOMMEND_UNSERVED = 0.05
# A start of a model this soon after one of its replicas was unloaded is a flap.
FLAP_MINUTES = 15


def _r(x: float) -> float:
    return round(x, 4)


class WorkloadRow(msgspec.Struct, frozen=True, kw_only=True):
    workload: str
    requests: int
    served_requests: int
    offered_device_seconds: float
    served_device_seconds: float
    service: float
    slo_attainment: float


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    minute: int
    invariant: str
    detail: str


class Report(msgspec.Struct, frozen=True, kw_only=True):
    machines: int
    models: int
    users: int
    minutes: int
    seed: int
    strategy: str
    trace_digest: str
    requests: int
    served_requests: int
    served_demand: float
    least_workload: str
    least_workload_service: float
    # The same over workloads some machine can serve at all (a runtime/backend gap such as video
    # on an Apple-only fleet lowers raw service but is a capacity gap, not a decision).
    least_feasible_workload: str
    least_feasible_workload_service: float
    slo_attainment: float
    churn: int
    # Churn less each machine's first start of each model (the day's initial placements).
    churn_excluding_first: int
    loads: int
    unloads: int
    drains: int
    preemption_drains: int
    # Starts of a model within FLAP_MINUTES of unloading one of its replicas.
    flaps: int
    cold_starts: int
    memory_mean_gib: float
    memory_peak_gib: float
    evening_memory_gib: float
    disk_used_gib: float
    shortfall_minutes: dict[str, int]
    unserved_reasons: dict[str, int]
    safety_checks: int
    safety_violations: int
    violations_by_invariant: dict[str, int]
    violation_samples: tuple[Violation, ...]
    workloads: tuple[WorkloadRow, ...]
    recommendations: tuple[str, ...]
    timeline: tuple[str, ...] = ()
    # Predictive prefetch scorecard: downloads, the ones a later placement used (hits), downloads
    # never used (still on disk unwarmed, or expired), expirations and the disk they reclaimed,
    # the median lead from a download finishing to its use, and the transfer seconds hits avoided.
    prefetch_downloads: int = 0
    prefetch_download_gib: float = 0.0
    prefetch_hits: int = 0
    prefetch_unused: int = 0
    prefetch_expired: int = 0
    prefetch_reclaimed_gib: float = 0.0
    prefetch_lead_seconds: float = 0.0
    avoided_load_seconds: float = 0.0


def feasible_workloads(sc: Scenario) -> list[str]:
    """Workloads some machine of the fleet can serve with some configured model."""
    return [w for w in WORKLOADS if best_model(w, sc.profiles, sc.fleet) is not None]


class Metrics:
    def __init__(self, sc: Scenario, strategy: str, *, timeline: bool = False) -> None:
        self.sc = sc
        self.strategy = strategy
        self.keep_timeline = timeline
        self.timeline: list[str] = []
        self.offered: dict[str, float] = {w: 0.0 for w in WORKLOADS}
        self.served: dict[str, float] = {w: 0.0 for w in WORKLOADS}
        self.requests: dict[str, int] = {w: 0 for w in WORKLOADS}
        self.served_n: dict[str, int] = {w: 0 for w in WORKLOADS}
        self.slo_ok: dict[str, int] = {w: 0 for w in WORKLOADS}
        self.unserved_reasons: dict[str, int] = {}
        # Peak unserved device seconds in one minute, per model the request wanted (auto: workload).
        self.unserved_minute: dict[tuple[int, str], float] = {}
        self.kinds: dict[str, int] = {"load": 0, "warm": 0, "drain": 0, "unload": 0}
        self.preemption_drains = 0
        self.flaps = 0
        self._unloaded: dict[str, int] = {}
        # (host, model) pairs started at least once: later starts of a pair are re-placements.
        self._started: set[tuple[str, str]] = set()
        self.memory: list[int] = []
        self.shortfalls: dict[str, int] = {}
        # Most replicas a plan placed per model (recommendations name a profile cap it reached).
        self.peak_placed: dict[str, int] = {}
        self.violations: list[Violation] = []
        self.violation_counts: dict[str, int] = {}
        self.checks = 0
        self.disk_mb = 0
        self.cold_starts = 0
        self.prefetch: PrefetchScore = PrefetchScore()
        self.prefetch_unused = 0

    def _line(self, minute: int, text: str) -> None:
        if self.keep_timeline:
            self.timeline.append(f"t+{minute:04d}m {text}")

    def incident(self, minute: int, host_id: str, kind: str | None) -> None:
        self._line(minute, f"{host_id} {kind or 'recovered'}")

    def action(self, minute: int, kind: str, host_id: str, model_id: str, reason: str, preemption_for: str | None) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if kind == "drain" and preemption_for is not None:
            self.preemption_drains += 1
        if kind == "warm":
            self._started.add((host_id, model_id))
        if kind == "unload":
            self._unloaded[model_id] = minute
        elif kind == "warm" and model_id in self._unloaded and minute - self._unloaded[model_id] <= FLAP_MINUTES:
            self.flaps += 1
        extra = f" for {preemption_for}" if preemption_for else ""
        self._line(minute, f"{kind} {model_id} on {host_id} ({reason}{extra})")

    def plan(self, minute: int, plan: Plan) -> None:
        self.checks += 1
        placed: dict[str, int] = {}
        for pl in plan.placements:
            placed[pl.model_id] = placed.get(pl.model_id, 0) + 1
        for m, n in placed.items():
            if n > self.peak_placed.get(m, 0):
                self.peak_placed[m] = n
        for s in plan.shortfalls:
            if s.wanted > s.placed:
                self.shortfalls[s.model_id] = self.shortfalls.get(s.model_id, 0) + 1

    def violation(self, minute: int, invariant: str, detail: str) -> None:
        self.violation_counts[invariant] = self.violation_counts.get(invariant, 0) + 1
        if len(self.violations) < MAX_VIOLATION_SAMPLES:
            self.violations.append(Violation(minute=minute, invariant=invariant, detail=detail))
        self._line(minute, f"VIOLATION {invariant}: {detail}")

    def request(self, minute: int, r: Request, model: str | None, reason: str, device_seconds: float, slo_ok: bool) -> None:
        w = r.workload
        self.offered[w] += r.service_seconds
        self.requests[w] += 1
        if model is None:
            self.unserved_reasons[reason] = self.unserved_reasons.get(reason, 0) + 1
            key = (minute, w)
            self.unserved_minute[key] = self.unserved_minute.get(key, 0.0) + r.service_seconds
            return
        self.served[w] += r.service_seconds
        self.served_n[w] += 1
        if slo_ok:
            self.slo_ok[w] += 1

    def residency(self, minute: int, world: World) -> None:
        self.memory.append(sum(m.used_mb() for m in world.machines.values() if m.up))

    def finish(self, world: World) -> None:
        self.disk_mb = sum(m.disk_used_mb() for m in world.machines.values())
        self.cold_starts = world.cold_fetches
        self.prefetch = world.prefetch
        self.prefetch_unused = world.unused_predictions() + world.prefetch.expired
        for at, host, model, problem in world.problems:
            minute = int((at - world.start) // 60)
            invariant = MEMORY if problem == WARM_WITHOUT_MEMORY else DRAIN_BEFORE_UNLOAD
            self.violation(minute, invariant, f"{problem}: {model} on {host}")

    # --- the report --------------------------------------------------------------------------

    def report(self) -> Report:
        sc = self.sc
        rows = []
        for w in WORKLOADS:
            if not self.requests[w]:
                continue
            rows.append(WorkloadRow(
                workload=w, requests=self.requests[w], served_requests=self.served_n[w],
                offered_device_seconds=_r(self.offered[w]), served_device_seconds=_r(self.served[w]),
                service=_r(self.served[w] / self.offered[w]) if self.offered[w] else 1.0,
                slo_attainment=_r(self.slo_ok[w] / self.requests[w]),
            ))
        least = min(rows, key=lambda x: (x.service, x.workload)) if rows else None
        servable = frozenset(feasible_workloads(sc))
        least_f = min((x for x in rows if x.workload in servable), key=lambda x: (x.service, x.workload), default=None)
        offered = sum(self.offered.values())
        served = sum(self.served.values())
        total = sum(self.requests.values())
        evening = self.memory[sc.day.evening_start():] or self.memory[-1:] or [0]
        return Report(
            machines=sc.config.machines, models=sc.config.models, users=sc.config.users,
            minutes=sc.config.minutes, seed=sc.config.seed, strategy=self.strategy, trace_digest=sc.trace_digest,
            requests=total, served_requests=sum(self.served_n.values()),
            served_demand=_r(served / offered) if offered else 1.0,
            least_workload=least.workload if least else "",
            least_workload_service=least.service if least else 1.0,
            least_feasible_workload=least_f.workload if least_f else "",
            least_feasible_workload_service=least_f.service if least_f else 1.0,
            slo_attainment=_r(sum(self.slo_ok.values()) / total) if total else 1.0,
            churn=self.kinds["warm"] + self.kinds["unload"],
            churn_excluding_first=self.kinds["warm"] + self.kinds["unload"] - len(self._started), loads=self.kinds["warm"], unloads=self.kinds["unload"],
            drains=self.kinds["drain"], preemption_drains=self.preemption_drains, flaps=self.flaps,
            cold_starts=self.cold_starts,
            memory_mean_gib=_r(sum(self.memory) / len(self.memory) / GIB) if self.memory else 0.0,
            memory_peak_gib=_r(max(self.memory, default=0) / GIB),
            evening_memory_gib=_r(sum(evening) / len(evening) / GIB),
            disk_used_gib=_r(self.disk_mb / GIB),
            shortfall_minutes=dict(sorted(self.shortfalls.items())),
            unserved_reasons=dict(sorted(self.unserved_reasons.items())),
            safety_checks=self.checks, safety_violations=sum(self.violation_counts.values()),
            violations_by_invariant=dict(sorted(self.violation_counts.items())),
            violation_samples=tuple(self.violations), workloads=tuple(rows),
            recommendations=self._recommendations(rows), timeline=tuple(self.timeline),
            prefetch_downloads=self.prefetch.downloads,
            prefetch_download_gib=_r(self.prefetch.download_mb / GIB),
            prefetch_hits=self.prefetch.hits, prefetch_unused=self.prefetch_unused,
            prefetch_expired=self.prefetch.expired,
            prefetch_reclaimed_gib=_r(self.prefetch.reclaimed_mb / GIB),
            prefetch_lead_seconds=_r(statistics.median(self.prefetch.lead_seconds)) if self.prefetch.lead_seconds else 0.0,
            avoided_load_seconds=_r(self.prefetch.avoided_load_seconds),
        )

    def _recommendations(self, rows: list[WorkloadRow]) -> tuple[str, ...]:
        sc = self.sc
        out = []
        for row in rows:
            if row.service >= 1.0 - RECOMMEND_UNSERVED:
                continue
            peak = max((v for (m, w), v in self.unserved_minute.items() if w == row.workload), default=0.0)
            candidates = [p for p in sc.profiles.values() if p.workload_scores.get(row.workload, 0.0) > 0]
            model = best_model(row.workload, sc.profiles, sc.fleet)
            if model is None:
                want = max(candidates, key=lambda p: (p.workload_scores.get(row.workload, 0.0), p.model_id), default=None)
                if want is None:
                    out.append(f"{row.workload}: no configured model serves it; add one")
                else:
                    out.append(f"{row.workload}: {_r(1 - row.service):.0%} unserved; no machine can host {want.model_id} "
                               f"({want.memory_mb / GIB:.0f} GiB, {','.join(want.runtimes)}"
                               f"{'/' + ','.join(want.backends) if want.backends else ''}): add such a machine")
                continue
            p = sc.profiles[model]
            hosts = sum(1 for s in sc.fleet if feasible(s, p))
            extra = max(1, math.ceil(peak / 60.0 / max(1, p.replica_concurrency)))
            cap = max(p.max_replicas, p.min_replicas)
            # The binding limit may be the profile, not the fleet: say so.
            capped = (f"; its profile caps it at max_replicas={cap}, which the plan reached"
                      if self.peak_placed.get(model, 0) >= cap and hosts > cap else "")
            out.append(f"{row.workload}: {1 - row.service:.0%} unserved; peak needs about {extra} more "
                       f"{model} replica(s) of {p.memory_mb / GIB:.0f} GiB ({hosts} machine(s) can host it){capped}")
        return tuple(out)
