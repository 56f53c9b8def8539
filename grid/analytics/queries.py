"""Read-only analytics queries used by status, history and benchmarks."""

from __future__ import annotations

import json
from typing import Any

import duckdb

from grid.events.host import HostHeartbeat

# The tag heartbeats are stored under in `events.type`.
HEARTBEAT_TYPE: str = HostHeartbeat.__struct_config__.tag  # type: ignore[assignment]
# Residency states whose memory_mb is not held by a process (the view's "resident" excludes them).
NOT_RESIDENT_STATES = ("cached", "failed")

def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _window(start: float | None, end: float | None, column: str = "time") -> tuple[str, list[Any]]:
    clauses, params = [], []
    if start is not None:
        clauses.append(f"{column} >= ?")
        params.append(start)
    if end is not None:
        clauses.append(f"{column} <= ?")
        params.append(end)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def events_per_host(con: duckdb.DuckDBPyConnection, start: float | None = None, end: float | None = None) -> list[dict[str, Any]]:
    where, params = _window(start, end)
    extra = " AND " if where else " WHERE "
    return _rows(
        con,
        f"SELECT host_id, type, count(*) AS events, min(time) AS first, max(time) AS last FROM events"
        f"{where}{extra}host_id IS NOT NULL GROUP BY host_id, type ORDER BY host_id, type",
        params,
    )


def demand_sql(where: str, bucket_seconds: float | None) -> str:
    """The demand query over `where` (from `_window`), per model and per bucket if asked."""
    bucket = f"floor(time / {float(bucket_seconds)}) * {float(bucket_seconds)}" if bucket_seconds else "NULL"
    # One quantile aggregate with a list of fractions sorts each group once; three separate
    # quantile_cont calls sorted it three times (most of the query's time at 10^6 events).
    return (
        f"SELECT model, bucket, requests, errors, q[1] AS p50_seconds, q[2] AS p95_seconds, "
        f"q[3] AS p99_seconds FROM ("
        f"SELECT coalesce(served_model, requested_model) AS model, {bucket} AS bucket, count(*) AS requests, "
        f"count(*) FILTER (WHERE outcome <> 'ok') AS errors, "
        f"quantile_cont(service_seconds, [0.5, 0.95, 0.99]) AS q "
        f"FROM request_features{where} GROUP BY ALL) ORDER BY model, bucket"
    )


def requests_per_model(
    con: duckdb.DuckDBPyConnection,
    start: float | None = None,
    end: float | None = None,
    bucket_seconds: float | None = None,
) -> list[dict[str, Any]]:
    """Request counts, errors and latency percentiles per model (and per time bucket if asked)."""
    where, params = _window(start, end)
    return _rows(con, demand_sql(where, bucket_seconds), params)


def demand_per_workload(con: duckdb.DuckDBPyConnection, start: float | None = None, end: float | None = None) -> list[dict[str, Any]]:
    where, params = _window(start, end)
    return _rows(
        con,
        f"SELECT workload, count(*) AS requests, count(*) FILTER (WHERE auto) AS auto_requests, "
        f"sum(service_seconds) AS device_seconds FROM request_features{where} GROUP BY workload ORDER BY workload",
        params,
    )


def commands_and_acks(con: duckdb.DuckDBPyConnection, start: float | None = None, end: float | None = None) -> list[dict[str, Any]]:
    where, params = _window(start, end, "c.time")
    return _rows(
        con,
        f"SELECT c.host_id, c.kind, count(*) AS issued, "
        f"count(a.action_id) FILTER (WHERE a.status = 'succeeded') AS succeeded, "
        f"count(a.action_id) FILTER (WHERE a.status IN ('failed', 'rejected')) AS failed, "
        f"avg(a.duration_seconds) AS mean_duration_seconds "
        f"FROM commands c LEFT JOIN (SELECT DISTINCT ON (action_id) * FROM acks "
        f"WHERE status IN ('succeeded','failed','rejected','cancelled') ORDER BY action_id, seq) a "
        f"ON a.action_id = c.action_id{where}{' AND ' if where else ' WHERE '}c.type = 'issued' "
        f"GROUP BY c.host_id, c.kind ORDER BY c.host_id, c.kind",
        params,
    )


