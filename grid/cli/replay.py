"""`gridctl replay`: re-run the recorded plans of a window and show what a planner would change.

The command (with its rendering and progress bar) calls the ``replay`` package, which knows
nothing of the CLI; grid.cli.main registers it. Exit codes: 0 done, 1 ``--check`` found a plan
that did not reproduce, 2 bad input (malformed event, sequence gap, unknown planner path,
unreadable source); bad input writes nothing to the store. Events the live folds reject
(forged, unsigned, signed by a revoked key, not vouched for by their subject) are no bad input:
they are skipped as the controller skipped them and listed under "rejected events". An export
file is verified with this operator's own credential (or the account key the file records).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
from pathlib import Path
from typing import Any, Optional

import duckdb
import msgspec
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from grid.cli.common import JsonOption, NatsOption, config, connect, console, err_console, fail, resolve_nats_url
from grid.cli.events import parse_when
from grid.events.log import LogError
from grid.projections.runner import ReplayError
from replay import store
from replay.diff import describe
from replay.extract import SOURCE_KINDS, DuckDBSource, FileSource, LogSource, Source, SourceError, Window
from replay.rerun import (
    DEFAULT_PLANNER,
    FOLD_ORDERS,
    FOLD_TIME,
    PlannerPathError,
    ReplayResult,
    load_planner,
    replay_window,
)
from replay.rerun import Progress as ReplayProgress

EXIT_NOT_REPRODUCED = 1
EXIT_BAD_INPUT = 2


def _when(value: float | None) -> str:
    if value is None:
        return "-"
    return dt.datetime.fromtimestamp(value, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


class _Bar(ReplayProgress):
    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.events = progress.add_task("folding events", total=None)
        self.plans = progress.add_task("re-running plans", total=None)

    def start(self, events_total: int, plans_total: int) -> None:
        self.progress.update(self.events, total=events_total or None)
        self.progress.update(self.plans, total=plans_total)

    def advance(self, events: int = 0, plans: int = 0) -> None:
        if events:
            self.progress.advance(self.events, events)
        if plans:
            self.progress.advance(self.plans, plans)


def result_json(result: ReplayResult) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(result)
    out["reproduced"] = result.reproduced
    return out


def render(result: ReplayResult, *, limit: int = 50) -> None:
    s = result.summary
    seconds = max(result.finished_at - result.started_at, 1e-9)
    head = Table(title=f"replay {result.run_id[:12]}", show_header=False, box=None)
    head.add_row("source", result.source_detail)
    w = result.window
    window = f"{_when(w.start_time)} .. {_when(w.end_time)}"
    if w.start_seq is not None or w.end_seq is not None:
        window += f"  (plans seq {w.start_seq or 1}..{w.end_seq or 'end'})"
    head.add_row("window", window)
    head.add_row("planner", f"{result.planner} (version {result.planner_version or '?'})")
    head.add_row("fold order", result.fold_order)
    head.add_row("events folded", f"{result.events_folded:,} in {seconds:.1f}s ({result.events_folded / seconds:,.0f}/s)")
    console.print(head)

    summary = Table(title="summary")
    for col in ("plans compared", "identical", "equivalent", "differing", "digest mismatches", "based_on drift"):
        summary.add_column(col, justify="right")
    summary.add_row(
        str(s.plans_compared),
        f"[green]{s.identical}[/green]",
        str(s.equivalent),
        f"[red]{s.differing}[/red]" if s.differing else "0",
        f"[red]{s.digest_mismatches}[/red]" if s.digest_mismatches else "0",
        f"[yellow]{s.based_on_drift}[/yellow]" if s.based_on_drift else "0",
    )
    console.print(summary)

    odd = [p for p in result.plans if p.status != "identical" or not p.digest_match]
    if odd:
        plans = Table(title="plans that did not reproduce")
        for col in ("plan seq", "time", "status", "digest", "recorded version", "re-run version", "differences",
                    "diagnosis"):
            plans.add_column(col, overflow="fold")
        for p in odd[:limit]:
            plans.add_row(
                str(p.plan_seq), _when(p.time), p.status,
                "match" if p.digest_match else f"[red]{p.recorded_digest[:10]} != {p.replayed_digest[:10]}[/red]",
                p.recorded_version, p.replayed_version, str(len(p.differences)), p.diagnosis,
            )
        console.print(plans)

    diffs = [(p.plan_seq, d) for p in result.plans for d in p.differences]
    if diffs:
        table = Table(title=f"differences ({len(diffs)})", show_lines=True)
        for col in ("plan", "kind", "item", "change", "recorded side", "re-run side"):
            table.add_column(col, overflow="fold")
        for seq, d in diffs[:limit]:
            table.add_row(str(seq), d.kind, d.key, f"{d.change}: {describe(d)}",
                          d.recorded_explanation, d.replayed_explanation)
        console.print(table)
        if len(diffs) > limit:
            console.print(f"... {len(diffs) - limit} more (use --json or `gridctl history replays --run {result.run_id[:12]}`)",
                          style="dim")
    if result.rejections:
        table = Table(title=f"rejected events ({sum(result.rejected.values())}: "
                            + ", ".join(f"{r}={n}" for r, n in sorted(result.rejected.items())) + ")")
        for col in ("stream", "seq", "subject", "reason", "signer role"):
            table.add_column(col, overflow="fold")
        for r in result.rejections[:limit]:
            table.add_row(r.stream, str(r.seq), r.subject, f"[red]{r.reason}[/red]", r.role or "-")
        console.print(table)
        if len(result.rejections) > limit:
            console.print(f"... {len(result.rejections) - limit} more (use --json)", style="dim")
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {warning}")


def _operator_identity() -> Any:
    """This grid home's operator identity (the trust anchor for an export file), if it has one."""
    from grid.identity.local import local_credential
    from grid.identity.signing import Identity

    credentials = local_credential(config().home, "operator")
    if credentials is None:
        return None
    try:
        return Identity.from_creds(credentials)
    except (OSError, ValueError) as exc:
        err_console.print(f"[yellow]warning:[/yellow] operator credential {credentials} unreadable ({exc}); "
                          "the export file is verified against the account key it records")
        return None


