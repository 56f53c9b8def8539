"""Controller tick benchmark: a full tick against a real embedded nats-server.

For 64, 512 and 4096 simulated hosts (heartbeats in GRID_HOSTS, 32 model profiles asking for
about half the fleet in replicas, half the hosts already serving one model, automatic mode),
a Controller catches up from the log, then its tick is timed:

* cold tick   - (planner and forecast warmed up first, untimed) projection read, forecast,
                plan, plan appended (expected-sequence CAS),
                reconcile, and every admitted command published (governor raised so the whole
                first wave goes out) and folded back;
* steady tick - the same fleet a moment later: plan unchanged (not re-appended), open commands
                suppressed, nothing published (median of 5; the most commands a steady
                tick still published or withdrew is printed as "re-issued").

* pure tick   - the production tick without I/O on the caught-up projection states
                (grid.controller.tick.run_tick: observe, forecast, plan, reconcile) and its
                decision made into commands (grid.controller.issue.decision_events), median of
                3: once before the cold tick (the whole first wave) and once after the steady
                ticks (open commands suppressed).

Baseline measured in the same run: the planner alone on the same PlannerInput (median of 3).
The CPU columns are the controller tick's own CPU time (`TickReport.cpu_ms`: the thread CPU of
its pure part, which runs on a worker thread) for the cold tick and the median steady tick: the
tick's duration less this is waiting (the GIL, the log, the lease).
The ratio columns are tick / plan-only: what the tick, and the controller around it, add to
the planner.

    python bench/controller_tick.py [--hosts 64,512,4096]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import embedded_server  # noqa: E402
from grid.controller.governor import Limits  # noqa: E402
from grid.controller.service import Controller, ControllerSettings  # noqa: E402
from grid.controller.issue import Issuer, decision_events  # noqa: E402
from grid.controller.tick import Controls, run_tick  # noqa: E402
from grid.events.base import new_event_id  # noqa: E402
from grid.events.control import ModelProfile, ModeSet, ProfileSet  # noqa: E402
from grid.events.host import HostHeartbeat, HostResources, Residency  # noqa: E402
from grid.events.plan import make_generation  # noqa: E402
from grid.events.subjects import ALL_STREAMS, LEASE_BUCKET  # noqa: E402
from grid.fleet.planning import Policy  # noqa: E402
from grid.planner.plan import plan  # noqa: E402
from grid.transport.jetstream import JetStreamLog  # noqa: E402

MODELS = 32
ISSUER = Issuer(controller_id="bench", controller_term=1, generation=make_generation("bench", 1, "bench"))


def pure_tick(states, controls: Controls, runs: int = 3) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Median seconds of the whole pure tick through its commands, and how many commands it made."""
    seconds = []
    for _ in range(runs):
        now = time.time()
        t0 = time.perf_counter()
        tick = run_tick(states, now, controls)
        events = decision_events(tick.result, ISSUER, at=now, lease_remaining=60.0)
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds), len(events)


def heartbeat(i: int, now: float) -> HostHeartbeat:
    serving = ()
    if i % 2 == 0:
        serving = (Residency(model_id=f"model-{i % MODELS:02d}.gguf", memory_mb=6000, state="ready",
                             loaded_age_seconds=3600.0, last_used_age_seconds=5.0, active_requests=i % 3),)
    return HostHeartbeat(
        event_id=f"hb-{i}-{now}", at=now, host_id=f"host-{i:05d}",
        resources=HostResources(capacity_mb=32768, reserved_mb=2048, failure_domain=f"rack-{i % 16}",
                                tags=("gpu",), gpu_count=1, gpu_memory_mb=24576),
        residencies=serving, disk_free_bytes=200 << 30, disk_total_bytes=500 << 30,
    )


async def reset(log: JetStreamLog) -> None:
    js = log.client.jetstream()
    for name in ALL_STREAMS:
        try:
            await js.delete_stream(name)
        except Exception:
            pass
    try:
        await js.delete_key_value(LEASE_BUCKET)
    except Exception:
        pass
    log._kv.clear()
    await log.ensure_streams()


async def publish_all(log: JetStreamLog, events: list, concurrency: int = 64) -> None:  # type: ignore[type-arg]
    sem = asyncio.Semaphore(concurrency)

    async def one(ev) -> None:  # type: ignore[no-untyped-def]
        async with sem:
            await log.append(ev)

    await asyncio.gather(*(one(e) for e in events))


