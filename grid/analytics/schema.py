"""DuckDB tables, each keyed by (stream, seq[, idx]) so re-running the sink never duplicates rows.

Only bounded features are stored: no prompt, response, affinity key, API key or user identity.
"""

from __future__ import annotations

# name -> (column definitions in insert order, primary key)
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
    "sink_positions": ((("stream", "VARCHAR"), ("seq", "BIGINT")), ("stream",)),
}


def create_statements() -> list[str]:
    out = []
    for name, (columns, key) in TABLES.items():
        cols = ", ".join(f"{c} {t}" for c, t in columns)
        out.append(f"CREATE TABLE IF NOT EXISTS {name} ({cols}, PRIMARY KEY ({', '.join(key)}))")
    return out