def _store_path(db: Optional[str]) -> Path:
    return Path(db) if db else config().duckdb_path


async def _run(
    *,
    source_kind: str,
    file: Optional[str],
    db_path: Path,
    nats: Optional[str],
    window: Window,
    planner: Optional[str],
    sync: bool,
    show_progress: bool,
    fold_order: str = FOLD_TIME,
) -> tuple[ReplayResult, duckdb.DuckDBPyConnection | None]:
    ref = load_planner(planner)  # an unknown path fails before any source is opened
    con: duckdb.DuckDBPyConnection | None = None
    log = None
    source: Source
    if source_kind == "file":
        source = FileSource(file, authorship=_operator_identity())  # type: ignore[arg-type]
    elif source_kind == "duckdb":
        if sync:
            from grid.analytics.sink import AnalyticsSink, open_store

            con = open_store(db_path)
            log = await connect(nats, name="gridctl-replay")
            sink = AnalyticsSink(con)
            try:
                await sink.sync(log)
            finally:
                sink.close()
        else:
            if not db_path.exists():
                raise SourceError(f"no analytics store at {db_path} (pass --db, or --sync to fill it from NATS)")
            con = duckdb.connect(str(db_path))
        source = DuckDBSource(con, description=f"duckdb {db_path}")
    else:
        log = log or await connect(nats, name="gridctl-replay")
        source = LogSource(log, description=f"jetstream {resolve_nats_url(nats)}")
    try:
        if show_progress:
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            with Progress(*columns, console=err_console, transient=True) as bar:
                result = await replay_window(source, window, planner=ref, progress=_Bar(bar), fold_order=fold_order)
        else:
            result = await replay_window(source, window, planner=ref, fold_order=fold_order)
    finally:
        await source.close()
        if log is not None:
            await log.close()
    return result, con


