"""The named history views (`gridctl history <view>`), each a read of the analytics store.

One definition serves both readers: the controller's admin API while the controller runs (it is
the store's one writer, and DuckDB admits no second process while it writes) and the CLI's
read-only open of the file when no controller runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import duckdb
import msgspec

from grid.analytics import queries


class HistoryParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a history view may be asked: a time window and the view's own filters."""

    start: float | None = None
    end: float | None = None
    bucket_seconds: float | None = None
    model: str | None = None
    changes_only: bool = False


class HistoryError(ValueError):
    """A request for a view that does not exist or with parameters out of range."""


def _demand(con: duckdb.DuckDBPyConnection, p: HistoryParams) -> list[dict[str, Any]]:
    return queries.requests_per_model(con, p.start, p.end, p.bucket_seconds or None)


def _workloads(con: duckdb.DuckDBPyConnection, p: HistoryParams) -> list[dict[str, Any]]:
    return queries.demand_per_workload(con, p.start, p.end)


def _plans(con: duckdb.DuckDBPyConnection, p: HistoryParams) -> list[dict[str, Any]]:
    meta = {r["seq"]: r for r in queries.plan_changes(con, p.start, p.end)}
    rows = queries.plan_placement_changes(con, p.start, p.end)
    for row in rows:
        extra = meta.get(row["seq"], {})
        row["inputs_digest"] = extra.get("inputs_digest")
        row["controller_term"] = extra.get("controller_term")
    if p.changes_only:
        rows = [r for r in rows if r["added"] or r["removed"]]
    return rows


def _commands(con: duckdb.DuckDBPyConnection, p: HistoryParams) -> list[dict[str, Any]]:
    return queries.commands_and_acks(con, p.start, p.end)


def _residency(con: duckdb.DuckDBPyConnection, p: HistoryParams) -> list[dict[str, Any]]:
    return queries.residency_timeline(con, p.start, p.end, p.model)


def _memory(con: duckdb.DuckDBPyConnection, p: HistoryParams) -> list[dict[str, Any]]:
    return queries.host_memory(con, p.start, p.end, p.bucket_seconds or None)


def _hosts(con: duckdb.DuckDBPyConnection, p: HistoryParams) -> list[dict[str, Any]]:
    return queries.events_per_host(con, p.start, p.end)


VIEWS: dict[str, Callable[[duckdb.DuckDBPyConnection, HistoryParams], list[dict[str, Any]]]] = {
    "demand": _demand,
    "workloads": _workloads,
    "plans": _plans,
    "commands": _commands,
    "residency": _residency,
    "hosts": _hosts,
    "memory": _memory,
}


def validate(view: str, params: HistoryParams) -> None:
    if view not in VIEWS:
        raise HistoryError(f"unknown history view {view!r}; one of {', '.join(sorted(VIEWS))}")
    for name in ("start", "end", "bucket_seconds"):
        value = getattr(params, name)
        if value is not None and not (value == value and abs(value) < 1e12):
            raise HistoryError(f"{name} must be a finite epoch time or duration")
    if params.bucket_seconds is not None and params.bucket_seconds < 0:
        raise HistoryError("bucket_seconds must be >= 0")


def run_view(con: duckdb.DuckDBPyConnection, view: str, params: HistoryParams) -> list[dict[str, Any]]:
    validate(view, params)
    return VIEWS[view](con, params)
