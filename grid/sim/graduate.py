"""`gridctl test graduate`: every strategy over fleet sizes and seeds, judged by the issue's gates.

Figures per fleet are medians over seeds (churn: totals), so one lucky seed cannot graduate a
strategy. The oracle runs where it is bounded to (grid.sim.oracle); gates that compare with it
apply only there and say so. A failed gate is the work queue for the next allocator change.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from grid.sim import oracle as oracle_mod
from grid.sim.metrics import Report
from grid.sim.run import run
from grid.sim.scenario import ScenarioConfig, prepare
from grid.sim.strategies import GREEDY, SMART, STATIC, STRATEGIES

ORACLE_SERVICE = 0.97
LEAST_SERVICE = 0.9
CHURN_SHARE = 1 / 3
EVENING_MEMORY = 1.2


@dataclass(frozen=True, slots=True)
class Gate:
    name: str
    fleet: int
    measured: str
    passed: bool
    applies: bool = True


@dataclass(frozen=True, slots=True)
class FleetResult:
    machines: int
    seeds: tuple[int, ...]
    # strategy -> one report per seed
    reports: dict[str, tuple[Report, ...]]
    oracle: tuple[dict, ...] | None
    identical_traces: bool


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def run_fleet(machines: int, seeds: tuple[int, ...], *, users: int, models: int, minutes: int,
              progress: Callable[[str], None] | None = None) -> FleetResult:
    reports: dict[str, list[Report]] = {s: [] for s in STRATEGIES}
    oracles: list[dict] = []
    identical = True
    for seed in seeds:
        sc = prepare(ScenarioConfig(machines=machines, models=models, users=users, minutes=minutes, seed=seed))
        digests = set()
        for strategy in STRATEGIES:
            if progress is not None:
                progress(f"{machines} machines, seed {seed}, {strategy}")
            rep = run(sc, strategy).report()
            reports[strategy].append(rep)
            digests.add((rep.trace_digest, rep.requests))
        identical = identical and len(digests) == 1
        if oracle_mod.refusal(sc) is None:
            if progress is not None:
                progress(f"{machines} machines, seed {seed}, oracle")
            oracles.append(oracle_mod.solve(sc))
    return FleetResult(machines, seeds, {k: tuple(v) for k, v in reports.items()},
                       tuple(oracles) if oracles else None, identical)


def summary(f: FleetResult) -> dict:
    rows = {}
    for strategy, reps in sorted(f.reports.items()):
        rows[strategy] = {
            "served_demand": round(_median([r.served_demand for r in reps]), 4),
            "least_feasible_workload_service": round(_median([r.least_feasible_workload_service for r in reps]), 4),
            "slo_attainment": round(_median([r.slo_attainment for r in reps]), 4),
            "churn": sum(r.churn for r in reps),
            "evening_memory_gib": round(_median([r.evening_memory_gib for r in reps]), 4),
            "safety_violations": sum(r.safety_violations for r in reps),
        }
    if f.oracle:
        rows["oracle"] = {
            "served_demand": round(_median([o["served_demand"] for o in f.oracle]), 4),
            "least_feasible_workload_service": round(_median([o["least_feasible_workload_service"] for o in f.oracle]), 4),
            "churn": sum(o["mutations"] for o in f.oracle),
            "evening_memory_gib": round(_median([o["evening_memory_gib"] for o in f.oracle]), 4),
        }
    return rows


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (1.0 if a <= 0 else float("inf"))


def gates(f: FleetResult) -> list[Gate]:
    smart, static, greedy = f.reports[SMART], f.reports[STATIC], f.reports[GREEDY]
    out: list[Gate] = []
    out.append(Gate("identical demand traces", f.machines, "yes" if f.identical_traces else "no", f.identical_traces))
    violations = sum(r.safety_violations for r in smart)
    out.append(Gate("zero smart safety violations", f.machines, str(violations), violations == 0))
    s_med = _median([r.served_demand for r in smart])
    st_med = _median([r.served_demand for r in static])
    out.append(Gate("smart serves more than static", f.machines, f"{s_med:.4f} vs {st_med:.4f}", s_med > st_med))
    s_churn = sum(r.churn for r in smart)
    g_churn = sum(r.churn for r in greedy)
    out.append(Gate("smart churn <= 1/3 of greedy", f.machines, f"{s_churn} vs {g_churn}",
                    s_churn <= CHURN_SHARE * g_churn))
    if f.oracle:
        ratios = [_ratio(r.served_demand, o["served_demand"]) for r, o in zip(smart, f.oracle)]
        m = _median(ratios)
        out.append(Gate(f"smart >= {ORACLE_SERVICE} of oracle service", f.machines, f"{m:.4f}", m >= ORACLE_SERVICE))
        least = [_ratio(r.least_feasible_workload_service, o["least_feasible_workload_service"])
                 for r, o in zip(smart, f.oracle)]
        m = _median(least)
        out.append(Gate(f"least-workload service >= {LEAST_SERVICE} of oracle", f.machines, f"{m:.4f}",
                        m >= LEAST_SERVICE))
        mem = [_ratio(r.evening_memory_gib, o["evening_memory_gib"]) for r, o in zip(smart, f.oracle)]
        m = _median(mem)
        out.append(Gate(f"evening memory <= {EVENING_MEMORY}x oracle", f.machines, f"{m:.3f}x", m <= EVENING_MEMORY))
    else:
        for name in (f"smart >= {ORACLE_SERVICE} of oracle service", f"least-workload service >= {LEAST_SERVICE} of oracle",
                     f"evening memory <= {EVENING_MEMORY}x oracle"):
            out.append(Gate(name, f.machines, "oracle not run (fleet beyond its bounds)", True, applies=False))
    return out


def render(results: list[FleetResult]) -> str:
    lines = []
    for f in results:
        lines.append(f"fleet {f.machines} machines, seeds {','.join(map(str, f.seeds))}")
        lines.append(f"  {'strategy':<10}{'served':>9}{'least':>9}{'SLO':>9}{'churn':>7}{'evening':>10}{'unsafe':>8}")
        for strategy, row in summary(f).items():
            slo = f"{row['slo_attainment']:>9.4f}" if "slo_attainment" in row else f"{'-':>9}"
            unsafe = row.get("safety_violations", "-")
            lines.append(f"  {strategy:<10}{row['served_demand']:>9.4f}{row['least_feasible_workload_service']:>9.4f}"
                         f"{slo}{row['churn']:>7}{row['evening_memory_gib']:>9.1f}G{unsafe:>8}")
    lines.append("")
    lines.append("gates")
    for f in results:
        for g in gates(f):
            verdict = "PASS" if g.passed and g.applies else ("n/a " if not g.applies else "FAIL")
            lines.append(f"  {verdict}  [{g.fleet:>2} machines] {g.name}: {g.measured}")
    return "\n".join(lines)


def to_dict(results: list[FleetResult]) -> dict:
    return {
        "fleets": [{"machines": f.machines, "seeds": list(f.seeds), "summary": summary(f),
                    "gates": [{"name": g.name, "measured": g.measured, "passed": g.passed, "applies": g.applies}
                              for g in gates(f)]} for f in results],
        "passed": all(g.passed for f in results for g in gates(f)),
    }


def passed(results: list[FleetResult]) -> bool:
    return all(g.passed for f in results for g in gates(f))
