"""DuckDB summary tables for replays, and the history queries replay adds.

``replay_runs`` (one row per run), ``replay_plans`` (one row per compared plan) and
``replay_diffs`` (one row per difference) are keyed by run id. A run is written in one
transaction with batched multi-row inserts, only after the replay finished without error: a
failed replay writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import duckdb
import msgspec

from grid.analytics import queries
from replay.rerun import ReplayResult

TABLES: dict[str, str] = {
    "replay_runs": (
        "run_id VARCHAR PRIMARY KEY, started_at DOUBLE, finished_at DOUBLE, source VARCHAR, source_detail VARCHAR, "
        "window_start DOUBLE, window_end DOUBLE, window_start_seq BIGINT, window_end_seq BIGINT, "
        "planner VARCHAR, planner_version VARCHAR, events_folded BIGINT, plans_compared INTEGER, "
        "identical INTEGER, equivalent INTEGER, differing INTEGER, digest_mismatches INTEGER, based_on_drift INTEGER, "
        "fold_order VARCHAR, warnings VARCHAR"
    ),
    "replay_plans": (
        "run_id VARCHAR, plan_seq BIGINT, time DOUBLE, generation VARCHAR, recorded_version VARCHAR, "
        "replayed_version VARCHAR, recorded_digest VARCHAR, replayed_digest VARCHAR, digest_match BOOLEAN, "
        "status VARCHAR, differences INTEGER, plan_seconds DOUBLE, encoding VARCHAR, input_positions VARCHAR, "
        "diagnosis VARCHAR, PRIMARY KEY (run_id, plan_seq)"
    ),
    "replay_diffs": (
        "run_id VARCHAR, plan_seq BIGINT, idx INTEGER, kind VARCHAR, key VARCHAR, change VARCHAR, "
        "model_id VARCHAR, host_id VARCHAR, fields VARCHAR, recorded VARCHAR, replayed VARCHAR, "
        "recorded_explanation VARCHAR, replayed_explanation VARCHAR, PRIMARY KEY (run_id, plan_seq, idx)"
    ),
}
# Rows per multi-row INSERT statement.
INSERT_CHUNK = 500


def ensure_tables(con: duckdb.DuckDBPyConnection) -> None:
    for name, columns in TABLES.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {name} ({columns})")


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
    if not rows:
        return
    width = len(rows[0])
    one = "(" + ", ".join("?" * width) + ")"
    for i in range(0, len(rows), INSERT_CHUNK):
        chunk = rows[i : i + INSERT_CHUNK]
        params: list[Any] = [v for row in chunk for v in row]
        con.execute(f"INSERT INTO {table} VALUES " + ", ".join([one] * len(chunk)), params)


def _json(value: Any) -> str | None:
    return None if value is None else msgspec.json.encode(value).decode()


def write_result(con: duckdb.DuckDBPyConnection, result: ReplayResult) -> None:
    """Store one finished replay (run, per-plan outcomes, differences) in a single transaction."""
    ensure_tables(con)
    s, w = result.summary, result.window
    run = (
        result.run_id, result.started_at, result.finished_at, result.source, result.source_detail,
        w.start_time, w.end_time, w.start_seq, w.end_seq, result.planner, result.planner_version,
        result.events_folded, s.plans_compared, s.identical, s.equivalent, s.differing, s.digest_mismatches,
        s.based_on_drift, result.fold_order, json.dumps(list(result.warnings)),
    )
    plans = [
        (result.run_id, p.plan_seq, p.time, p.generation, p.recorded_version, p.replayed_version,
         p.recorded_digest, p.replayed_digest, p.digest_match, p.status, len(p.differences), p.plan_seconds,
         p.encoding, _json(p.input_positions), p.diagnosis)
        for p in result.plans
    ]
    diffs = [
        (result.run_id, p.plan_seq, i, d.kind, d.key, d.change, d.model_id, d.host_id, ",".join(d.fields),
         _json(d.recorded), _json(d.replayed), d.recorded_explanation, d.replayed_explanation)
        for p in result.plans
        for i, d in enumerate(p.differences)
    ]
    con.execute("BEGIN TRANSACTION")
    try:
        _insert(con, "replay_runs", [run])
        _insert(con, "replay_plans", plans)
        _insert(con, "replay_diffs", diffs)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
    cur = con.execute(sql, list(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _has(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    return bool(con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]
    ).fetchone()[0])  # type: ignore[index]


def runs(con: duckdb.DuckDBPyConnection, limit: int = 20) -> list[dict[str, Any]]:
    """The most recent replay runs, newest first."""
    if not _has(con, "replay_runs"):
        return []
    return _rows(con, "SELECT * FROM replay_runs ORDER BY started_at DESC LIMIT ?", [limit])


def run_plans(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict[str, Any]]:
    if not _has(con, "replay_plans"):
        return []
    return _rows(con, "SELECT * FROM replay_plans WHERE run_id = ? ORDER BY plan_seq", [run_id])


def run_diffs(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict[str, Any]]:
    if not _has(con, "replay_diffs"):
        return []
    return _rows(con, "SELECT * FROM replay_diffs WHERE run_id = ? ORDER BY plan_seq, idx", [run_id])


def find_run(con: duckdb.DuckDBPyConnection, prefix: str) -> str | None:
    """A run id from a unique prefix (as printed in tables)."""
    if not _has(con, "replay_runs"):
        return None
    found = [r[0] for r in con.execute(
        "SELECT run_id FROM replay_runs WHERE starts_with(run_id, ?) LIMIT 2", [prefix]
    ).fetchall()]
    return found[0] if len(found) == 1 else None


# Placement changes between recorded plans: one query, owned by the analytics package.
plan_placement_changes = queries.plan_placement_changes
