"""The bounded exhaustive hindsight benchmark (`--oracle`): a development target, not a policy.

It replays the exact request trace a run routed, with perfect knowledge of the future:

* time is cut into blocks of BLOCK_MINUTES (>= 2: the hold); placements change only between
  blocks, and a model new on a machine serves from the block's second minute (one minute
  load-to-ready);
* in each block every runtime/backend/memory/machine-state-compatible placement is scored:
  per machine, every maximal set of the models with demand in the block or the next
  HORIZON_MINUTES that fits its memory (an outage leaves the machine empty, a throttle halves
  its concurrency), combined over machines;
* service is routed optimally-enough: named requests to their model, then `auto` workloads,
  fewest alternatives first, onto any model that scores them, up to each replica's
  concurrency x 60 s x machine speed;
* a dynamic program over blocks keeps the service-maximising schedules and, among them, the
  fewest mutations (adds + removes), with at most TIE_CAP states per block; from each state it
  tries staying (less models without demand) and the CANDIDATES best placements of the block
  (ranked by service over the block and the horizon after it, then memory).

Bounded to MAX_MACHINES machines, MAX_MODELS models and MAX_MINUTES minutes; larger inputs
are refused with a message (the search is exponential in them).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from grid.events.control import ModelProfile
from grid.events.requests import WORKLOADS
from grid.gateway.routing import TEXT_WORKLOADS
from grid.sim.fleet import MachineSpec
from grid.sim.metrics import GIB, feasible_workloads
from grid.sim.scenario import Scenario
from grid.sim.strategies import feasible
from grid.sim.traffic import AUTO
from grid.sim.workday import OUTAGE, THROTTLE

MAX_MACHINES = 4
MAX_MODELS = 9
# The full 8-hour day (grid.sim.workday.FULL_DAY_MINUTES) is within bounds.
MAX_MINUTES = 480
BLOCK_MINUTES = 2
HORIZON_MINUTES = 10
TIE_CAP = 256
CANDIDATES = 16
LOAD_TO_READY_SECONDS = 60.0
THROTTLED_SPEED = 0.6

Placement = tuple[frozenset[str], ...]  # per machine, in fleet order


class OracleRefused(ValueError):
    """The scenario is larger than the exhaustive search is bounded to."""


def refusal(sc: Scenario) -> str | None:
    c = sc.config
    if c.machines > MAX_MACHINES:
        return f"--oracle is bounded to {MAX_MACHINES} machines (got {c.machines})"
    if c.models > MAX_MODELS:
        return f"--oracle is bounded to {MAX_MODELS} models (got {c.models})"
    if c.minutes > MAX_MINUTES:
        return f"--oracle is bounded to {MAX_MINUTES} minutes (got {c.minutes})"
    return None


@dataclass(frozen=True, slots=True)
class _Minute:
    named: tuple[tuple[str, str, float], ...]  # (workload, model, device seconds)
    auto: tuple[tuple[str, float], ...]  # (workload, device seconds)


def _demand(sc: Scenario) -> list[_Minute]:
    out = []
    for bucket in sc.requests:
        named: dict[tuple[str, str], float] = {}
        auto: dict[str, float] = {}
        for r in bucket:
            if r.model == AUTO:
                auto[r.workload] = auto.get(r.workload, 0.0) + r.service_seconds
            else:
                named[(r.workload, r.model)] = named.get((r.workload, r.model), 0.0) + r.service_seconds
        out.append(_Minute(tuple((w, m, v) for (w, m), v in sorted(named.items())), tuple(sorted(auto.items()))))
    return out


def _servers(workload: str, profiles: Mapping[str, ModelProfile]) -> tuple[str, ...]:
    """Models that may serve `auto` traffic of a workload (the router's rule), best first."""
    rows = []
    for m in sorted(profiles):
        s = profiles[m].workload_scores
        direct = float(s.get(workload, 0.0))
        general = float(s.get("general", 0.0)) if workload in TEXT_WORKLOADS else 0.0
        if direct > 0 or general > 0:
            rows.append(((-direct, -general, m), m))
    return tuple(m for _, m in sorted(rows))


class _Oracle:
    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.fleet: tuple[MachineSpec, ...] = sc.fleet
        self.profiles = sc.profiles
        self.minutes = _demand(sc)
        self.servers = {w: _servers(w, sc.profiles) for w in WORKLOADS}
        self.states_evaluated = 0
        self._options: dict[tuple[int, frozenset[str], str | None], tuple[frozenset[str], ...]] = {}

    def _machine_state(self, i: int, start: int, end: int) -> str | None:
        host = self.fleet[i].host_id
        kinds = {self.sc.day.incident_state(host, m) for m in range(start, end)}
        if OUTAGE in kinds:
            return OUTAGE
        return THROTTLE if THROTTLE in kinds else None

    def _capacity(self, placement: Placement, states: tuple[str | None, ...]) -> dict[str, float]:
        cap: dict[str, float] = {}
        for spec, models, st in zip(self.fleet, placement, states):
            if st == OUTAGE:
                continue
            speed = spec.speed * (THROTTLED_SPEED if st == THROTTLE else 1.0)
            for m in models:
                p = self.profiles[m]
                conc = max(1, int(p.replica_concurrency * spec.concurrency_factor))
                if st == THROTTLE:
                    conc = max(1, int(conc * 0.5))
                cap[m] = cap.get(m, 0.0) + conc * 60.0 * speed
        return cap

    def _route(self, minute: _Minute, cap: dict[str, float], served: dict[str, float] | None) -> float:
        left = dict(cap)
        total = 0.0
        for w, m, v in minute.named:
            s = min(v, left.get(m, 0.0))
            if s > 0:
                left[m] -= s
                total += s
                if served is not None:
                    served[w] = served.get(w, 0.0) + s
        for w, v in sorted(minute.auto, key=lambda wv: (len(self.servers[wv[0]]), wv[0])):
            need = v
            for m in self.servers[w]:
                if need <= 0:
                    break
                s = min(need, left.get(m, 0.0))
                if s > 0:
                    left[m] -= s
                    need -= s
                    total += s
                    if served is not None:
                        served[w] = served.get(w, 0.0) + s
        return total

    def _demanded(self, start: int, end: int) -> frozenset[str]:
        out: set[str] = set()
        for minute in self.minutes[start:min(len(self.minutes), end + HORIZON_MINUTES)]:
            out.update(m for _, m, _ in minute.named)
            for w, _ in minute.auto:
                out.update(self.servers[w])
        return frozenset(out)

    def _host_options(self, i: int, demanded: frozenset[str], state: str | None) -> tuple[frozenset[str], ...]:
        key = (i, demanded, state)
        hit = self._options.get(key)
        if hit is not None:
            return hit
        spec = self.fleet[i]
        if state == OUTAGE:
            self._options[key] = (frozenset(),)
            return self._options[key]
        models = sorted(m for m in demanded if feasible(spec, self.profiles[m]))
        fits = []
        for n in range(len(models), -1, -1):
            for combo in itertools.combinations(models, n):
                if sum(self.profiles[m].memory_mb for m in combo) <= spec.memory_mb:
                    fits.append(frozenset(combo))
        # Maximal sets only: a superset always serves at least as much.
        maximal = [s for s in fits if not any(s < t for t in fits)]
        self._options[key] = tuple(sorted(maximal, key=lambda s: sorted(s)))
        return self._options[key]

    def solve(self) -> dict:
        n = len(self.minutes)
        blocks = [(s, min(n, s + BLOCK_MINUTES)) for s in range(0, n, BLOCK_MINUTES)]
        empty: Placement = tuple(frozenset() for _ in self.fleet)
        # state -> (served, -mutations, path index); paths kept as parent links.
        beam: dict[Placement, tuple[float, int, int]] = {empty: (0.0, 0, -1)}
        parents: list[tuple[int, Placement]] = []
        full_cache: dict[tuple, float] = {}
        for bi, (start, end) in enumerate(blocks):
            states = tuple(self._machine_state(i, start, end) for i in range(len(self.fleet)))
            demanded = self._demanded(start, end)
            options = [self._host_options(i, demanded, states[i]) for i in range(len(self.fleet))]
            scored: list[tuple[float, int, Placement]] = []
            for placement in itertools.product(*options):
                self.states_evaluated += 1
                cap = self._capacity(placement, states)
                key = (bi, tuple(sorted(cap.items())))
                v = full_cache.get(key)
                if v is None:
                    # Ranked over the block and the horizon after it (perfect foresight), so a
                    # placement that stays good is tried, not only each block's local best.
                    v = sum(self._route(self.minutes[m], cap, None) for m in range(start, min(n, end + HORIZON_MINUTES)))
                    full_cache[key] = v
                mem = sum(self.profiles[x].memory_mb for s in placement for x in s)
                scored.append((v, mem, placement))
            scored.sort(key=lambda t: (-t[0], t[1], [sorted(s) for s in t[2]]))
            candidates = [p for _, _, p in scored[:CANDIDATES]]
            nxt: dict[Placement, tuple[float, int, int]] = {}
            for prev, (served, neg_mut, _) in sorted(beam.items(), key=lambda kv: (-kv[1][0], -kv[1][1])):
                parent = len(parents)
                parents.append((beam[prev][2], prev))
                # Staying put (less what no longer has demand, or a machine that went down).
                stay = tuple(frozenset() if st == OUTAGE else a & demanded for a, st in zip(prev, states))
                for cand in (candidates if stay in candidates else candidates + [stay]):
                    muts = sum(len(a ^ b) for a, b in zip(prev, cand))
                    kept = tuple(a & b for a, b in zip(prev, cand))
                    cap_first = self._capacity(kept, states)
                    cap_rest = self._capacity(cand, states)
                    v = self._route(self.minutes[start], cap_first, None)
                    v += sum(self._route(self.minutes[m], cap_rest, None) for m in range(start + 1, end))
                    val = (served + v, neg_mut - muts, parent)
                    old = nxt.get(cand)
                    if old is None or (round(val[0], 6), val[1]) > (round(old[0], 6), old[1]):
                        nxt[cand] = val
            ranked = sorted(nxt.items(), key=lambda kv: (-round(kv[1][0], 6), -kv[1][1], [sorted(s) for s in kv[0]]))
            beam = dict(ranked[:TIE_CAP])
        best, (_, neg_mut, parent) = min(beam.items(), key=lambda kv: (-round(kv[1][0], 6), -kv[1][1],
                                                                        [sorted(s) for s in kv[0]]))
        schedule = [best]
        while parent >= 0:
            parent, state = parents[parent]
            schedule.append(state)
        schedule.reverse()
        schedule = schedule[1:]  # drop the empty start
        return self._report(blocks, schedule, -neg_mut)

    def _report(self, blocks: list[tuple[int, int]], schedule: list[Placement], mutations: int) -> dict:
        offered: dict[str, float] = {}
        served: dict[str, float] = {}
        memory: list[int] = []
        prev: Placement = tuple(frozenset() for _ in self.fleet)
        ever: list[set[str]] = [set() for _ in self.fleet]
        slow_starts = changes = 0
        for (start, end), placement in zip(blocks, schedule):
            states = tuple(self._machine_state(i, start, end) for i in range(len(self.fleet)))
            kept = tuple(a & b for a, b in zip(prev, placement))
            for i, (a, b) in enumerate(zip(prev, placement)):
                for m in sorted(b - a):
                    changes += 1
                    ever[i].add(m)
                    if self.profiles[m].load_seconds + self.profiles[m].warm_seconds > LOAD_TO_READY_SECONDS:
                        slow_starts += 1
            for m in range(start, end):
                minute = self.minutes[m]
                for w, _, v in minute.named:
                    offered[w] = offered.get(w, 0.0) + v
                for w, v in minute.auto:
                    offered[w] = offered.get(w, 0.0) + v
                self._route(minute, self._capacity(kept if m == start else placement, states), served)
                memory.append(sum(self.profiles[x].memory_mb for s in placement for x in s))
            prev = placement
        rows = {w: served.get(w, 0.0) / v for w, v in sorted(offered.items()) if v > 0}
        least = min(rows.items(), key=lambda kv: (kv[1], kv[0])) if rows else ("", 1.0)
        servable = frozenset(feasible_workloads(self.sc))
        least_f = min(((w, v) for w, v in rows.items() if w in servable), key=lambda kv: (kv[1], kv[0]),
                      default=("", 1.0))
        total_offered = sum(offered.values())
        evening = memory[self.sc.day.evening_start():] or memory[-1:] or [0]
        over = []
        for spec, models in zip(self.fleet, ever):
            need = sum(int(self.profiles[m].artifact_size_mb or 0) for m in models)
            if need > spec.disk_gb * 1024:
                over.append(f"{spec.host_id} needs {need / GIB:.0f}G of {spec.disk_gb}G")
        disk = "pass" if not over else "fail: " + "; ".join(over)
        startup = ("pass" if not slow_starts else
                   f"{slow_starts} of {changes} starts take longer than the 1-min load-to-ready the oracle "
                   "assumes: cache preparation and faster startup are also required")
        return {
            "served_demand": round(sum(served.values()) / total_offered, 4) if total_offered else 1.0,
            "least_workload": least[0],
            "least_workload_service": round(least[1], 4),
            "least_feasible_workload": least_f[0],
            "least_feasible_workload_service": round(least_f[1], 4),
            "workload_service": {w: round(v, 4) for w, v in rows.items()},
            "evening_memory_gib": round(sum(evening) / len(evening) / GIB, 4),
            "memory_mean_gib": round(sum(memory) / len(memory) / GIB, 4) if memory else 0.0,
            "mutations": mutations,
            "mutations_excluding_first": mutations - sum(len(e) for e in ever),
            "block_minutes": BLOCK_MINUTES,
            "states_evaluated": self.states_evaluated,
            "tie_cap": TIE_CAP,
            "disk_audit": disk,
            "startup_audit": startup,
            "changes": [
                {"minute": blocks[i][0], "host": self.fleet[h].host_id, "add": sorted(b - a), "remove": sorted(a - b)}
                for i, (pa, pb) in enumerate(zip([tuple(frozenset() for _ in self.fleet)] + schedule[:-1], schedule))
                for h, (a, b) in enumerate(zip(pa, pb)) if a != b
            ][:50],
        }


def solve(sc: Scenario) -> dict:
    """The hindsight schedule's figures for `sc`, or OracleRefused when it is out of bounds."""
    why = refusal(sc)
    if why is not None:
        raise OracleRefused(why)
    return _Oracle(sc).solve()
