"""The analytics store kept current while the controller runs, and the reads it serves.

DuckDB admits one writer process and, while it writes, no reader process: so the process that
runs the sink (the controller) also answers history and status queries (through its admin API),
and a CLI opens the file read-only only when no controller holds it.

Writes and reads run in worker threads (DuckDB releases the GIL) on separate cursors of one
database instance, so a flush or a long query never stalls the controller's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import duckdb
import structlog

from grid.analytics.history import HistoryParams, run_view, validate
from grid.analytics.sink import AnalyticsSink, open_store
from grid.events.log import EventLog
from grid.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

RETRY_SECONDS = 1.0


class AnalyticsService:
    """Follow the log into the DuckDB file at `path` until `stop()`; answer history views."""

    def __init__(self, log_: EventLog, path: Path | str, *, flush_seconds: float = 0.5) -> None:
        self.log = log_
        self.path = Path(path)
        self.flush_seconds = flush_seconds
        self.con: duckdb.DuckDBPyConnection | None = None
        self.sink: AnalyticsSink | None = None
        self.error: str | None = None
        self.started_at: float | None = None
        self._task: asyncio.Task[Any] | None = None

    async def start(self) -> None:
        self.con = await asyncio.to_thread(open_store, self.path)
        # Judges authorship as the controller's folds do: with the identity its log was opened as.
        self.sink = AnalyticsSink(self.con, authorship=getattr(self.log, "authorship", None))
        self.started_at = time.time()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="analytics-sink")

    async def _run(self) -> None:
        assert self.sink is not None
        while True:
            try:
                await self.sink.follow(self.log, flush_seconds=self.flush_seconds, offload=True)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection trouble: resume from the stored positions
                self.error = f"{type(exc).__name__}: {exc}"
                log.warning("analytics sink failed; resuming", error=self.error)
                await asyncio.sleep(RETRY_SECONDS)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait([task])
        if self.con is not None:
            with contextlib.suppress(duckdb.Error):
                self.con.close()
            self.con = None

    async def flushed(self, positions: dict[str, int], timeout: float = 5.0) -> bool:
        """Wait until the store holds every stream up to `positions` (True) or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stored = await asyncio.to_thread(self._positions)
            if all(stored.get(s, 0) >= q for s, q in positions.items()):
                return True
            await asyncio.sleep(0.05)
        return False

    def _positions(self) -> dict[str, int]:
        assert self.con is not None
        cur = self.con.cursor()
        try:
            return dict(cur.execute("SELECT stream, seq FROM sink_positions").fetchall())
        finally:
            cur.close()

    async def view(self, view: str, params: HistoryParams) -> list[dict[str, Any]]:
        """Rows of the named history view (grid.analytics.history), read on a cursor of its own."""
        validate(view, params)
        if self.con is None:
            raise RuntimeError("the analytics store is not open")
        con = self.con

        def read() -> list[dict[str, Any]]:
            cur = con.cursor()
            try:
                return run_view(cur, view, params)
            finally:
                cur.close()

        return await asyncio.to_thread(read)

    def describe(self) -> dict[str, Any]:
        sink = self.sink
        return {
            "path": str(self.path),
            "running": self._task is not None and not self._task.done(),
            "rows_written": sink.rows_written if sink else 0,
            "malformed": sink.malformed if sink else 0,
            # Messages stored as nothing: not provably their author's, or not vouched for (by reason).
            "rejected": dict(sorted(sink.rejected.items())) if sink else {},
            "error": self.error,
        }
