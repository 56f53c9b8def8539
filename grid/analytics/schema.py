"""DuckDB tables, each row identified by (stream, seq[, idx]) of the log message it came from.

Re-running the sink never duplicates rows: it writes a message only if its sequence is past the
stream's position in `sink_positions`, which it updates in the same transaction as the rows.
The data tables carry no PRIMARY KEY index on purpose: at 10^6 events keeping that index cost
about 40% of the sink's ingest time and guarded nothing the positions do not already guard
(stores created before keep theirs; the sink works with both).

Only bounded features are stored: no prompt, response, affinity key, API key or user identity.
"""

from __future__ import annotations

# name -> (column definitions in insert order, the key that identifies a row)
TABLES: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "events": (
        (
            ("stream", "VARCHAR"), ("seq", "BIGINT"), ("subject", "VARCHAR"), ("time", "DOUBLE"),
            ("type", "VARCHAR"), ("host_id", "VARCHAR"), ("model_id", "VARCHAR"), ("payload", "VARCHAR"),
        ),
        ("stream", "seq"),
    ),
    "request_features": (
        (
            ("stream", "VARCHAR"), ("seq", "BIGINT"), ("idx", "INTEGER"), ("time", "DOUBLE"),
            ("finished_at", "DOUBLE"), ("endpoint", "VARCHAR"), ("requested_model", "VARCHAR"),
            ("served_model", "VARCHAR"), ("host_id", "VARCHAR"), ("workload", "VARCHAR"),
            ("modality", "VARCHAR"), ("input_units", "BIGINT"), ("output_units", "BIGINT"),
            ("service_seconds", "DOUBLE"), ("queue_seconds", "DOUBLE"), ("outcome", "VARCHAR"),
            ("status_code", "INTEGER"), ("auto", "BOOLEAN"),
        ),
        ("stream", "seq", "idx"),
    ),
    "residencies": (
        (
            ("stream", "VARCHAR"), ("seq", "BIGINT"), ("idx", "INTEGER"), ("time", "DOUBLE"),
            ("host_id", "VARCHAR"), ("model_id", "VARCHAR"), ("state", "VARCHAR"),
            ("memory_mb", "BIGINT"), ("managed", "BOOLEAN"), ("active_requests", "INTEGER"),
        ),
        ("stream", "seq", "idx"),
    ),
    "plans": (
        (
            ("stream", "VARCHAR"), ("seq", "BIGINT"), ("time", "DOUBLE"), ("generation", "VARCHAR"),
            ("planner_version", "VARCHAR"), ("inputs_digest", "VARCHAR"), ("controller_term", "BIGINT"),
            ("plan_json", "VARCHAR"),
        ),
        ("stream", "seq"),
    ),
    "commands": (
        (
            ("stream", "VARCHAR"), ("seq", "BIGINT"), ("time", "DOUBLE"), ("type", "VARCHAR"),
            ("action_id", "VARCHAR"), ("kind", "VARCHAR"), ("host_id", "VARCHAR"), ("model_id", "VARCHAR"),
            ("controller_term", "BIGINT"), ("generation", "VARCHAR"), ("reason", "VARCHAR"),
        ),
        ("stream", "seq"),
    ),
    "acks": (
        (
            ("stream", "VARCHAR"), ("seq", "BIGINT"), ("time", "DOUBLE"), ("host_id", "VARCHAR"),
            ("action_id", "VARCHAR"), ("status", "VARCHAR"), ("kind", "VARCHAR"), ("model_id", "VARCHAR"),
            ("duration_seconds", "DOUBLE"), ("artifact_fetched", "BOOLEAN"), ("message", "VARCHAR"),
        ),
        ("stream", "seq"),
    ),
    # A message the sink read and kept no row of (not provably its author's, or over its host's
    # budget): its position and why, so a replay from the store knows the sequence is not lost.
    "rejected": (
        (("stream", "VARCHAR"), ("seq", "BIGINT"), ("time", "DOUBLE"), ("reason", "VARCHAR")),
        ("stream", "seq"),
    ),
    "sink_positions": ((("stream", "VARCHAR"), ("seq", "BIGINT")), ("stream",)),
}


# Tables whose key is enforced by an index: the positions are upserted (ON CONFLICT needs it).
INDEXED = frozenset({"sink_positions"})

# Whole JSON documents compress about 8x with zstd (similar events repeat most of their text),
# and zstd costs less to write than DuckDB's default string analysis (about 2x faster at 10^6
# events). Scans of these columns only happen when a replay reads payloads back.
COMPRESSION: dict[tuple[str, str], str] = {("events", "payload"): "zstd", ("plans", "plan_json"): "zstd"}


def column_sql(table: str, column: str, sql_type: str) -> str:
    using = COMPRESSION.get((table, column))
    return f"{column} {sql_type}" + (f" USING COMPRESSION {using}" if using else "")


def create_statements() -> list[str]:
    out = []
    for name, (columns, key) in TABLES.items():
        cols = ", ".join(column_sql(name, c, t) for c, t in columns)
        pk = f", PRIMARY KEY ({', '.join(key)})" if name in INDEXED else ""
        out.append(f"CREATE TABLE IF NOT EXISTS {name} ({cols}{pk})")
    return out
