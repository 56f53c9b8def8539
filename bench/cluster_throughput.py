"""Append and replay throughput on a 3-node R3 cluster: our EventLog vs raw nats-py, same run.

Three real nats-server processes clustered on loopback ports (file store, sync_interval:
always on each), every stream replicated on all three. Appends: our `append` (msg id, ack
decoding) against raw `js.publish` of the same bytes with the same msg id, the same window of
in-flight publishes, rounds interleaved. Replay: the fleet projection's catch-up through our
log against a raw ordered consumer reading the same stream without decoding.

    python -m bench.cluster_throughput [--events 2000] [--window 64] [--replay-events 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from bench._common import Timer
from bench.log_ingest import append_rates
from bench.log_replay import fill, raw_ordered
from grid.events.subjects import HOSTS_STREAM
from grid.projections.runner import ACTIONS, FLEET, ProjectionRunner
from grid.transport.cluster import NatsCluster
from grid.transport.jetstream import JetStreamLog


async def appends(log: JetStreamLog, events: int, window: int, rounds: int) -> None:
    o, r = await append_rates(log, events, window, rounds)
    print(f"R3 heartbeat appends/s  ours={o:,.0f}  raw nats-py={r:,.0f}  ratio={o / r:.2f} "
          f"(goal >= 0.8; window={window}, {events} events x {rounds} rounds)")


async def replay(log: JetStreamLog, events: int, hosts: int, rounds: int) -> None:
    await fill(log, events, hosts)
    total = await log.last_sequence(HOSTS_STREAM)
    raw_rates, fold_rates = [], []
    for _ in range(rounds):
        with Timer() as t:
            n = await raw_ordered(log, HOSTS_STREAM, "grid.host.>", total)
        raw_rates.append(n / t.seconds)
        runner = ProjectionRunner((FLEET, ACTIONS), strict=True)
        with Timer() as t:
            folded = await runner.catch_up(log)
        fold_rates.append(folded / t.seconds)
    raw, ours = max(raw_rates), max(fold_rates)
    print(f"R3 replay events/s  fleet projection={ours:,.0f}  raw ordered consumption={raw:,.0f}  "
          f"ratio={ours / raw:.2f} (goal >= 0.7; {total} messages in the stream)")


async def main(events: int, window: int, rounds: int, replay_events: int, hosts: int) -> None:
    with tempfile.TemporaryDirectory(prefix="grid-bench-cluster-") as d:
        with NatsCluster(Path(d), nodes=3) as cluster:
            log = await JetStreamLog.connect(cluster.url)
            try:
                assert {r.actual for r in log.replica_reports} == {3}, log.replica_reports
                await appends(log, events, window, rounds)
                await replay(log, replay_events, hosts, rounds)
            finally:
                await log.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=2000)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replay-events", type=int, default=20000)
    p.add_argument("--hosts", type=int, default=256)
    a = p.parse_args()
    asyncio.run(main(a.events, a.window, a.rounds, a.replay_events, a.hosts))
