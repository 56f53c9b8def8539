"""Scenario lab scale: 16 machines x 9 models x 500 users x 2 h must run in under a minute.

Prints the wall time of one smart run (production forecast, planner, reconciler and routing
every simulated minute) and, as the baseline measured in the same run, the time to fold the
same telemetry alone (one heartbeat per machine per minute and every request record through
the real projections, no planning): the ratio is what deciding costs over observing.

Usage: python -m bench.scenario_scale [--machines 16] [--models 9] [--users 500] [--hours 2] [--seed 42]
"""

from __future__ import annotations

import argparse
import time

from grid.controller.tick import PROJECTIONS
from grid.events.control import ModeSet, ProfileSet
from grid.events.requests import MAX_BATCH_RECORDS, RequestBatch, RequestFeatures
from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM, REQUESTS_STREAM
from grid.projections.position import Position
from grid.projections.runner import ProjectionRunner
from grid.sim.run import run
from grid.sim.scenario import EPOCH, ScenarioConfig, prepare
from grid.sim.world import World


def fold_only(sc) -> float:  # type: ignore[no-untyped-def]
    runner = ProjectionRunner(PROJECTIONS)
    world = World(sc.fleet, sc.profiles, EPOCH)
    seqs: dict[str, int] = {}

    def fold(stream: str, at: float, event) -> None:  # type: ignore[no-untyped-def]
        seqs[stream] = seqs.get(stream, 0) + 1
        runner.fold_event(event, Position(stream, seqs[stream], at))

    t0 = time.perf_counter()
    for i, model_id in enumerate(sorted(sc.profiles)):
        fold(CONTROL_STREAM, EPOCH - 1, ProfileSet(event_id=f"p{i}", at=EPOCH - 1, profile=sc.profiles[model_id]))
    fold(CONTROL_STREAM, EPOCH - 1, ModeSet(event_id="mode", at=EPOCH - 1, mode="automatic"))
    for minute, bucket in enumerate(sc.requests):
        now = EPOCH + 60.0 * minute
        for host_id in sorted(world.machines):
            hb = world.heartbeat(host_id, now)
            if hb is not None:
                fold(HOSTS_STREAM, now, hb)
        records = [RequestFeatures(endpoint=r.endpoint, requested_model=r.model, workload=r.workload,
                                   modality=r.modality, input_units=r.input_units, auto=r.model == "auto",
                                   service_seconds=r.service_seconds, affinity=r.affinity) for r in bucket]
        for i in range(0, len(records), MAX_BATCH_RECORDS):
            fold(REQUESTS_STREAM, now + 59.5, RequestBatch(event_id=f"r{minute}-{i}", at=now + 59.5, source="bench",
                                                           records=tuple(records[i:i + MAX_BATCH_RECORDS])))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", type=int, default=16, help="logical machines")
    ap.add_argument("--models", type=int, default=9, help="catalog models")
    ap.add_argument("--users", type=int, default=500, help="simulated users")
    ap.add_argument("--hours", type=float, default=2.0, help="simulated hours")
    ap.add_argument("--seed", type=int, default=42, help="scenario seed")
    args = ap.parse_args()
    cfg = ScenarioConfig(machines=args.machines, models=args.models, users=args.users,
                         minutes=int(args.hours * 60), seed=args.seed)
    t0 = time.perf_counter()
    sc = prepare(cfg)
    t_prepare = time.perf_counter() - t0
    requests = sum(len(b) for b in sc.requests)
    t_fold = fold_only(sc)
    t1 = time.perf_counter()
    report = run(sc, "smart").report()
    t_run = time.perf_counter() - t1
    print(f"scenario {cfg.machines} machines x {cfg.models} models x {cfg.users} users x {cfg.minutes} min, "
          f"{requests} requests")
    print(f"prepare (day + trace)        {t_prepare:8.2f} s")
    print(f"baseline: fold alone         {t_fold:8.2f} s")
    print(f"smart run (full pipeline)    {t_run:8.2f} s   ratio to fold alone {t_run / t_fold:.1f}x")
    print(f"total                        {t_prepare + t_run:8.2f} s   goal < 60 s: {'PASS' if t_prepare + t_run < 60 else 'FAIL'}")
    print(f"served {report.served_demand:.4f}, churn {report.churn}, safety violations {report.safety_violations}")


if __name__ == "__main__":
    main()
