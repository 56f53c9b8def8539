"""gridctl history: read history from the DuckDB store.

``history`` subcommands read the analytics store read-only (grid.analytics.queries, plus the
replay tables of replay.store); every one has ``--json``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import duckdb
import typer
from rich.table import Table

from grid.analytics import queries
from grid.cli.common import JsonOption, config, console, fail, print_json
from grid.cli.events import parse_when
from replay import store as replay_store

history_app = typer.Typer(help="History from the DuckDB analytics store.", no_args_is_help=True)

FromOption = typer.Option(None, "--from", help="Start time (ISO-8601, epoch or -2h).")
ToOption = typer.Option(None, "--to", help="End time (ISO-8601, epoch or -5m).")
DbOption = typer.Option(None, "--db", help="DuckDB store (default the grid home's analytics.duckdb).")


def register(app: typer.Typer) -> None:
    """Add `gridctl history ...` to the gridctl app."""
    app.add_typer(history_app, name="history")


def _damaged(path: Path, exc: duckdb.Error) -> None:
    fail(f"cannot read the analytics store {path}: {exc}\n"
         "The file is damaged (for example truncated by a full disk or an interrupted copy). Move it aside "
         "and rebuild it from the log with `gridctl replay --source duckdb --sync`, or pass --db another store.")


@contextlib.contextmanager
def _store(db: Optional[str]) -> Iterator[duckdb.DuckDBPyConnection]:
    """The analytics store, read-only. DuckDB reads pages lazily, so a damaged file can pass the
    open and fail in any later query: every read happens inside this block."""
    path = Path(db) if db else config().duckdb_path
    if not path.exists():
        fail(f"no analytics store at {path}: it is written by the controller's analytics sink (or pass --db)")
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as exc:
        _damaged(path, exc)
        raise AssertionError from exc  # unreachable: fail() exits
    try:
        yield con
    except duckdb.CatalogException as exc:
        fail(f"the store has no such table yet ({exc}); has the analytics sink run?")
    except duckdb.Error as exc:
        _damaged(path, exc)
    finally:
        con.close()


def _when(value: Any) -> str:
    if value is None:
        return "-"
    return dt.datetime.fromtimestamp(float(value), dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(title: str, rows: list[dict[str, Any]], columns: list[tuple[str, str]], fmt: dict[str, Any]) -> None:
    table = Table(title=title)
    for _, header in columns:
        table.add_column(header)
    for row in rows:
        table.add_row(*(fmt.get(key, _num)(row.get(key)) for key, _ in columns))
    console.print(table)
    if not rows:
        console.print("(nothing in this window)", style="dim")


@history_app.command("demand")
def demand(
    start: Optional[str] = FromOption,
    end: Optional[str] = ToOption,
    bucket: float = typer.Option(300.0, "--bucket", help="Window length in seconds (0 = whole range)."),
    json_out: bool = JsonOption,
    db: Optional[str] = DbOption,
) -> None:
    """Requests, errors and latency per model per time window."""
    with _store(db) as con:
        rows = queries.requests_per_model(con, parse_when(start), parse_when(end), bucket or None)
    if json_out:
        print_json(rows)
        return
    _table("demand per model", rows,
           [("model", "model"), ("bucket", "window start"), ("requests", "requests"), ("errors", "errors"),
            ("p50_seconds", "p50 s"), ("p95_seconds", "p95 s"), ("p99_seconds", "p99 s")],
           {"bucket": _when, "model": str})


@history_app.command("plans")
def plans(
    start: Optional[str] = FromOption,
    end: Optional[str] = ToOption,
    changes_only: bool = typer.Option(False, "--changes-only", help="Only plans whose placements changed."),
    json_out: bool = JsonOption,
    db: Optional[str] = DbOption,
) -> None:
    """Recorded plans: generation, planner version and placements added/removed against the previous one."""
    t0, t1 = parse_when(start), parse_when(end)
    with _store(db) as con:
        meta = {r["seq"]: r for r in queries.plan_changes(con, t0, t1)}
        rows = replay_store.plan_placement_changes(con, t0, t1)
    for row in rows:
        extra = meta.get(row["seq"], {})
        row["inputs_digest"] = extra.get("inputs_digest")
        row["controller_term"] = extra.get("controller_term")
    if changes_only:
        rows = [r for r in rows if r["added"] or r["removed"]]
    if json_out:
        print_json(rows)
        return
    _table("plan changes", rows,
           [("seq", "seq"), ("time", "time"), ("planner_version", "planner"), ("controller_term", "term"),
            ("placements", "placements"), ("added", "added"), ("removed", "removed"),
            ("preemptions", "preemptions"), ("shortfalls", "shortfalls")],
           {"time": _when, "added": lambda v: ", ".join(v) or "-", "removed": lambda v: ", ".join(v) or "-"})


@history_app.command("commands")
def commands(
    start: Optional[str] = FromOption,
    end: Optional[str] = ToOption,
    json_out: bool = JsonOption,
    db: Optional[str] = DbOption,
) -> None:
    """Commands issued and their acknowledgements, per host and kind."""
    with _store(db) as con:
        rows = queries.commands_and_acks(con, parse_when(start), parse_when(end))
    if json_out:
        print_json(rows)
        return
    _table("commands and acks per host", rows,
           [("host_id", "host"), ("kind", "kind"), ("issued", "issued"), ("succeeded", "succeeded"),
            ("failed", "failed"), ("mean_duration_seconds", "mean duration s")], {"host_id": str, "kind": str})


@history_app.command("residency")
def residency(
    start: Optional[str] = FromOption,
    end: Optional[str] = ToOption,
    model: Optional[str] = typer.Option(None, "--model", help="Only this model."),
    json_out: bool = JsonOption,
    db: Optional[str] = DbOption,
) -> None:
    """Residency timeline: each change of a model's reported state on a host."""
    with _store(db) as con:
        rows = queries.residency_timeline(con, parse_when(start), parse_when(end), model)
    if json_out:
        print_json(rows)
        return
    _table("residency timeline", rows,
           [("time", "time"), ("host_id", "host"), ("model_id", "model"), ("state", "state")],
           {"time": _when, "host_id": str, "model_id": str, "state": str})


