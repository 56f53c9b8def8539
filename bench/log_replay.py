"""Replay throughput: folding the fleet projection from JetStream vs raw ordered consumption.

Same run, same stream: (1) raw nats-py ordered consumer reading every message without decoding,
(2) ProjectionRunner catch-up (decode + fleet/actions folds) through our JetStream log.
Also the DuckDB sink's rows per second over heartbeats and batched request features.

    python -m bench.log_replay [--events 30000] [--hosts 256]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from nats.js import api

from bench._common import Timer, embedded_server, heartbeat, request_record
from grid.analytics.sink import AnalyticsSink, open_store
from grid.events import codec
from grid.events.requests import RequestBatch
from grid.events.subjects import HOSTS_STREAM, REQUESTS_STREAM, subject_for
from grid.projections.runner import ACTIONS, FLEET, ProjectionRunner
from grid.transport.jetstream import JetStreamLog


async def fill(log: JetStreamLog, events: int, hosts: int) -> None:
    js = log.client.jetstream()
    window = 256
    for start in range(0, events, window):
        chunk = [heartbeat(i, hosts) for i in range(start, min(events, start + window))]
        await asyncio.gather(*(js.publish(subject_for(e), codec.encode(e)) for e in chunk))


async def raw_ordered(log: JetStreamLog, stream: str, subject: str, total: int) -> int:
    js = log.client.jetstream()
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True,
                             config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
                             pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
    n = 0
    try:
        # The fastest plain nats-py loop: the subscription's message iterator (no per-message task).
        async for _msg in sub.messages:
            n += 1
            if n >= total:
                break
    finally:
        await sub.unsubscribe()
    return n


async def main(events: int, hosts: int, rounds: int) -> None:
    with embedded_server() as server:
        log = await JetStreamLog.connect(server.url)
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
            assert len(runner["fleet"].hosts) == hosts
        raw, ours = max(raw_rates), max(fold_rates)
        print(f"replay events/s  fleet projection={ours:,.0f}  raw ordered consumption={raw:,.0f}  "
              f"ratio={ours / raw:.2f} (goal >= 0.7; {total} heartbeats of {hosts} hosts)")

        records = tuple(request_record(i) for i in range(256))
        js = log.client.jetstream()
        for i in range(0, 400, 50):
            await asyncio.gather(*(js.publish(subject_for(b), codec.encode(b)) for b in (
                RequestBatch(event_id=f"rb-{j}", at=0.0, source="bench", records=records) for j in range(i, i + 50))))
        with tempfile.TemporaryDirectory() as d:
            con = open_store(Path(d) / "bench.duckdb")
            sink = AnalyticsSink(con)
            with Timer() as t:
                await sink.sync(log, streams=(HOSTS_STREAM, REQUESTS_STREAM))
            rows = sink.rows_written
            print(f"DuckDB sink end to end (JetStream read + decode + insert) rows/s = {rows / t.seconds:,.0f} ({rows:,} rows)")
            # The sink alone: the same messages already in memory, decoded and batch-inserted.
            messages = []
            for name in (HOSTS_STREAM, REQUESTS_STREAM):
                messages += [m async for m in log.replay(name)]
            fresh = AnalyticsSink(open_store(Path(d) / "bench2.duckdb"))
            with Timer() as t:
                for m in messages:
                    fresh.add(m)
                    if fresh.pending_rows() >= fresh.batch_rows:
                        fresh.flush()
                fresh.flush()
            print(f"DuckDB sink rows/s = {fresh.rows_written / t.seconds:,.0f} (decode + batched insert; goal >= 100,000/s)")
            # Idempotence: a second pass over the same window writes nothing new.
            again = AnalyticsSink(con)
            await again.sync(log, streams=(HOSTS_STREAM, REQUESTS_STREAM))
            count = con.execute("SELECT count(*) FROM request_features").fetchone()[0]
            print(f"re-run rows written = {again.rows_written}, request_features rows = {count:,}")
            con.close()
        await log.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=30000)
    p.add_argument("--hosts", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    asyncio.run(main(a.events, a.hosts, a.rounds))
