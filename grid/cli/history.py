"""gridctl history: read history from the DuckDB analytics store.

While a controller runs it is the store's one writer, and DuckDB lets no other process open the
file meanwhile: the views (grid.analytics.history) are then asked of the controller's admin API
(operator token). When no controller answers, the file is opened read-only here. ``--db`` always
reads the named file. Every subcommand has ``--json``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import duckdb
import httpx
import typer
from rich.table import Table

from grid.analytics.history import HistoryParams, run_view
from grid.cli.admin import TIMEOUT_SECONDS, admin_urls, find_admin_url, operator_token
from grid.cli.common import JsonOption, config, console, fail, print_json
from grid.cli.events import parse_when
from replay import store as replay_store

history_app = typer.Typer(help="History from the DuckDB analytics store.", no_args_is_help=True)

FromOption = typer.Option(None, "--from", help="Start time (ISO-8601, epoch or -2h).")
# Demand and residency default to the last day: over a week of history, 5-minute demand buckets
# for every model are tens of thousands of rows and the residency timeline sorts every report
# (the two slowest queries at 10^6 events; python -m bench.analytics_store).
DayFromOption = typer.Option("-24h", "--from", help="Start time (ISO-8601, epoch or -2h; 0 for everything).")
ToOption = typer.Option(None, "--to", help="End time (ISO-8601, epoch or -5m).")
DbOption = typer.Option(None, "--db", help="DuckDB store (default the grid home's analytics.duckdb).")


def register(app: typer.Typer) -> None:
    """Add `gridctl history ...` to the gridctl app."""
    app.add_typer(history_app, name="history")


def _damaged(path: Path, exc: duckdb.Error) -> None:
    if "lock" in str(exc).lower():
        fail(f"the analytics store {path} is held by another process (a running controller writes it): "
             f"{exc}\nAsk the running grid instead (its admin.url in the grid home), or stop it first.")
    fail(f"cannot read the analytics store {path}: {exc}\n"
         "The file is damaged (for example truncated by a full disk or an interrupted copy). Move it aside "
         "and rebuild it from the log with `gridctl replay --source duckdb --sync`, or pass --db another store. "
         "(A running controller with analytics quarantines a damaged store and rebuilds it itself.)")


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


def _running_admin() -> list[str]:
    """The admin API URLs of the controllers believed to run for this grid, in the order to ask
    them: the same lookup as every admin command (GRID_ADMIN_URL, GRID_HOME/admin.url, then the
    URLs `gridctl machine join` recorded), so an operator machine finds its controllers too."""
    found = find_admin_url()
    return admin_urls(found) if found else []


def _from_controller(url: str, view: str, params: HistoryParams) -> list[dict[str, Any]] | None:
    """The view's rows from the running controller; None when no controller (with analytics) answers."""
    query: dict[str, str] = {}
    for key, value in (("from", params.start), ("to", params.end), ("bucket", params.bucket_seconds),
                       ("model", params.model)):
        if value is not None:
            query[key] = str(value)
    if params.changes_only:
        query["changes_only"] = "true"
    token = operator_token(None)
    try:
        with httpx.Client(timeout=TIMEOUT_SECONDS) as client:
            resp = client.get(f"{url}/allocator/history/{view}", params=query,
                              headers={"X-Grid-Allocator-Token": token})
    except httpx.TransportError:
        return None  # a stale admin.url: nobody holds the store, read the file
    if resp.status_code == 503:
        return None  # that controller runs no sink: the file is free to read
    try:
        data = resp.json()
    except ValueError:
        data = {}
    if resp.status_code == 401:
        fail("unauthorized: the operator token was refused (check GRID_HOME/operator.token)")
    if resp.status_code >= 400:
        fail(f"{resp.status_code} {data.get('error', 'error')}: {data.get('detail', resp.text[:300])}")
    return list(data.get("rows", []))


def _history(view: str, params: HistoryParams, db: Optional[str]) -> list[dict[str, Any]]:
    if db is None:
        for url in _running_admin():  # the first controller that answers with its store
            rows = _from_controller(url, view, params)
            if rows is not None:
                return rows
    with _store(db) as con:
        return run_view(con, view, params)


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
    start: str = DayFromOption,
    end: Optional[str] = ToOption,
    bucket: float = typer.Option(300.0, "--bucket", help="Window length in seconds (0 = whole range)."),
    json_out: bool = JsonOption,
    db: Optional[str] = DbOption,
) -> None:
    """Requests, errors and latency per model per time window."""
    rows = _history("demand", HistoryParams(start=parse_when(start), end=parse_when(end),
                                            bucket_seconds=bucket or None), db)
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
    rows = _history("plans", HistoryParams(start=parse_when(start), end=parse_when(end),
                                           changes_only=changes_only), db)
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
    rows = _history("commands", HistoryParams(start=parse_when(start), end=parse_when(end)), db)
    if json_out:
        print_json(rows)
        return
    _table("commands and acks per host", rows,
           [("host_id", "host"), ("kind", "kind"), ("issued", "issued"), ("succeeded", "succeeded"),
            ("failed", "failed"), ("mean_duration_seconds", "mean duration s")], {"host_id": str, "kind": str})


@history_app.command("residency")
def residency(
    start: str = DayFromOption,
    end: Optional[str] = ToOption,
    model: Optional[str] = typer.Option(None, "--model", help="Only this model."),
    json_out: bool = JsonOption,
    db: Optional[str] = DbOption,
) -> None:
    """Residency timeline: each change of a model's reported state on a host."""
    rows = _history("residency", HistoryParams(start=parse_when(start), end=parse_when(end), model=model), db)
    if json_out:
        print_json(rows)
        return
    _table("residency timeline", rows,
           [("time", "time"), ("host_id", "host"), ("model_id", "model"), ("state", "state")],
           {"time": _when, "host_id": str, "model_id": str, "state": str})


@history_app.command("memory")
def memory(
    start: str = DayFromOption,
    end: Optional[str] = ToOption,
    bucket: float = typer.Option(300.0, "--bucket", help="Window length in seconds (0 = every heartbeat)."),
    json_out: bool = JsonOption,
    db: Optional[str] = DbOption,
) -> None:
    """Resident memory per host (MiB held by engine processes) per time window, as heartbeats reported it."""
    rows = _history("memory", HistoryParams(start=parse_when(start), end=parse_when(end),
                                            bucket_seconds=bucket or None), db)
    if json_out:
        print_json(rows)
        return
    _table("resident memory per host", rows,
           [("host", "host"), ("bucket", "window start"), ("memory_mb", "MiB (highest)")],
           {"bucket": _when, "host": str})


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