@history_app.command("replays")
def replays(
    run: Optional[str] = typer.Option(None, "--run", help="Show one run's plans and differences (id or unique prefix)."),
    last: int = typer.Option(20, "--last", "-n", help="How many recent runs to list."),
    json_out: bool = JsonOption,
    db: Optional[str] = DbOption,
) -> None:
    """Recorded replay runs (gridctl replay), or one run's per-plan outcomes and differences."""
    with _store(db) as con:
        if run is None:
            rows = replay_store.runs(con, last)
            if json_out:
                print_json(rows)
                return
            _table("replay runs", rows,
                   [("run_id", "run"), ("started_at", "started"), ("source", "source"), ("planner", "planner"),
                    ("plans_compared", "plans"), ("identical", "identical"), ("equivalent", "equivalent"),
                    ("differing", "differing"), ("digest_mismatches", "digest mismatches"),
                    ("based_on_drift", "drift")],
                   {"run_id": lambda v: str(v)[:12], "started_at": _when, "source": str, "planner": str})
            return
        run_id = replay_store.find_run(con, run)
        if run_id is None:
            fail(f"no single replay run matches {run!r}")
        plan_rows = replay_store.run_plans(con, run_id)  # type: ignore[arg-type]
        diff_rows = replay_store.run_diffs(con, run_id)  # type: ignore[arg-type]
    if json_out:
        print_json({"run_id": run_id, "plans": plan_rows, "differences": diff_rows})
        return
    _table(f"replay {run_id[:12]}: plans", plan_rows,  # type: ignore[index]
           [("plan_seq", "plan"), ("time", "time"), ("status", "status"), ("digest_match", "digest match"),
            ("recorded_version", "recorded"), ("replayed_version", "re-run"), ("differences", "differences"),
            ("diagnosis", "diagnosis")],
           {"time": _when, "status": str, "digest_match": str, "diagnosis": lambda v: v or ""})
    if diff_rows:
        _table("differences", diff_rows,
               [("plan_seq", "plan"), ("kind", "kind"), ("key", "item"), ("change", "change"),
                ("recorded_explanation", "recorded side"), ("replayed_explanation", "re-run side")],
               {k: str for k in ("kind", "key", "change", "recorded_explanation", "replayed_explanation")})
