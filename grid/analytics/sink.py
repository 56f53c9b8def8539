"""Follow the log and batch-insert events into DuckDB (never row-by-row executemany).

Each batch is handed to DuckDB as an Arrow table per target table and inserted with one
``INSERT OR IGNORE ... SELECT``: primary keys on (stream, seq[, idx]) make re-running the sink
over the same window a no-op. Positions are stored in the same
transaction as the rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from grid.analytics.schema import TABLES, create_statements
from grid.events import codec
from grid.events.acks import ActionAck
from grid.events.codec import EventDecodeError
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.control import HostOverride, ProfileRemoved, ProfileSet
from grid.events.host import HostHeartbeat, HostRegistered, ProtectionTransition
from grid.events.log import EventLog, StoredMessage
from grid.events.plan import PlanCreated
from grid.events.requests import RequestBatch, RequestCompleted, RequestFailed
from grid.events.subjects import ALL_STREAMS

BATCH_ROWS = 20_000
_ARROW_TYPES = {
    "VARCHAR": pa.string(), "BIGINT": pa.int64(), "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_(),
}
_encoder = msgspec.json.Encoder()


def open_store(path: Path | str, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    con = duckdb.connect(str(path), read_only=read_only)
    if not read_only:
        for stmt in create_statements():
            con.execute(stmt)
    return con


class AnalyticsSink:
    def __init__(self, con: duckdb.DuckDBPyConnection, *, batch_rows: int = BATCH_ROWS) -> None:
        self.con = con
        self.batch_rows = batch_rows
        self._rows: dict[str, list[tuple[Any, ...]]] = {name: [] for name in TABLES if name != "sink_positions"}
        self._pending_positions: dict[str, int] = {}
        self.rows_written = 0
        self.malformed = 0

    def positions(self) -> dict[str, int]:
        return dict(self.con.execute("SELECT stream, seq FROM sink_positions").fetchall())

    # --- row extraction ------------------------------------------------------------------

    def add(self, msg: StoredMessage) -> None:
        rows = self._rows
        s, q, t = msg.stream, msg.seq, msg.time
        try:
            event = codec.decode(msg.data)
        except EventDecodeError:
            self.malformed += 1
            rows["events"].append((s, q, msg.subject, t, codec.peek_tag(msg.data) or "<malformed>", None, None,
                                   msg.data.decode("utf-8", "replace")))
            self._pending_positions[s] = q
            return
        tag = event.__struct_config__.tag  # type: ignore[attr-defined]
        host_id = getattr(event, "host_id", None)
        model_id = getattr(event, "model_id", None)
        match event:
            case HostHeartbeat():
                for i, r in enumerate(event.residencies):
                    rows["residencies"].append((s, q, i, t, event.host_id, r.model_id, r.state, r.memory_mb,
                                                r.managed, r.active_requests))
            case RequestCompleted() | RequestFailed():
                self._feature(s, q, 0, t, event.features)
                model_id = event.features.served_model or event.features.requested_model
            case RequestBatch():
                for i, f in enumerate(event.records):
                    self._feature(s, q, i, t, f)
            case PlanCreated():
                rows["plans"].append((s, q, t, event.generation, event.planner_version, event.inputs_digest,
                                      event.controller_term, bytes(event.plan).decode()))
            case CommandIssued():
                rows["commands"].append((s, q, t, "issued", event.action_id, event.kind, event.host_id,
                                         event.model_id, event.controller_term, event.generation, event.reason))
            case CommandWithdrawn():
                rows["commands"].append((s, q, t, "withdrawn", event.action_id, None, event.host_id, None,
                                         event.controller_term, event.generation, event.reason))
            case ActionAck():
                rows["acks"].append((s, q, t, event.host_id, event.action_id, event.status, event.kind,
                                     event.model_id, event.duration_seconds, event.artifact_fetched, event.message))
            case ProfileSet():
                model_id = event.profile.model_id
            case ProfileRemoved() | HostOverride() | HostRegistered() | ProtectionTransition():
                pass
        # Every payload is kept whole (batches too) so replay from the store is exact.
        rows["events"].append((s, q, msg.subject, t, tag, host_id, model_id, msg.data.decode("utf-8", "replace")))
        self._pending_positions[s] = q

    def _feature(self, s: str, q: int, i: int, t: float, f: Any) -> None:
        self._rows["request_features"].append((
            s, q, i, t, f.finished_at, f.endpoint, f.requested_model, f.served_model, f.host_id, f.workload,
            f.modality, f.input_units, f.output_units, f.service_seconds, f.queue_seconds, f.outcome,
            f.status_code, f.auto,
        ))

    def pending_rows(self) -> int:
        return sum(len(v) for v in self._rows.values())

    # --- batch insert ----------------------------------------------------------------------

    def flush(self) -> int:
        if not self._pending_positions:
            return 0
        written = 0
        self.con.execute("BEGIN TRANSACTION")
        try:
            for table, rows in self._rows.items():
                if not rows:
                    continue
                self._insert(table, rows)
                written += len(rows)
                rows.clear()
            for stream, seq in self._pending_positions.items():
                self.con.execute(
                    "INSERT INTO sink_positions VALUES (?, ?) ON CONFLICT (stream) DO UPDATE SET seq = excluded.seq",
                    [stream, seq],
                )
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise
        self._pending_positions.clear()
        self.rows_written += written
        return written

    def _insert(self, table: str, rows: list[tuple[Any, ...]]) -> None:
        # Columnar hand-off as an Arrow table built from per-column lists (C-speed conversion),
        # which DuckDB scans in place: far cheaper than executemany or a text round trip.
        columns = TABLES[table][0]
        names = [c for c, _ in columns]
        arrays = [pa.array(list(col), type=_ARROW_TYPES[ty]) for col, (_, ty) in zip(zip(*rows), columns)]
        self.con.register("_grid_batch", pa.Table.from_arrays(arrays, names=names))
        try:
            self.con.execute(
                f"INSERT OR IGNORE INTO {table} ({', '.join(names)}) SELECT {', '.join(names)} FROM _grid_batch"
            )
        finally:
            self.con.unregister("_grid_batch")

    # --- driving ---------------------------------------------------------------------------

    async def sync(self, log: EventLog, *, streams: tuple[str, ...] = ALL_STREAMS,
                   progress: Callable[[int], None] | None = None, offload: bool = False) -> int:
        """Catch up every stream from the stored position to the current end. Returns events read.

        With `offload`, batch inserts run in a worker thread (a long catch-up inside the
        controller must not starve its lease renewals)."""
        positions = self.positions()
        read = 0
        for stream in streams:
            async for msg in log.replay(stream, start_seq=positions.get(stream, 0) + 1):
                self.add(msg)
                read += 1
                if self.pending_rows() >= self.batch_rows:
                    if offload:
                        await asyncio.to_thread(self.flush)
                    else:
                        self.flush()
                    if progress is not None:
                        progress(read)
        if offload:
            await asyncio.to_thread(self.flush)
        else:
            self.flush()
        return read

    async def follow(self, log: EventLog, *, flush_seconds: float = 1.0, offload: bool = False) -> None:
        """Follow all streams live, flushing by size or within `flush_seconds`, until cancelled.

        With `offload`, each flush runs in a worker thread (the caller's loop keeps serving while
        DuckDB writes); nothing is added to the buffers meanwhile, the subscriptions queue it.
        """
        await self.sync(log, offload=offload)
        positions = self.positions()
        subs = [await log.subscribe(s, start_seq=positions.get(s, 0) + 1) for s in ALL_STREAMS]
        queue: asyncio.Queue[StoredMessage] = asyncio.Queue(maxsize=100_000)

        async def pump(sub: Any) -> None:
            while True:
                msg = await sub.next(timeout=None)
                if msg is None:
                    return
                await queue.put(msg)

        async def flush() -> None:
            if offload:
                await asyncio.to_thread(self.flush)
            else:
                self.flush()

        tasks = [asyncio.create_task(pump(s)) for s in subs]
        deadline = time.monotonic() + flush_seconds
        try:
            while True:
                try:
                    msg = await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic()))
                    self.add(msg)
                    if self.pending_rows() >= self.batch_rows:
                        await flush()
                        deadline = time.monotonic() + flush_seconds
                except TimeoutError:
                    # A steady trickle never starves a flush: the deadline runs from the last one.
                    await flush()
                    deadline = time.monotonic() + flush_seconds
        finally:
            for t in tasks:
                t.cancel()
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.close()
            with contextlib.suppress(Exception):
                self.flush()

    def close(self) -> None:
        """Flush what is pending. The connection belongs to the caller."""
        self.flush()