def replay_command(
    start: Optional[str] = typer.Option(None, "--from", help="Window start: plans received at or after (ISO-8601, epoch or -2h)."),
    end: Optional[str] = typer.Option(None, "--to", help="Window end: plans received at or before."),
    from_seq: Optional[int] = typer.Option(None, "--from-seq", help="First plans-stream sequence to re-run."),
    to_seq: Optional[int] = typer.Option(None, "--to-seq", help="Last plans-stream sequence to re-run."),
    planner: Optional[str] = typer.Option(None, "--planner", help=f"Planner to run, as module:function or file.py:function (default the installed {DEFAULT_PLANNER})."),
    source: Optional[str] = typer.Option(None, "--source", help=f"Where to read the log: {' | '.join(SOURCE_KINDS)} (default jetstream, or file with --file)."),
    file: Optional[str] = typer.Option(None, "--file", help="NDJSON written by `gridctl events export` (with --source file)."),
    db: Optional[str] = typer.Option(None, "--db", help="DuckDB store: read with --source duckdb, results written here (default the grid home's)."),
    sync: bool = typer.Option(False, "--sync", help="With --source duckdb: first sync the store from NATS."),
    fold_order: str = typer.Option(FOLD_TIME, "--fold-order", help="Interleave streams by receipt time (a live controller) or stream by stream (a controller that caught up before planning)."),
    no_store: bool = typer.Option(False, "--no-store", help="Do not record the run in DuckDB."),
    check: bool = typer.Option(False, "--check", help="Exit 1 unless every plan reproduced byte for byte from matching inputs."),
    limit: int = typer.Option(50, "--limit", help="Rows of differences to print."),
    json_out: bool = JsonOption,
    nats: Optional[str] = NatsOption,
) -> None:
    """Re-run the recorded plans of a window with a planner and show which decisions differ."""
    kind = (source or ("file" if file else "jetstream")).lower()
    if kind not in SOURCE_KINDS:
        fail(f"unknown --source {source!r}; one of: {', '.join(SOURCE_KINDS)}", EXIT_BAD_INPUT)
    if kind == "file" and not file:
        fail("--source file needs --file PATH (written by `gridctl events export`)", EXIT_BAD_INPUT)
    if fold_order not in FOLD_ORDERS:
        fail(f"unknown --fold-order {fold_order!r}; one of: {', '.join(FOLD_ORDERS)}", EXIT_BAD_INPUT)
    window = Window(start_time=parse_when(start), end_time=parse_when(end), start_seq=from_seq, end_seq=to_seq)
    db_path = _store_path(db)
    try:
        result, con = asyncio.run(_run(
            source_kind=kind, file=file, db_path=db_path, nats=nats, window=window, planner=planner,
            sync=sync, show_progress=not json_out and sys.stderr.isatty(), fold_order=fold_order,
        ))
    except (ReplayError, PlannerPathError, SourceError) as exc:
        fail(f"{exc} (nothing was written)", EXIT_BAD_INPUT)
        raise AssertionError from exc
    except LogError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
        raise AssertionError from exc
    except duckdb.Error as exc:
        fail(f"DuckDB store {db_path}: {exc}", EXIT_BAD_INPUT)
        raise AssertionError from exc
    if not no_store:
        try:
            if con is None:
                from grid.analytics.sink import open_store

                con = open_store(db_path)
            store.write_result(con, result)
        except duckdb.Error as exc:
            if "lock" not in str(exc).lower():
                fail(f"could not record the run in {db_path}: {exc}")
            # A running controller is the store's one writer (its analytics sink): the replay
            # itself stands, only its record is skipped.
            err_console.print(f"[yellow]warning:[/yellow] run not recorded in {db_path}: the running controller "
                              "holds the store (stop the grid, or pass --db another file, to record runs)")
        finally:
            if con is not None:
                con.close()
    elif con is not None:
        con.close()
    if json_out:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(result_json(result)), indent=2).decode() + "\n")
    else:
        render(result, limit=limit)
    if check and not result.reproduced:
        raise typer.Exit(EXIT_NOT_REPRODUCED)
