"""Replay throughput for a generated day of a 256-host fleet, against raw ordered consumption.

The day is written to a real embedded nats-server (file store, sync_interval: always):
heartbeats from every host every 10 s (residencies follow the latest plan, as agents would),
one RequestBatch per second of realistic bounded request features (diurnal rate, Zipf model
popularity, workloads, lognormal service times, a few errors, hashed affinity keys), and a
tick per minute the controller's way: the production tick (grid.controller.tick.run_tick:
observe, forecast, plan, reconcile in automatic mode) on its folded projections, the plan
recorded (based_on = the positions folded), the decision's commands
(grid.controller.issue.decision_events) appended and acked by their hosts. The generator
prints the whole tick's time (fold through commands) against the planner's share of it, both
measured in this run. Then, in the same run:

1. raw: a nats-py ordered consumer reads every message of the folded streams, no decoding;
2. replay from JetStream: ``replay_window(LogSource)`` folds everything and re-runs every plan;
3. replay from DuckDB: the analytics sink copies the log into DuckDB (timed separately), then
   ``replay_window(DuckDBSource)`` does the same from the store.

Events per second = events folded (plus plans read) / wall time of the replay, including the
planner re-runs; the figure without planner time is printed too.

    python -m bench.replay [--hours 24] [--hosts 256] [--rate 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import math
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from nats.js import api

from bench._common import Timer, embedded_server
from grid.analytics.sink import AnalyticsSink, open_store
from grid.controller.issue import Issuer, decision_events
from grid.controller.tick import PROJECTIONS, Controls, encode_policy, run_tick
from grid.events import codec
from grid.events.acks import ActionAck
from grid.events.commands import CommandIssued
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.events.host import HostHeartbeat, HostLoad, HostResources, Residency
from grid.events.plan import PlanCreated, make_generation
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import (
    COMMANDS_STREAM,
    HOSTS_STREAM,
    PLANS_STREAM,
    REQUESTS_STREAM,
    STREAM_SUBJECTS,
    subject_for,
)
from grid.fleet.planning import Policy
from grid.projections.runner import ProjectionRunner
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from replay.extract import DuckDBSource, LogSource, Window
from replay.rerun import Progress, encode_plan, inputs_digest, replay_window

T0 = 1_800_000_000.0
WORKLOADS = ("coding", "research", "marketing", "sales", "general", "embedding")


class Fleet:
    def __init__(self, hosts: int, models: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.hosts = [f"host-{i:04d}" for i in range(hosts)]
        self.models = [f"model-{i:02d}.Q4_K_M.gguf" for i in range(models)]
        self.resources = {
            h: HostResources(
                capacity_mb=(24_576, 49_152, 81_920)[i % 3], reserved_mb=2048, backends=("cuda",) if i % 4 else ("metal",),
                failure_domain=f"rack-{i % 8}", tags=("gpu",) if i % 4 else ("mac",), gpu_count=1,
                gpu_memory_mb=(24_576, 49_152, 81_920)[i % 3], memory_bandwidth_gbps=400.0 + 100 * (i % 5),
            )
            for i, h in enumerate(self.hosts)
        }
        self.residencies: dict[str, dict[str, int]] = {h: {} for h in self.hosts}
        # Zipf popularity over models.
        weights = [1.0 / (k + 1) ** 1.1 for k in range(models)]
        total = sum(weights)
        self.popularity = [w / total for w in weights]

    def profiles(self) -> list[ModelProfile]:
        return [
            ModelProfile(
                model_id=m, memory_mb=(4000, 8000, 16000, 30000)[i % 4], min_replicas=1 + (i < 4) * 3,
                max_replicas=16, priority=(i < 8) * 10, backends=(), artifact_sha256=hashlib.sha256(m.encode()).hexdigest(),
                workload_scores={WORKLOADS[i % len(WORKLOADS)]: 0.9, "general": 0.5},
                expected_service_seconds=1.5 + (i % 5), latency_slo_ms=8000.0, replica_concurrency=4,
            )
            for i, m in enumerate(self.models)
        ]

    def heartbeat(self, host: str, n: int, at: float) -> HostHeartbeat:
        rng = self.rng
        return HostHeartbeat(
            event_id=f"hb-{n}", at=at, host_id=host, resources=self.resources[host],
            residencies=tuple(
                Residency(model_id=m, memory_mb=mb, state="ready", loaded_age_seconds=3600.0,
                          last_used_age_seconds=rng.choice((1.0, 5.0, 30.0)), active_requests=rng.randrange(3),
                          max_concurrency=4, endpoint=f"http://10.1.{self.hosts.index(host) // 250}.{self.hosts.index(host) % 250}:{20000 + k}")
                for k, (m, mb) in enumerate(sorted(self.residencies[host].items()))
            ),
            disk_free_bytes=200 << 30, disk_total_bytes=1 << 40,
            load=HostLoad(active_tasks=rng.randrange(4), queue_depth=rng.randrange(2), cpu_percent=round(rng.uniform(5, 80), 1)),
        )

    def batch(self, n: int, second: float, rate: float) -> RequestBatch:
        rng = self.rng
        # Diurnal: a quiet night, a busy afternoon.
        level = rate * (0.35 + 0.65 * (0.5 - 0.5 * math.cos(2 * math.pi * ((second / 86_400.0) % 1.0))))
        count = max(0, int(rng.gauss(level, math.sqrt(level + 1))))
        records = []
        for _ in range(count):
            auto = rng.random() < 0.15
            model = rng.choices(self.models, self.popularity)[0]
            served = model if not auto else rng.choices(self.models, self.popularity)[0]
            outcome = "ok" if rng.random() > 0.01 else rng.choice(("error", "timeout", "unavailable"))
            records.append(RequestFeatures(
                endpoint="embeddings" if model.endswith("07.Q4_K_M.gguf") else "chat",
                requested_model="auto" if auto else model, served_model=served, auto=auto,
                host_id=rng.choice(self.hosts), workload=rng.choice(WORKLOADS),
                input_units=int(rng.lognormvariate(5.5, 1.0)), output_units=int(rng.lognormvariate(4.5, 1.0)),
                service_seconds=round(rng.lognormvariate(0.3, 0.8), 3), queue_seconds=round(rng.expovariate(20), 3),
                queue_depth=rng.randrange(3), outcome=outcome,  # type: ignore[arg-type]
                status_code=200 if outcome == "ok" else 503, finished_at=T0 + second,
                affinity=f"{rng.randrange(5000):064x}" if rng.random() < 0.3 else None,
                artifact_sha256=hashlib.sha256(served.encode()).hexdigest(),
            ))
        return RequestBatch(event_id=f"rb-{n}", at=T0 + second, source="gateway-1", records=tuple(records))


async def wait_ingested(log: JetStreamLog, expected: dict[str, int]) -> None:
    await log.client.flush()
    for stream, n in expected.items():
        while await log.last_sequence(stream) < n:
            await asyncio.sleep(0.005)


async def generate(log: JetStreamLog, hours: float, hosts: int, models: int, rate: float, seed: int) -> dict[str, Any]:
    fleet = Fleet(hosts, models, seed)
    nc = log.client
    runner = ProjectionRunner(PROJECTIONS)
    policy = Policy()
    controls = Controls(policy=policy, mode="automatic")
    await log.append(ModeSet(event_id="mode", at=T0, mode="automatic"))
    for p in fleet.profiles():
        await log.append(ProfileSet(event_id=f"profile-{p.model_id}", at=T0, profile=p))
    published = {HOSTS_STREAM: 0, REQUESTS_STREAM: 0, COMMANDS_STREAM: 0}
    seconds = int(hours * 3600)
    n = 0
    # Seconds of the whole tick (fold, forecast, plan, reconcile, commands) and of its parts.
    timed = {"tick": 0.0, "fold": 0.0, "forecast": 0.0, "plan": 0.0, "reconcile": 0.0, "issue": 0.0}
    commands = 0
    plans = 0
    for second in range(seconds):
        if second % 10 == 0:
            for h in fleet.hosts:
                n += 1
                hb = fleet.heartbeat(h, n, T0 + second)
                await nc.publish(subject_for(hb), codec.encode(hb))
                published[HOSTS_STREAM] += 1
        n += 1
        rb = fleet.batch(n, second, rate)
        if rb.records:
            await nc.publish(subject_for(rb), codec.encode(rb))
            published[REQUESTS_STREAM] += 1
        if second % 60 == 59:
            await wait_ingested(log, published)
            t_fold = time.perf_counter()
            await runner.catch_up(log)
            t_tick = time.perf_counter()
            now = time.time()
            tick = run_tick(runner.states, now, controls, stopwatch=time.perf_counter)
            pin, plan = tick.planner_input, tick.plan
            digest = inputs_digest(pin)
            plans += 1
            t_issue = time.perf_counter()
            decision = decision_events(tick.result, Issuer(
                controller_id="bench-controller", controller_term=1,
                generation=make_generation("bench", plans, digest)), at=now, lease_remaining=30.0)
            t_end = time.perf_counter()
            timed["fold"] += t_tick - t_fold
            timed["forecast"] += tick.planned.forecast_seconds
            timed["plan"] += tick.planned.plan_seconds
            timed["reconcile"] += tick.reconcile_seconds
            timed["issue"] += t_end - t_issue
            timed["tick"] += t_end - t_fold
            event = PlanCreated(
                event_id=f"plan-{plans}", at=now, planner_version=plan.planner_version,
                generation=make_generation("bench", plans, digest), epoch="bench", sequence=plans,
                inputs_digest=digest, based_on=dict(sorted(runner.positions.items())), now=now,
                controller_id="bench-controller", controller_term=1, plan=msgspec.Raw(encode_plan(plan)),
                policy=encode_policy(policy),
            )
            await log.append(event, expected_last_subject_seq=runner.positions.get(PLANS_STREAM, 0))
            for ev in decision:
                await nc.publish(subject_for(ev), codec.encode(ev))
                published[COMMANDS_STREAM] += 1
                if isinstance(ev, CommandIssued):
                    commands += 1
                    n += 1
                    ack = ActionAck(event_id=f"ack-{n}", at=now, host_id=ev.host_id, action_id=ev.action_id,
                                    status="succeeded", kind=ev.kind, model_id=ev.model_id,
                                    generation=ev.generation, controller_term=ev.controller_term)
                    await nc.publish(subject_for(ack), codec.encode(ack))
                    published[HOSTS_STREAM] += 1
            # The agents converge to the plan (and ack its commands) before their next heartbeat.
            fleet.residencies = {h: {} for h in fleet.hosts}
            for p in plan.placements:
                fleet.residencies[p.host_id][p.model_id] = p.memory_mb
    await wait_ingested(log, published)
    return {"plans": plans, "timed": timed, "commands": commands, "heartbeats": published[HOSTS_STREAM] - commands,
            "batches": published[REQUESTS_STREAM]}


async def raw_ordered(log: JetStreamLog, streams: tuple[str, ...]) -> tuple[int, float]:
    js = log.client.jetstream()
    n = 0
    with Timer() as t:
        for stream in streams:
            total = await log.last_sequence(stream)
            if not total:
                continue
            sub = await js.subscribe(STREAM_SUBJECTS[stream][0], stream=stream, ordered_consumer=True,
                                     config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
                                     pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
            try:
                async for msg in sub.messages:
                    n += 1
                    if int(msg.reply.split(".")[5]) >= total:
                        break
            finally:
                await sub.unsubscribe()
    return n, t.seconds


class Count(Progress):
    def __init__(self) -> None:
        self.events = 0

    def start(self, events_total: int, plans_total: int) -> None:
        self.total = events_total

    def advance(self, events: int = 0, plans: int = 0) -> None:
        self.events += events


def report(name: str, result: Any, seconds: float, raw_rate: float) -> float:
    planner = sum(p.plan_seconds for p in result.plans)
    events = result.events_folded + result.summary.plans_compared
    rate = events / seconds
    s = result.summary
    print(f"replay from {name:<9}: {rate:12,.0f} events/s ({events:,} events, {s.plans_compared} plans in {seconds:.1f}s; "
          f"planner {planner:.1f}s -> {events / max(seconds - planner, 1e-9):,.0f} events/s without it)  "
          f"ratio to raw = {rate / raw_rate:.2f}")
    print(f"    plans identical={s.identical} equivalent={s.equivalent} differing={s.differing} "
          f"digest mismatches={s.digest_mismatches}")
    for w in result.warnings:
        print(f"    warning: {w[:200]}")
    return rate


@contextlib.contextmanager
def server_for(sync_always: bool) -> Iterator[EmbeddedNats]:
    if sync_always:
        with embedded_server() as server:
            yield server
        return
    # Generating a day with an fsync per message takes most of an hour; reading (what is measured)
    # is unaffected by the write-sync setting, so the generator's server skips it by default.
    with tempfile.TemporaryDirectory(prefix="grid-bench-replay-") as d:
        server = EmbeddedNats(Path(d), sync_always=False)
        server.start()
        try:
            yield server
        finally:
            server.stop()


async def main(args: argparse.Namespace) -> None:
    with server_for(args.sync_always) as server:
        log = await JetStreamLog.connect(server.url)
        with Timer() as t:
            gen = await generate(log, args.hours, args.hosts, args.models, args.rate, args.seed)
        print(f"generated {args.hours:g} h of a {args.hosts}-host fleet in {t.seconds:.1f}s: {gen['heartbeats']:,} heartbeats, "
              f"{gen['batches']:,} request batches, {gen['plans']} ticks, {gen['commands']:,} commands")
        tm = gen["timed"]
        per = 1000.0 / max(1, gen["plans"])
        print(f"whole tick (fold through commands): {tm['tick'] * per:.1f} ms/tick = fold {tm['fold'] * per:.1f} + "
              f"forecast {tm['forecast'] * per:.1f} + plan {tm['plan'] * per:.1f} + reconcile {tm['reconcile'] * per:.1f} "
              f"+ commands {tm['issue'] * per:.1f} (+ digest); ratio to plan-only = {tm['tick'] / max(tm['plan'], 1e-9):.2f}")
        streams = ProjectionRunner(PROJECTIONS).streams
        stream_sizes = {s: await log.last_sequence(s) for s in streams}
        print("stream sizes: " + ", ".join(f"{s}={n:,}" for s, n in stream_sizes.items()))

        n_raw, raw_seconds = await raw_ordered(log, streams)
        raw_rate = n_raw / raw_seconds
        print(f"raw ordered consumption  : {raw_rate:12,.0f} msgs/s ({n_raw:,} messages in {raw_seconds:.1f}s, no decoding)")

        with Timer() as t:
            result = await replay_window(LogSource(log), Window(), progress=Count())
        js_rate = report("JetStream", result, t.seconds, raw_rate)

        with tempfile.TemporaryDirectory(prefix="grid-bench-replay-") as d:
            con = open_store(Path(d) / "analytics.duckdb")
            sink = AnalyticsSink(con)
            with Timer() as t:
                await sink.sync(log)
            sink.close()
            print(f"analytics sink sync      : {sink.rows_written:,} rows in {t.seconds:.1f}s (not part of the replay figure)")
            with Timer() as t:
                result = await replay_window(DuckDBSource(con), Window(), progress=Count())
            db_rate = report("DuckDB", result, t.seconds, raw_rate)
            con.close()
        print(f"summary: JetStream {js_rate:,.0f} events/s, DuckDB {db_rate:,.0f} events/s, raw ordered {raw_rate:,.0f} msgs/s; "
              f"ratios {js_rate / raw_rate:.2f} / {db_rate / raw_rate:.2f}")
        await log.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--hosts", type=int, default=256)
    p.add_argument("--models", type=int, default=32)
    p.add_argument("--rate", type=float, default=30.0, help="mean requests per second fleet-wide (peak ~1x, night ~0.35x)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--sync-always", action="store_true", help="fsync every write while generating (the production setting)")
    asyncio.run(main(p.parse_args()))
