"""The analytics store kept current while the controller runs, and the reads it serves.

DuckDB admits one writer process and, while it writes, no reader process: so the process that
runs the sink (the controller) also answers history and status queries (through its admin API),
and a CLI opens the file read-only only when no controller holds it.

Writes and reads run in worker threads (DuckDB releases the GIL) on separate cursors of one
database instance, so a flush or a long query never stalls the controller's event loop.

A damaged store heals itself while the controller runs. DuckDB keeps the blocks it needs in memory
and never rereads the file's main header, so a file overwritten under it (a bad restore, a stray
copy, a failing disk) goes unnoticed until the next open, or a read of an evicted block fails
with a checksum error. The service therefore checks the file itself every `check_seconds` (same
file, DuckDB's magic in its header) and classifies the errors of its writes and reads: on damage
(never on a transient error such as a full disk or a lock) it closes the store, moves the file
and its WAL aside to ``<name>.corrupt-<unix time>`` (owner-only, as the projection snapshot and
the agent's state file are quarantined), warns (status shows it), opens a fresh store and lets the
sink fill it from the log, so history answers again without a restart. A store moved away or
replaced by the operator (the documented rebuild) is reopened the same way, without quarantine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
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
# How often the store file itself is checked for damage or replacement.
CHECK_SECONDS = 1.0
# DuckDB's main file header: an 8-byte checksum, then the magic bytes.
MAGIC = b"DUCK"
MAGIC_OFFSET = 8

# Errors that say nothing about the file's contents: retried, never quarantined.
_TRANSIENT = ("no space left", "disk quota", "could not set lock", "conflicting lock", "permission denied",
              "too many open files", "out of memory", "read-only file system", "interrupted")
# Errors that say the file's contents are damaged.
_DAMAGED = ("not a valid duckdb database", "checksum", "corrupt", "could not read enough bytes",
            "invalid block", "failed to read", "unexpected end of file", "deserializ")
# After a fatal error DuckDB refuses every statement until the database is opened again.
_INVALIDATED = "invalidated because of a previous fatal error"

QUARANTINE = "quarantine"  # damaged: move it aside, start a fresh store
REOPEN = "reopen"  # moved away, replaced or invalidated: open whatever is at the path again


def damage(exc: BaseException) -> str | None:
    """QUARANTINE when `exc` says the store's file is damaged, REOPEN when the database must be
    opened again, None for anything else (transient: retry on the same store).

    DuckDB raises IOException for a file that is not a database and for a full disk or a lock
    alike, so the message decides there; Serialization and Internal exceptions come from bytes
    that do not decode as DuckDB wrote them."""
    if not isinstance(exc, duckdb.Error):
        return None
    text = str(exc).lower()
    if _INVALIDATED in text:
        return REOPEN
    if any(mark in text for mark in _TRANSIENT):
        return None
    if any(mark in text for mark in _DAMAGED):
        return QUARANTINE
    if isinstance(exc, duckdb.FatalException):
        return REOPEN
    if isinstance(exc, (duckdb.SerializationException, duckdb.InternalException)):
        return QUARANTINE
    return None


def quarantine_store(path: Path) -> Path:
    """Move the store at `path` and its WAL aside to `<name>.corrupt-<unix time>` (and `.wal`),
    owner-only. Returns where the file went."""
    stamp = int(time.time())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 0
    while target.exists():  # two quarantines within a second keep both files
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    moved = []
    for src, dst in ((path, target), (path.with_name(path.name + ".wal"), target.with_name(target.name + ".wal"))):
        try:
            os.replace(src, dst)
        except FileNotFoundError:
            continue
        moved.append(dst)
    for dst in moved:
        with contextlib.suppress(OSError):
            os.chmod(dst, 0o600)
    return target


class AnalyticsUnavailable(RuntimeError):
    """The store is closed (stopped, or being reopened after damage)."""


class AnalyticsService:
    """Follow the log into the DuckDB file at `path` until `stop()`; answer history views."""

    def __init__(self, log_: EventLog, path: Path | str, *, flush_seconds: float = 0.5,
                 check_seconds: float = CHECK_SECONDS) -> None:
        self.log = log_
        self.path = Path(path)
        self.flush_seconds = flush_seconds
        self.check_seconds = check_seconds
        self.con: duckdb.DuckDBPyConnection | None = None
        self.sink: AnalyticsSink | None = None
        self.error: str | None = None
        self.started_at: float | None = None
        # Quarantines and reopenings, for status (the last few).
        self.warnings: list[str] = []
        self.quarantined: list[str] = []
        # True from a fresh store's opening until its sink has caught up with the log.
        self.rebuilding = False
        self._task: asyncio.Task[Any] | None = None
        self._sink_task: asyncio.Task[Any] | None = None
        self._file: tuple[int, int] | None = None  # (device, inode) of the file opened
        self._damage: tuple[str, str] | None = None  # (action, reason) seen by a write or a read

    async def start(self) -> None:
        """Open the store (a damaged one is quarantined and a fresh one made) and follow the log.
        Raises when the store cannot be opened for another reason (say, another process holds it)."""
        try:
            await self._open()
        except duckdb.Error as exc:
            if damage(exc) is None:
                raise
            self._quarantine(f"{type(exc).__name__}: {exc}")
            await self._open()
        self.started_at = time.time()
        self._task = asyncio.get_running_loop().create_task(self._supervise(), name="analytics-sink")

    async def _open(self) -> None:
        con = await asyncio.to_thread(open_store, self.path)
        try:
            # Judges authorship as the controller's folds do: with the identity its log was opened as.
            sink = await asyncio.to_thread(AnalyticsSink, con, authorship=getattr(self.log, "authorship", None))
            st = os.stat(self.path)
        except BaseException:
            with contextlib.suppress(Exception):
                con.close()
            raise
        self.rebuilding = not sink.positions()
        self.con, self.sink, self._file, self._damage = con, sink, (st.st_dev, st.st_ino), None

    async def _supervise(self) -> None:
        """Run the sink; on damage (its own errors, a read's, or the file check) put a fresh or
        the replacing store under it."""
        while True:
            self._sink_task = asyncio.get_running_loop().create_task(self._follow(), name="analytics-follow")
            try:
                trouble = None
                while trouble is None:
                    done, _ = await asyncio.wait({self._sink_task}, timeout=self.check_seconds)
                    trouble = self._damage or await asyncio.to_thread(self._check_file)
                    if done and trouble is None:  # not expected (follow runs until cancelled)
                        await asyncio.sleep(self.check_seconds)
            finally:
                await cancel_and_wait([self._sink_task])
                self._sink_task = None
            await self._replace(*trouble)

    async def _follow(self) -> None:
        sink = self.sink
        assert sink is not None
        while True:
            try:
                if self.rebuilding:
                    await sink.sync(self.log, offload=True)
                    self.rebuilding = False
                    log.info("analytics store rebuilt from the log", path=str(self.path), rows=sink.rows_written)
                await sink.follow(self.log, flush_seconds=self.flush_seconds, offload=True)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                action = damage(exc)
                if action is not None:  # the supervisor replaces the store
                    self._damage = (action, self.error)
                    return
                # Connection trouble or a full disk: resume from the stored positions.
                log.warning("analytics sink failed; resuming", error=self.error)
                await asyncio.sleep(RETRY_SECONDS)

    def _check_file(self) -> tuple[str, str] | None:
        """What is wrong with the file at the path, if anything (run in a worker thread)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return REOPEN, "the file was moved away"
        except OSError:
            return None  # cannot tell now; the next check will
        if (st.st_dev, st.st_ino) != self._file:
            return REOPEN, "the file was replaced"
        try:
            with open(self.path, "rb") as f:
                head = f.read(MAGIC_OFFSET + len(MAGIC))
        except OSError:
            return None
        if head[MAGIC_OFFSET:] != MAGIC:
            return QUARANTINE, "the file is not a valid DuckDB database (its header was overwritten)"
        return None

    def _quarantine(self, reason: str) -> None:
        moved = quarantine_store(self.path)
        self.quarantined.append(str(moved))
        self._note(f"analytics store {self.path} was damaged ({reason}): quarantined to {moved}; "
                   "rebuilt from the log")
        log.warning("analytics store quarantined", path=str(moved), error=reason)

    def _note(self, warning: str) -> None:
        self.warnings.append(warning)
        del self.warnings[:-10]

    async def _replace(self, action: str, reason: str) -> None:
        """Close the store and open what should be at its path: a fresh store after quarantining
        a damaged one, or the file now there. Retries until it opens (or the task is cancelled)."""
        con, self.con, self.sink = self.con, None, None
        if con is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(con.close)
        if action == QUARANTINE and self.path.exists():
            self._quarantine(reason)
        else:
            self._note(f"analytics store {self.path} reopened ({reason})")
            log.warning("analytics store reopened", path=str(self.path), reason=reason)
        while True:
            try:
                await self._open()
                self.error = None
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                if damage(exc) == QUARANTINE and self.path.exists():
                    self._quarantine(self.error)
                else:
                    log.warning("analytics store cannot be opened; retrying", path=str(self.path),
                                error=self.error)
                await asyncio.sleep(RETRY_SECONDS)  # a store damaged again at once is not quarantined in a loop

    def _noticed(self, con: duckdb.DuckDBPyConnection, exc: BaseException) -> None:
        """A read on `con` failed: if that store (still the current one) is damaged, have the
        supervisor replace it."""
        action = damage(exc)
        if action is not None and con is self.con and self._damage is None:
            self._damage = (action, f"{type(exc).__name__}: {exc}")

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

    def stored_positions(self) -> dict[str, int]:
        """The last sequence the store holds, by stream, as of the sink's last commit (no query)."""
        sink = self.sink
        return {} if sink is None else dict(sink.committed)

    def _positions(self) -> dict[str, int]:
        con = self.con
        if con is None:
            return {}  # being replaced: nothing stored yet
        try:
            cur = con.cursor()
            try:
                return dict(cur.execute("SELECT stream, seq FROM sink_positions").fetchall())
            finally:
                cur.close()
        except duckdb.Error as exc:
            self._noticed(con, exc)
            return {}

    async def view(self, view: str, params: HistoryParams) -> list[dict[str, Any]]:
        """Rows of the named history view (grid.analytics.history), read on a cursor of its own."""
        validate(view, params)
        if self.con is None:
            raise AnalyticsUnavailable("the analytics store is not open")
        con = self.con

        def read() -> list[dict[str, Any]]:
            cur = con.cursor()
            try:
                return run_view(cur, view, params)
            finally:
                cur.close()

        try:
            return await asyncio.to_thread(read)
        except duckdb.Error as exc:
            self._noticed(con, exc)
            raise

    def describe(self) -> dict[str, Any]:
        sink = self.sink
        return {
            "path": str(self.path),
            "running": self._task is not None and not self._task.done(),
            "rebuilding": self.rebuilding,
            "rows_written": sink.rows_written if sink else 0,
            "malformed": sink.malformed if sink else 0,
            # Messages stored as nothing: not provably their author's, or not vouched for (by reason).
            "rejected": dict(sorted(sink.rejected.items())) if sink else {},
            "error": self.error,
            # Damaged stores quarantined (and where they went) and stores reopened, the last few.
            "warnings": list(self.warnings),
            "quarantined": list(self.quarantined),
        }
