"""Joint portfolio search benchmark: its cost per controller tick, against one planner call.

Runs the scenario lab's production tick (grid.controller.tick via the smart strategy) over a
simulated workday and times, on every tick, the joint portfolio search
(grid.demand.portfolio.search: the forecasts and planner calls of its counterfactuals) and one
plan() call on that tick's final planner input. The baseline is that single plan() call,
measured in the same run on the same inputs; the ratio says how many plans a tick's search
costs. Cells: the 16-host fleet with all 9 lab models (the size the issue names) and the seed's scarce
4-host fleet, where the search actually explores.

    python -m bench.portfolio_search            # 16 hosts x 9 models x 200 users x 120 min, and 4 hosts
    python -m bench.portfolio_search --minutes 30
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

from grid.demand import portfolio as pm
from grid.planner import plan as planner_plan
from grid.sim.run import run
from grid.sim.scenario import ScenarioConfig, prepare


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def cell(machines: int, models: int, users: int, minutes: int, seed: int) -> dict:
    sc = prepare(ScenarioConfig(machines=machines, models=models, users=users, minutes=minutes, seed=seed))
    search_s: list[float] = []
    evaluations: list[int] = []
    reasons: Counter[str] = Counter()
    plan_s: list[float] = []
    original = pm.search

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        result, fc = original(*args, **kwargs)
        search_s.append(time.perf_counter() - t0)
        evaluations.append(result.evaluations)
        reasons[result.reason] += 1
        return result, fc

    def on_tick(minute, pin, plan, result) -> None:  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        planner_plan.plan(pin)
        plan_s.append(time.perf_counter() - t0)

    pm.search = timed  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        run(sc, "smart", on_tick=on_tick)
        wall = time.perf_counter() - t0
    finally:
        pm.search = original  # type: ignore[assignment]
    searched = [s for s, n in zip(search_s, evaluations) if n > 1]
    plan_med = statistics.median(plan_s)
    return {
        "cell": f"{machines} hosts x {models} models x {users} users x {minutes} min",
        "ticks": len(search_s), "wall_s": wall,
        "search_med_ms": 1000 * statistics.median(search_s), "search_p95_ms": 1000 * _pct(search_s, 0.95),
        "search_max_ms": 1000 * max(search_s),
        "searched_ticks": len(searched),
        "searched_med_ms": 1000 * statistics.median(searched) if searched else 0.0,
        "evals_max": max(evaluations), "plan_med_ms": 1000 * plan_med,
        "ratio_med": statistics.median(search_s) / plan_med,
        "ratio_searched": (statistics.median(searched) / plan_med) if searched else 0.0,
        "reasons": dict(sorted(reasons.items())),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=int, default=120, help="Simulated minutes per cell (one tick a minute).")
    ap.add_argument("--seed", type=int, default=1, help="Scenario seed.")
    args = ap.parse_args()
    for machines, users in ((16, 200), (4, 50)):
        r = cell(machines, 9, users, args.minutes, args.seed)
        print(f"{r['cell']}: {r['ticks']} ticks, run {r['wall_s']:.1f} s")
        print(f"  search per tick   median {r['search_med_ms']:.2f} ms  p95 {r['search_p95_ms']:.2f} ms  "
              f"max {r['search_max_ms']:.2f} ms  (max {r['evals_max']} planner evaluations)")
        print(f"  ticks that searched beyond the start: {r['searched_ticks']}, "
              f"median {r['searched_med_ms']:.2f} ms")
        print(f"  baseline plan()   median {r['plan_med_ms']:.2f} ms")
        print(f"  ratio search/plan median {r['ratio_med']:.2f}x  (searching ticks {r['ratio_searched']:.2f}x)")
        print(f"  reasons {r['reasons']}")


if __name__ == "__main__":
    main()