def plan_changes(con: duckdb.DuckDBPyConnection, start: float | None = None, end: float | None = None) -> list[dict[str, Any]]:
    where, params = _window(start, end)
    return _rows(
        con,
        f"SELECT seq, time, generation, planner_version, inputs_digest, controller_term FROM plans{where} ORDER BY seq",
        params,
    )


def residency_timeline(
    con: duckdb.DuckDBPyConnection, start: float | None = None, end: float | None = None, model_id: str | None = None
) -> list[dict[str, Any]]:
    """State changes per (host, model): one row each time the reported state differs."""
    where, params = _window(start, end)
    if model_id is not None:
        where += (" AND " if where else " WHERE ") + "model_id = ?"
        params.append(model_id)
    return _rows(
        con,
        f"SELECT host_id, model_id, state, time FROM ("
        f"SELECT host_id, model_id, state, time, lag(state) OVER (PARTITION BY host_id, model_id ORDER BY seq) AS prev "
        f"FROM residencies{where}) WHERE prev IS NULL OR prev <> state ORDER BY time, host_id, model_id",
        params,
    )


def plan_placement_changes(con: duckdb.DuckDBPyConnection, start: float | None = None,
                           end: float | None = None) -> list[dict[str, Any]]:
    """Per recorded plan: placements added/removed against the previous plan (from plans.plan_json)."""
    where, params = _window(start, end)
    rows = _rows(con, f"SELECT seq, time, generation, planner_version, plan_json FROM plans{where} ORDER BY seq", params)
    out: list[dict[str, Any]] = []
    previous: set[tuple[str, str]] | None = None
    for row in rows:
        try:
            plan = json.loads(row["plan_json"]) or {}
        except ValueError:
            plan = {}
        current = {(p.get("model_id", ""), p.get("host_id", "")) for p in plan.get("placements", [])}
        added = sorted(current - previous) if previous is not None else sorted(current)
        removed = sorted(previous - current) if previous is not None else []
        out.append({
            "seq": row["seq"], "time": row["time"], "generation": row["generation"],
            "planner_version": row["planner_version"], "placements": len(current),
            "added": [f"{m}@{h}" for m, h in added], "removed": [f"{m}@{h}" for m, h in removed],
            "preemptions": len(plan.get("preemptions", [])), "shortfalls": len(plan.get("shortfalls", [])),
        })
        previous = current
    return out


def host_memory(con: duckdb.DuckDBPyConnection, start: float | None = None, end: float | None = None,
                bucket_seconds: float | None = None) -> list[dict[str, Any]]:
    """Resident memory (MiB held by engine processes) per host as its heartbeats reported it: the
    highest report per time bucket if asked, else per heartbeat. A heartbeat with no residency
    reports 0 (it is joined from `events`, so an idle host is a line at zero, not a gap)."""
    where, params = _window(start, end, "e.time")
    inner, inner_params = _window(start, end)
    excluded = ", ".join(f"'{s}'" for s in NOT_RESIDENT_STATES)
    bucket = f"floor(e.time / {float(bucket_seconds)}) * {float(bucket_seconds)}" if bucket_seconds else "e.time"
    return _rows(
        con,
        f"SELECT e.host_id AS host, {bucket} AS bucket, max(coalesce(r.memory_mb, 0)) AS memory_mb "
        f"FROM events e LEFT JOIN (SELECT stream, seq, sum(memory_mb) FILTER (WHERE state NOT IN ({excluded})) "
        f"AS memory_mb FROM residencies{inner} GROUP BY stream, seq) r ON r.stream = e.stream AND r.seq = e.seq"
        f"{where}{' AND ' if where else ' WHERE '}e.type = ? AND e.host_id IS NOT NULL "
        f"GROUP BY ALL ORDER BY host, bucket",
        inner_params + params + [HEARTBEAT_TYPE],
    )