async def cell(url: str, hosts: int) -> dict[str, float]:
    log = await JetStreamLog.connect(url, name="bench")
    await reset(log)
    now = time.time()
    replicas = max(1, hosts // (2 * MODELS))
    profiles = [ModelProfile(model_id=f"model-{m:02d}.gguf", memory_mb=6000, min_replicas=replicas,
                             max_replicas=replicas, min_residency_seconds=0.0, scale_down_cooldown_seconds=0.0)
                for m in range(MODELS)]
    t0 = time.perf_counter()
    await publish_all(log, [ProfileSet(event_id=new_event_id(), at=now, profile=p) for p in profiles])
    await publish_all(log, [heartbeat(i, now) for i in range(hosts)])
    await log.append(ModeSet(event_id=new_event_id(), at=now, mode="automatic"))
    ingest = time.perf_counter() - t0

    # The heartbeats are appended once, before the controller starts: they must stay fresh for
    # the planner (Policy) and the reconciler (Limits) through every timed tick, or a slow cell
    # (10,000 hosts on a loaded machine) plans the fleet away half way and "re-issues" all of it.
    settings = ControllerSettings(
        background_ticks=False, restart_grace_seconds=0.0, lease_ttl_seconds=60.0, lease_renew_seconds=20.0,
        limits=Limits(max_global_mutations=hosts, max_host_mutations=8, artifact_fanout=hosts,
                      heartbeat_timeout_seconds=600.0),
        policy=Policy(heartbeat_timeout_seconds=600.0),
    )
    with tempfile.TemporaryDirectory(prefix="grid-bench-ctl-") as home:
        ctl = Controller(log, Path(home), settings=settings, controller_id="bench")
        t0 = time.perf_counter()
        await ctl.start()
        catch_up = time.perf_counter() - t0
        try:
            controls = Controls(policy=settings.policy, mode="automatic", limits=settings.limits)
            # Warm the planner and forecast (first-call costs) on this very input, untimed.
            run_tick(ctl.runner.states, time.time(), controls)
            pure_cold, pure_cold_n = pure_tick(ctl.runner.states, controls)
            t0 = time.perf_counter()
            cold = await ctl.tick("bench-cold")
            cold_s = time.perf_counter() - t0
            assert cold.error is None, cold.error
            steady = []
            steady_cpu = []
            steady_churn = 0
            for _ in range(5):
                t0 = time.perf_counter()
                report = await ctl.tick("bench-steady")
                steady.append(time.perf_counter() - t0)
                steady_cpu.append(report.cpu_ms)
                # Expected 0: a steady tick re-publishing is a finding, printed with the figures.
                steady_churn = max(steady_churn, report.published + report.withdrawn)
            pure_steady, _ = pure_tick(ctl.runner.states, controls)
            pin = ctl.last_input
            assert pin is not None
            plan_only = []
            for _ in range(3):
                t0 = time.perf_counter()
                plan(pin)
                plan_only.append(time.perf_counter() - t0)
        finally:
            await ctl.stop()
    await log.close()
    return {
        "hosts": hosts, "ingest_s": ingest, "catch_up_s": catch_up, "cold_s": cold_s,
        "published": cold.published, "cold_cpu_ms": cold.cpu_ms, "steady_cpu_ms": statistics.median(steady_cpu),
        "cold_plan_ms": cold.plan_ms, "cold_reconcile_ms": cold.reconcile_ms,
        "cold_publish_ms": cold.publish_ms, "steady_s": statistics.median(steady),
        "plan_only_s": statistics.median(plan_only), "pure_cold_s": pure_cold, "pure_cold_commands": pure_cold_n,
        "pure_steady_s": pure_steady, "steady_churn": steady_churn,
    }


async def main(host_counts: list[int]) -> None:
    rows = []
    with embedded_server() as server:
        for n in host_counts:
            rows.append(await cell(server.url, n))
    print("controller tick and pure tick vs plan-only (same PlannerInput, same run); real nats-server, "
          "sync_interval always")
    head = (f"{'hosts':>6} {'catch-up':>9} {'cold tick':>10} {'published':>9} {'publish':>9} "
            f"{'reconcile':>9} {'steady':>9} {'re-issued':>9} {'pure cold':>10} {'commands':>8} {'pure steady':>11} "
            f"{'plan-only':>10} {'cold/plan':>9} {'steady/plan':>11} {'pure cold/plan':>14} {'pure steady/plan':>16} "
            f"{'cold CPU':>9} {'steady CPU':>10}")
    print(head)
    for r in rows:
        base = r["plan_only_s"]
        print(f"{r['hosts']:>6} {r['catch_up_s'] * 1000:>7.0f}ms {r['cold_s'] * 1000:>8.1f}ms {r['published']:>9} "
              f"{r['cold_publish_ms']:>7.0f}ms {r['cold_reconcile_ms']:>7.1f}ms {r['steady_s'] * 1000:>7.1f}ms "
              f"{r['steady_churn']:>9} {r['pure_cold_s'] * 1000:>8.1f}ms {r['pure_cold_commands']:>8} {r['pure_steady_s'] * 1000:>9.1f}ms "
              f"{base * 1000:>8.1f}ms {r['cold_s'] / base:>8.2f}x {r['steady_s'] / base:>10.2f}x "
              f"{r['pure_cold_s'] / base:>13.2f}x {r['pure_steady_s'] / base:>15.2f}x "
              f"{r['cold_cpu_ms']:>7.0f}ms {r['steady_cpu_ms']:>8.0f}ms")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", default="64,512,4096")
    args = ap.parse_args()
    asyncio.run(main([int(x) for x in args.hosts.split(",")]))
