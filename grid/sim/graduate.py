"""`gridctl test graduate`: every strategy over fleet sizes and seeds, judged by the issue's gates.

The default matrix runs each fleet over two days: the classic 2-hour day and the full 8-hour
day (lunch, a real evening, long-tail named models). Figures per fleet and day are medians over
seeds (churn: totals), so one lucky seed cannot graduate a strategy. The oracle runs where it is
bounded to (grid.sim.oracle); gates that compare with it apply only there and say so. Greedy is
fenced by minimum residency only (grid.sim.strategies.RESIDENCY_FENCE_ONLY), as the seed's lab
defines it. A failed gate is the work queue for the next allocator change.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from grid.fleet.planning import Policy
from grid.sim import oracle as oracle_mod
from grid.sim.metrics import Report
from grid.sim.run import run
from grid.sim.scenario import ScenarioConfig, prepare
from grid.sim.strategies import GREEDY, REACTIVE, SMART, STATIC, STRATEGIES
from grid.sim.workday import CLASSIC_DAY, DAYS, FULL_DAY, FULL_DAY_MINUTES

ORACLE_SERVICE = 0.97
LEAST_SERVICE = 0.9
# "Substantially less churn than minute-greedy": at most half of it.
CHURN_SHARE = 0.5
EVENING_MEMORY = 1.2
CLASSIC_MINUTES = 120
# --seeds as a count may ask for at most this many; explicit values are any non-negative seeds.
MAX_SEED_COUNT = 50


def parse_seeds(text: str) -> tuple[int, ...]:
    """`N` is a count (seeds 1..N); a comma list of values and `a-b` ranges is explicit
    (`42,` or `42-42` is the single seed 42). Raises ValueError with the reason."""
    text = text.strip()
    if text.isdigit():
        n = int(text)
        if not 1 <= n <= MAX_SEED_COUNT:
            raise ValueError(f"--seeds as a count must be between 1 and {MAX_SEED_COUNT}, got {n}")
        return tuple(range(1, n + 1))
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"--seeds must be a count or comma-separated seeds/ranges (e.g. 7,42 or 3-5), got {text!r}")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"--seeds range {part!r} runs backwards")
        out.extend(x for x in range(a, b + 1) if x not in out)
    if not out:
        raise ValueError("--seeds names no seed")
    return tuple(out)


def day_minutes(day: str, classic_minutes: int = CLASSIC_MINUTES) -> int:
    """The length a day shape runs for in the matrix: the full day is always 8 hours."""
    return FULL_DAY_MINUTES if day == FULL_DAY else classic_minutes


def parse_days(text: str) -> tuple[str, ...]:
    days = tuple(d.strip() for d in text.split(",") if d.strip())
    if not days:
        raise ValueError("--days names no day")
    for d in days:
        if d not in DAYS:
            raise ValueError(f"unknown day {d!r} in --days (one of: {', '.join(DAYS)})")
    return days


@dataclass(frozen=True, slots=True)
class Gate:
    name: str
    fleet: int
    day: str
    measured: str
    passed: bool
    applies: bool = True


@dataclass(frozen=True, slots=True)
class FleetResult:
    machines: int
    day: str
    minutes: int
    seeds: tuple[int, ...]
    # strategy -> one report per seed
    reports: dict[str, tuple[Report, ...]]
    oracle: tuple[dict, ...] | None
    identical_traces: bool


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def run_fleet(machines: int, seeds: tuple[int, ...], *, users: int, models: int, minutes: int,
              day: str = CLASSIC_DAY, progress: Callable[[str], None] | None = None,
              policy: Policy | None = None) -> FleetResult:
    """Every strategy on every seed under `policy` (default: the controller's)."""
    reports: dict[str, list[Report]] = {s: [] for s in STRATEGIES}
    oracles: list[dict] = []
    identical = True
    for seed in seeds:
        sc = prepare(ScenarioConfig(machines=machines, models=models, users=users, minutes=minutes, seed=seed,
                                    day=day))
        digests = set()
        for strategy in STRATEGIES:
            if progress is not None:
                progress(f"{machines} machines, {day} day, seed {seed}, {strategy}")
            rep = run(sc, strategy, policy=policy).report()
            reports[strategy].append(rep)
            digests.add((rep.trace_digest, rep.requests))
        identical = identical and len(digests) == 1
        if oracle_mod.refusal(sc) is None:
            if progress is not None:
                progress(f"{machines} machines, {day} day, seed {seed}, oracle")
            oracles.append(oracle_mod.solve(sc))
    return FleetResult(machines, day, minutes, seeds, {k: tuple(v) for k, v in reports.items()},
                       tuple(oracles) if oracles else None, identical)


def summary(f: FleetResult) -> dict:
    rows = {}
    for strategy, reps in sorted(f.reports.items()):
        rows[strategy] = {
            "served_demand": round(_median([r.served_demand for r in reps]), 4),
            "least_feasible_workload_service": round(_median([r.least_feasible_workload_service for r in reps]), 4),
            "slo_attainment": round(_median([r.slo_attainment for r in reps]), 4),
            "churn": sum(r.churn for r in reps),
            "churn_excluding_first": sum(r.churn_excluding_first for r in reps),
            "evening_memory_gib": round(_median([r.evening_memory_gib for r in reps]), 4),
            "evening_to_day_memory": round(_median([_ratio(r.evening_memory_gib, r.memory_mean_gib)
                                                    for r in reps]), 4),
            "safety_violations": sum(r.safety_violations for r in reps),
            # The predictive prefetch scorecard, totals over seeds (lead: median of the medians).
            "prefetch_downloads": sum(r.prefetch_downloads for r in reps),
            "prefetch_hits": sum(r.prefetch_hits for r in reps),
            "prefetch_unused": sum(r.prefetch_unused for r in reps),
            "prefetch_expired": sum(r.prefetch_expired for r in reps),
            "prefetch_reclaimed_gib": round(sum(r.prefetch_reclaimed_gib for r in reps), 4),
            "prefetch_lead_seconds": round(_median([r.prefetch_lead_seconds for r in reps if r.prefetch_hits]), 4),
            "avoided_load_seconds": round(sum(r.avoided_load_seconds for r in reps), 4),
        }
    if f.oracle:
        rows["oracle"] = {
            "served_demand": round(_median([o["served_demand"] for o in f.oracle]), 4),
            "least_feasible_workload_service": round(_median([o["least_feasible_workload_service"] for o in f.oracle]), 4),
            "churn": sum(o["mutations"] for o in f.oracle),
            "churn_excluding_first": sum(o["mutations_excluding_first"] for o in f.oracle),
            "evening_memory_gib": round(_median([o["evening_memory_gib"] for o in f.oracle]), 4),
            "evening_to_day_memory": round(_median([_ratio(o["evening_memory_gib"], o["memory_mean_gib"])
                                                    for o in f.oracle]), 4),
        }
    return rows


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (1.0 if a <= 0 else float("inf"))


def gates(f: FleetResult) -> list[Gate]:
    smart, static, greedy = f.reports[SMART], f.reports[STATIC], f.reports[GREEDY]
    out: list[Gate] = []
    out.append(Gate("identical demand traces", f.machines, f.day, "yes" if f.identical_traces else "no", f.identical_traces))
    violations = sum(r.safety_violations for r in smart)
    out.append(Gate("zero smart safety violations", f.machines, f.day, str(violations), violations == 0))
    s_med = _median([r.served_demand for r in smart])
    st_med = _median([r.served_demand for r in static])
    out.append(Gate("smart serves more than static", f.machines, f.day, f"{s_med:.4f} vs {st_med:.4f}", s_med > st_med))
    s_churn = sum(r.churn for r in smart)
    g_churn = sum(r.churn for r in greedy)
    s_later = sum(r.churn_excluding_first for r in smart)
    g_later = sum(r.churn_excluding_first for r in greedy)
    out.append(Gate(f"smart churn <= {CHURN_SHARE:g}x min-residency-fenced greedy", f.machines, f.day,
                    f"{s_churn} vs {g_churn} ({_ratio(s_churn, g_churn):.2f}x); after first starts "
                    f"{s_later} vs {g_later} ({_ratio(s_later, g_later):.2f}x)",
                    s_churn <= CHURN_SHARE * g_churn))
    out.append(startup_savings_gate(f))
    if f.oracle:
        ratios = [_ratio(r.served_demand, o["served_demand"]) for r, o in zip(smart, f.oracle)]
        m = _median(ratios)
        out.append(Gate(f"smart >= {ORACLE_SERVICE} of oracle service", f.machines, f.day, f"{m:.4f}", m >= ORACLE_SERVICE))
        least = [_ratio(r.least_feasible_workload_service, o["least_feasible_workload_service"])
                 for r, o in zip(smart, f.oracle)]
        m = _median(least)
        out.append(Gate(f"least-workload service >= {LEAST_SERVICE} of oracle", f.machines, f.day, f"{m:.4f}",
                        m >= LEAST_SERVICE))
        mem = [_ratio(r.evening_memory_gib, o["evening_memory_gib"]) for r, o in zip(smart, f.oracle)]
        m = _median(mem)
        s_ev = _median([r.evening_memory_gib for r in smart])
        o_ev = _median([o["evening_memory_gib"] for o in f.oracle])
        out.append(Gate(f"evening memory <= {EVENING_MEMORY}x oracle", f.machines, f.day,
                        f"{m:.3f}x (medians: smart {s_ev:.1f}G, oracle {o_ev:.1f}G)", m <= EVENING_MEMORY))
    else:
        for name in (f"smart >= {ORACLE_SERVICE} of oracle service", f"least-workload service >= {LEAST_SERVICE} of oracle",
                     f"evening memory <= {EVENING_MEMORY}x oracle"):
            out.append(Gate(name, f.machines, f.day, "oracle not run (fleet beyond its bounds)", True, applies=False))
    return out


def startup_savings_gate(f: FleetResult) -> Gate:
    """Predictive startup savings over reactive-only control: the transfer seconds smart's
    prefetch cache hits avoided, less reactive's (which stages none), summed over seeds. It
    applies wherever some prediction found no serving slot, so smart downloaded something: where
    every prediction was warmed in a slot of its own there is nothing for a cache to save.
    Downloads that no placement used then fail it (a predictor that only fills disk does not
    pass)."""
    name = "predictive startup savings over reactive > 0"
    smart = sum(r.avoided_load_seconds for r in f.reports[SMART])
    reactive = sum(r.avoided_load_seconds for r in f.reports[REACTIVE])
    hits = sum(r.prefetch_hits for r in f.reports[SMART])
    downloads = sum(r.prefetch_downloads for r in f.reports[SMART])
    if downloads == 0:
        return Gate(name, f.machines, f.day, "no prefetch: every prediction had a serving slot", True,
                    applies=False)
    gain = smart - reactive
    return Gate(name, f.machines, f.day,
                f"{gain:.0f}s avoided load (smart {smart:.0f}s from {hits} hits of {downloads} downloads, "
                f"reactive {reactive:.0f}s)", gain > 0)


def render(results: list[FleetResult]) -> str:
    lines = []
    for f in results:
        lines.append(f"fleet {f.machines} machines, {f.day} day ({f.minutes} min), seeds {','.join(map(str, f.seeds))}")
        lines.append(f"  {'strategy':<10}{'served':>9}{'least':>9}{'SLO':>9}{'churn':>7}{'later':>7}{'evening':>10}"
                     f"{'eve/day':>9}{'unsafe':>8}")
        for strategy, row in summary(f).items():
            slo = f"{row['slo_attainment']:>9.4f}" if "slo_attainment" in row else f"{'-':>9}"
            unsafe = row.get("safety_violations", "-")
            lines.append(f"  {strategy:<10}{row['served_demand']:>9.4f}{row['least_feasible_workload_service']:>9.4f}"
                         f"{slo}{row['churn']:>7}{row['churn_excluding_first']:>7}{row['evening_memory_gib']:>9.1f}G"
                         f"{row['evening_to_day_memory']:>9.2f}{unsafe:>8}")
    lines.append("")
    lines.append("  later: churn after each machine's first start of each model; evening: mean resident memory "
                 "in the cooldown phase; eve/day: that over the day's mean")
    lines.append("predictive prefetch (totals over seeds)")
    for f in results:
        rows = summary(f)
        for strategy in (SMART, REACTIVE):
            r = rows[strategy]
            lines.append(f"  [{f.machines:>2} machines, {f.day}] {strategy:<9} downloads {r['prefetch_downloads']}, "
                         f"hits {r['prefetch_hits']}, unused {r['prefetch_unused']}, expired {r['prefetch_expired']} "
                         f"({r['prefetch_reclaimed_gib']:.1f}G reclaimed), lead {r['prefetch_lead_seconds']:.0f}s, "
                         f"avoided load {r['avoided_load_seconds']:.0f}s")
    lines.append("gates")
    for f in results:
        for g in gates(f):
            verdict = "PASS" if g.passed and g.applies else ("n/a " if not g.applies else "FAIL")
            lines.append(f"  {verdict}  [{g.fleet:>2} machines, {g.day}] {g.name}: {g.measured}")
    return "\n".join(lines)


def to_dict(results: list[FleetResult]) -> dict:
    return {
        "fleets": [{"machines": f.machines, "day": f.day, "minutes": f.minutes, "seeds": list(f.seeds), "summary": summary(f),
                    "gates": [{"name": g.name, "measured": g.measured, "passed": g.passed, "applies": g.applies}
                              for g in gates(f)]} for f in results],
        "passed": all(g.passed for f in results for g in gates(f)),
    }


def passed(results: list[FleetResult]) -> bool:
    return all(g.passed for f in results for g in gates(f))
