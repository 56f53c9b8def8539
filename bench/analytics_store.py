"""The analytics store at scale: sink ingest vs a plain DuckDB Arrow insert, and query p99.

1. Ingest: N log messages (request completions, and heartbeats with three residencies each)
   through AnalyticsSink (skip what the stored positions already hold, decode, extract columns,
   batched Arrow insert and the positions in one transaction), chunk by chunk. Baseline, same
   run: the very rows the sink extracted, as row tuples, turned into Arrow tables and inserted
   with a plain INSERT into identical tables.
2. Queries at N events in the store: what `gridctl status` asks (demand of the last hour) and
   each `gridctl history` view, over the last hour and over the whole store; p50 and p99.
3. The dashboard's charts (its demand and memory views over the last hour and day, bucketed
   as /api/charts asks), against `gridctl status`'s demand query in the same run.

    python -m bench.analytics_store [--events 1000000] [--chunk 100000] [--reps 30]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from bench._common import heartbeat, request_record
from grid.analytics.history import HistoryParams, run_view
from grid.analytics.schema import TABLES, create_statements
from grid.analytics.columns import ARROW_TYPES
from grid.analytics.sink import AnalyticsSink, open_store
from grid.dashboard.charts import window_for
from grid.events import codec
from grid.events.log import StoredMessage
from grid.events.requests import RequestCompleted
from grid.events.subjects import HOSTS_STREAM, REQUESTS_STREAM, subject_for

T0 = 1_800_000_000.0
HEARTBEAT_EVERY = 10  # one heartbeat per ten messages, like a busy one-host grid


def message(i: int, spacing: float) -> StoredMessage:
    t = T0 + i * spacing
    if i % HEARTBEAT_EVERY == 0:
        event: Any = heartbeat(i)
        stream = HOSTS_STREAM
    else:
        event = RequestCompleted(event_id=f"rc-{i}", at=t, features=request_record(i))
        stream = REQUESTS_STREAM
    return StoredMessage(stream=stream, seq=i + 1, subject=subject_for(event), data=codec.encode(event), time=t)


def plain_insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[tuple[Any, ...]]) -> None:
    columns = TABLES[table][0]
    names = [c for c, _ in columns]
    arrays = [pa.array(list(col), type=ARROW_TYPES[ty]) for col, (_, ty) in zip(zip(*rows), columns)]
    batch = pa.Table.from_arrays(arrays, names=names)  # noqa: F841 (scanned by name below)
    con.execute(f"INSERT INTO {table} SELECT * FROM batch")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main(events: int, chunk: int, reps: int) -> None:
    spacing = 7 * 86400 / events  # a week of history
    with tempfile.TemporaryDirectory(prefix="grid-bench-analytics-") as d:
        sink_con = open_store(Path(d) / "sink.duckdb")
        base_con = duckdb.connect(str(Path(d) / "plain.duckdb"))
        for stmt in create_statements():
            base_con.execute(stmt)
        sink = AnalyticsSink(sink_con, batch_rows=10**12)  # flushed per chunk below
        sink_s = base_s = 0.0
        rows_total = 0
        for start in range(0, events, chunk):
            msgs = [message(i, spacing) for i in range(start, min(events, start + chunk))]
            t = time.perf_counter()
            for m in msgs:
                sink.add(m)
            sink_s += time.perf_counter() - t
            # The baseline's input, taken outside both timings.
            extracted = {k: v.rows() for k, v in sink._rows.items() if len(v)}
            t = time.perf_counter()
            sink.flush()
            sink_s += time.perf_counter() - t
            t = time.perf_counter()
            base_con.execute("BEGIN TRANSACTION")
            for table, rows in extracted.items():
                plain_insert(base_con, table, rows)
            base_con.execute("COMMIT")
            base_s += time.perf_counter() - t
            rows_total += sum(len(v) for v in extracted.values())
        print(f"ingest: {events} events -> {rows_total} rows")
        print(f"  sink (decode + extract + insert): {events / sink_s:,.0f} events/s, {rows_total / sink_s:,.0f} rows/s")
        print(f"  plain Arrow insert of the same rows: {rows_total / base_s:,.0f} rows/s")
        print(f"  ratio sink/plain (rows/s): {base_s / sink_s:.2f}")
        end = T0 + events * spacing
        hour = HistoryParams(start=end - 3600)
        day = end - 86400
        cases = [
            ("status: demand last hour", "demand", hour),
            ("history demand (default: last 24 h, 5 min buckets)", "demand",
             HistoryParams(start=day, bucket_seconds=300)),
            ("history demand (whole store, 5 min buckets)", "demand", HistoryParams(bucket_seconds=300)),
            ("history demand (whole store, no buckets)", "demand", HistoryParams()),
            ("history plans (whole store)", "plans", HistoryParams()),
            ("history commands (whole store)", "commands", HistoryParams()),
            ("history residency (last 24 h)", "residency", HistoryParams(start=day)),
            ("history residency last hour", "residency", hour),
            ("history residency (whole store)", "residency", HistoryParams()),
            ("history workloads last hour", "workloads", hour),
        ]
        charts = []
        for window in (3600.0, 86400.0):
            start, stop, bucket = window_for(end, window)
            params = HistoryParams(start=start, end=stop, bucket_seconds=bucket)
            charts += [(f"dashboard charts demand (last {window / 3600:g} h)", "demand", params),
                       (f"dashboard charts memory (last {window / 3600:g} h)", "memory", params)]
        print(f"queries at {events} events ({reps} runs each, one cursor per query as the controller does):")
        p50: dict[str, float] = {}
        for label, view, params in cases + charts:
            times = []
            for _ in range(reps):
                cur = sink_con.cursor()
                t = time.perf_counter()
                run_view(cur, view, params)
                times.append((time.perf_counter() - t) * 1000)
                cur.close()
            p50[label] = statistics.median(times)
            print(f"  {label:52s} p50 {p50[label]:7.1f} ms  p99 {pct(times, 0.99):7.1f} ms")
        status = p50["status: demand last hour"]
        for window in ("1 h", "24 h"):
            page = sum(v for k, v in p50.items() if k.startswith("dashboard charts") and k.endswith(f"{window})"))
            print(f"  ratio dashboard charts (last {window}, both views) / status demand (p50): {page / status:.2f}")
        sink_con.close()
        base_con.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000, help="Log messages in the store.")
    ap.add_argument("--chunk", type=int, default=100_000, help="Messages per sink flush.")
    ap.add_argument("--reps", type=int, default=30, help="Runs of each query.")
    a = ap.parse_args()
    main(a.events, a.chunk, a.reps)
