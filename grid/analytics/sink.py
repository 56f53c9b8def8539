"""Follow the log and batch-insert events into DuckDB (never row-by-row executemany).

Each batch is handed to DuckDB as an Arrow table per target table and inserted with one
``INSERT ... SELECT``, and the positions (last sequence per stream) in the same transaction.
Re-running the sink over the same window is a no-op: a message at or before its stream's
position is skipped when added, and a flush that finds the stored position moved past its
first pending message (another sink on the same store) inserts only the rows beyond it.

The sink judges authorship as every fold does (grid.events.authorship.AuthorshipGate, with the
authorship of the log it reads): a message no identity of this grid provably wrote for its
subject, or whose subject does not vouch for the event it carries (grid.identity.provenance),
writes no event row (forged bytes are never stored) but advances the stream's position, and is
counted in `rejected` by reason; its position and reason alone go in the `rejected` table, so a
replay from the store tells a message read and refused from one missing (replay.extract). A `CredentialRevoked` it stores revokes its keys from its own
position on; a new sink on the same store takes the revocations back from the stored events.
Catching up merges the streams by receipt time, the order the controller's runner folds them,
so both judge every message alike.
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

from grid.analytics.columns import Columns
from grid.analytics.schema import TABLES, create_statements
from grid.events import codec
from grid.events.acks import ActionAck
from grid.events.authorship import SIG_HEADER, Authorship, AuthorshipGate, Rejection, Signed, check_signatures
from grid.events.codec import EventDecodeError
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.control import CredentialRevoked, HostOverride, ProfileRemoved, ProfileSet
from grid.events.host import HostHeartbeat, HostRegistered, ProtectionTransition
from grid.events.log import EventLog, StoredMessage
from grid.events.plan import PlanCreated
from grid.events.requests import RequestBatch, RequestCompleted, RequestFailed
from grid.events.subjects import ALL_STREAMS, HOSTS_STREAM
from grid.identity.provenance import SUBJECT_MISMATCH, vouched_for
from grid.projections.budget import HostBudget
from grid.projections.runner import SIGNATURE_BATCH, merge_by_receipt_time
from grid.secrets import tighten_owner_only

# Rows per flush when catching up (live, a flush also happens every `flush_seconds`). Each
# commit pays a WAL write and often a checkpoint: 100k-row batches ingested about 1.5x as fast
# as 20k-row ones at 10^6 events. The buffer stays bounded (about 50 MB with the payloads it
# holds), in the same range as follow()'s queue of up to 100k messages.
BATCH_ROWS = 100_000
_encoder = msgspec.json.Encoder()
REVOCATION_TAG = CredentialRevoked.__struct_config__.tag  # type: ignore[attr-defined]


def open_store(path: Path | str, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    files = () if read_only else store_files(path)
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tighten_store(files, warn=True)  # a store an older Grid left open to others
    con = duckdb.connect(str(path), read_only=read_only)
    if not read_only:
        for stmt in create_statements():
            con.execute(stmt)
        tighten_store(files)  # what DuckDB has just made
    return con


def store_files(path: Path | str | None) -> tuple[Path, ...]:
    """The paths DuckDB writes for the database at `path` (none in memory): the file, its WAL
    and its spill directory (DuckDB's default temp_directory, which Grid keeps)."""
    if path is None or str(path) in ("", ":memory:"):
        return ()
    db = Path(path)
    return (db, db.with_name(db.name + ".wal"), db.with_name(db.name + ".tmp"))


def tighten_store(files: tuple[Path, ...], *, warn: bool = False) -> None:
    """Make the store's files owner-only (grid.secrets.tighten_owner_only). DuckDB creates them
    itself with the process umask, and deletes the WAL at every checkpoint and makes it anew on
    the next write: so this runs after opening and after every commit, and a WAL is open to
    others (inside the owner-only grid home) only until the commit that made it returns."""
    for path in files:
        tighten_owner_only(path, warn=warn)


def _database_path(con: duckdb.DuckDBPyConnection) -> str | None:
    row = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    return row[0] if row else None


class AnalyticsSink:
    def __init__(self, con: duckdb.DuckDBPyConnection, *, batch_rows: int = BATCH_ROWS,
                 authorship: Authorship | None = None) -> None:
        self.con = con
        self.batch_rows = batch_rows
        # Verifies authorship when set (else taken from the log on the first sync or follow).
        self.gate = AuthorshipGate(authorship)
        self.gate.revoked = self._stored_revocations()
        # Host budgets, as the folds keep them (grid.projections.budget), once authorship is
        # verified: a host flooding its own subjects is dropped before its signature is checked
        # and never fills the store (a batch read again after a failed flush is charged again,
        # which only ever makes a flooder's budget tighter).
        self.budget: HostBudget | None = None
        # Payloads stay the log's bytes until the Arrow hand-off (no Python str per event).
        self._rows: dict[str, Columns] = {
            name: Columns(columns, bytes_columns=frozenset({"payload"}) if name == "events" else frozenset())
            for name, (columns, _) in TABLES.items() if name != "sink_positions"
        }
        self._event_appenders = self._rows["events"].appenders
        self._feature_appenders = self._rows["request_features"].appenders
        # One column per table, to count pending rows cheaply (callers ask after every add).
        self._counted = tuple(cols.lists[0] for cols in self._rows.values())
        self._pending_positions: dict[str, int] = {}
        # First sequence buffered per stream since the last flush (the idempotence check's bound).
        self._first_pending: dict[str, int] = {}
        # Last sequence per stream stored or buffered: anything at or before it is a duplicate.
        self._last: dict[str, int] = self.positions()
        # The last sequence stored per stream, as of this sink's last commit (kept in memory so
        # that metrics read it without a query).
        self.committed: dict[str, int] = dict(self._last)
        self.rows_written = 0
        self.malformed = 0
        self.skipped = 0
        self._files = store_files(_database_path(con))
        # The gate as of the last stored batch: a failed flush puts it back (the batch is read again).
        self._committed = self._gate_state()

    def positions(self) -> dict[str, int]:
        return dict(self.con.execute("SELECT stream, seq FROM sink_positions").fetchall())

    @property
    def rejected(self) -> dict[str, int]:
        """Messages refused as not provably their author's (or not vouched for), by reason."""
        return self.gate.rejected

    def _stored_revocations(self) -> dict[str, str]:
        """Revoked keys -> "<stream>:<seq>" of their revocation, from the revocations stored
        (each was accepted, and lies at or before the stored positions)."""
        revoked: dict[str, str] = {}
        rows = self.con.execute(
            "SELECT stream, seq, payload FROM events WHERE type = ? ORDER BY time, stream, seq", [REVOCATION_TAG]
        ).fetchall()
        for stream, seq, payload in rows:
            try:
                event = codec.decode(payload.encode("utf-8") if isinstance(payload, str) else bytes(payload))
            except EventDecodeError:
                continue
            if isinstance(event, CredentialRevoked):
                for key in event.keys:
                    revoked.setdefault(key, f"{stream}:{seq}")
        return revoked

    def _gate_state(self) -> tuple[dict[str, str], dict[str, int], list[Rejection]]:
        gate = self.gate
        return dict(gate.revoked), dict(gate.rejected), list(gate.rejections)

    def _adopt_authorship(self, log_: EventLog) -> None:
        # A log opened as an identity verifies for its readers; one without identities cannot.
        if self.gate.authorship is None:
            self.gate.authorship = getattr(log_, "authorship", None)

    # --- row extraction ------------------------------------------------------------------

    def admit(self, msg: StoredMessage) -> str | None:
        """Charge a hosts-stream message not taken yet to its host's budget: None when within it,
        else why it is dropped (pass that to `add` as `over`)."""
        if msg.stream != HOSTS_STREAM or self.gate.authorship is None or msg.seq <= self._last.get(msg.stream, 0):
            return None
        if self.budget is None:
            self.budget = HostBudget()
        headers = msg.headers
        return self.budget.admit(msg.subject, len(msg.data), msg.time, signed=bool(headers) and SIG_HEADER in headers)

    def add(self, msg: StoredMessage, *, signature_ok: bool | None = None, over: str | None = None) -> None:
        """Take one message (`signature_ok`: its signature, when already checked in a batch;
        `over`: the reason its host's budget refused it, when `admit` did)."""
        rows = self._rows
        s, q, t, data = msg.stream, msg.seq, msg.time, msg.data
        if q <= self._last.get(s, 0):
            self.skipped += 1
            return
        self._last[s] = q
        if s not in self._first_pending:
            self._first_pending[s] = q
        self._pending_positions[s] = q
        gate = self.gate
        if over is not None:
            gate.reject(s, q, msg.subject, Signed(reason=over))
            rows["rejected"].row(s, q, t, over)
            return  # over its host's budget: no event row, the position moves on
        verdict = gate.check(s, q, msg.subject, data, msg.headers, t, signature_ok=signature_ok)
        if not verdict.ok:
            rows["rejected"].row(s, q, t, verdict.reason)
            return  # not provably its author's: no event row, the position moves on
        try:
            event = codec.decode(data)
        except EventDecodeError:
            self.malformed += 1
            rows["events"].row(s, q, msg.subject, t, codec.peek_tag(data) or "<malformed>", None, None, data)
            return
        if not vouched_for(msg, event):
            gate.reject(s, q, msg.subject, Signed(reason=SUBJECT_MISMATCH, signer=verdict.signer, role=verdict.role))
            rows["rejected"].row(s, q, t, SUBJECT_MISMATCH)
            return
        tag = event.__struct_config__.tag  # type: ignore[attr-defined]
        host_id = getattr(event, "host_id", None)
        model_id = getattr(event, "model_id", None)
        match event:
            case HostHeartbeat():
                for i, r in enumerate(event.residencies):
                    rows["residencies"].row(s, q, i, t, event.host_id, r.model_id, r.state, r.memory_mb,
                                            r.managed, r.active_requests)
            case RequestCompleted() | RequestFailed():
                self._feature(s, q, 0, t, event.features)
                model_id = event.features.served_model or event.features.requested_model
            case RequestBatch():
                for i, f in enumerate(event.records):
                    self._feature(s, q, i, t, f)
            case PlanCreated():
                rows["plans"].row(s, q, t, event.generation, event.planner_version, event.inputs_digest,
                                  event.controller_term, bytes(event.plan).decode())
            case CommandIssued():
                rows["commands"].row(s, q, t, "issued", event.action_id, event.kind, event.host_id,
                                     event.model_id, event.controller_term, event.generation, event.reason)
            case CommandWithdrawn():
                rows["commands"].row(s, q, t, "withdrawn", event.action_id, None, event.host_id, None,
                                     event.controller_term, event.generation, event.reason)
            case ActionAck():
                rows["acks"].row(s, q, t, event.host_id, event.action_id, event.status, event.kind,
                                 event.model_id, event.duration_seconds, event.artifact_fetched, event.message)
            case ProfileSet():
                model_id = event.profile.model_id
            case CredentialRevoked():
                gate.revoke(event.keys, f"{s}:{q}")
            case ProfileRemoved() | HostOverride() | HostRegistered() | ProtectionTransition():
                pass
        # Every payload is kept whole (batches too) so replay from the store is exact.
        # Column by column, spelled out: this runs once per log message.
        a_stream, a_seq, a_subject, a_time, a_type, a_host, a_model, a_payload = self._event_appenders
        a_stream(s)
        a_seq(q)
        a_subject(msg.subject)
        a_time(t)
        a_type(tag)
        a_host(host_id)
        a_model(model_id)
        a_payload(data)

    async def _add_checked(self, batch: list[StoredMessage]) -> None:
        """Add a batch in order: budgets first (cheap), then the signatures of what is within them
        checked in one call on a worker thread."""
        over = [self.admit(m) for m in batch]
        checked = iter(await check_signatures(self.gate.authorship, [m for m, o in zip(batch, over) if o is None]))
        for m, o in zip(batch, over):
            self.add(m, signature_ok=None if o is not None else next(checked), over=o)

    def _feature(self, s: str, q: int, i: int, t: float, f: Any) -> None:
        (a_stream, a_seq, a_idx, a_time, a_finished, a_endpoint, a_requested, a_served, a_host, a_workload,
         a_modality, a_in, a_out, a_service, a_queue, a_outcome, a_status, a_auto) = self._feature_appenders
        a_stream(s)
        a_seq(q)
        a_idx(i)
        a_time(t)
        a_finished(f.finished_at)
        a_endpoint(f.endpoint)
        a_requested(f.requested_model)
        a_served(f.served_model)
        a_host(f.host_id)
        a_workload(f.workload)
        a_modality(f.modality)
        a_in(f.input_units)
        a_out(f.output_units)
        a_service(f.service_seconds)
        a_queue(f.queue_seconds)
        a_outcome(f.outcome)
        a_status(f.status_code)
        a_auto(f.auto)

    def pending_rows(self) -> int:
        return sum(map(len, self._counted))

    # --- batch insert ----------------------------------------------------------------------

    def flush(self) -> int:
        if not self._pending_positions:
            return 0
        written = 0
        self.con.execute("BEGIN TRANSACTION")
        try:
            stored = self.positions()
            # Normally nothing: only another sink writing the same store moves a position under us.
            stale = {st: q for st, q in stored.items() if q >= self._first_pending.get(st, q + 1)}
            for table, cols in self._rows.items():
                if len(cols):
                    written += self._insert(table, cols, guarded=bool(stale))
            for stream, seq in self._pending_positions.items():
                self.con.execute(
                    "INSERT INTO sink_positions VALUES (?, ?) "
                    "ON CONFLICT (stream) DO UPDATE SET seq = greatest(sink_positions.seq, excluded.seq)",
                    [stream, seq],
                )
            self.con.execute("COMMIT")
        except Exception as exc:
            # A failed COMMIT (a full disk, say) may have ended the transaction already: then the
            # ROLLBACK fails with "no transaction is active", which must not hide the cause.
            try:
                self.con.execute("ROLLBACK")
            except duckdb.Error as rollback_exc:
                exc.add_note(f"(the rollback that followed failed too: {rollback_exc})")
            # Nothing of the batch was stored: forget it and resume from the stored positions
            # (a partial retry could store positions past rows it had already dropped).
            self._reset()
            raise
        finally:
            for cols in self._rows.values():
                cols.clear()
        tighten_store(self._files)  # the commit may have made a new WAL
        for stream, seq in stale.items():
            self._last[stream] = max(self._last.get(stream, 0), seq)
        for stream, seq in self._pending_positions.items():
            self.committed[stream] = max(self.committed.get(stream, 0), seq)
        self._pending_positions.clear()
        self._first_pending.clear()
        self.rows_written += written
        self._committed = self._gate_state()
        return written

    def _reset(self) -> None:
        self._pending_positions.clear()
        self._first_pending.clear()
        # The batch will be read again: its revocations and rejections must not count twice.
        revoked, rejected, rejections = self._committed
        self.gate.revoked, self.gate.rejected, self.gate.rejections = dict(revoked), dict(rejected), list(rejections)
        try:
            self._last = self.positions()
        except duckdb.Error:
            # Unknown: accept anything again; the next flush's check against the stored
            # positions (in its own transaction) still keeps duplicates out.
            self._last = {}

    def _insert(self, table: str, cols: Columns, *, guarded: bool) -> int:
        # Columnar hand-off as an Arrow table, which DuckDB scans in place: far cheaper than
        # executemany or a text round trip.
        names = cols.names
        self.con.register("_grid_batch", cols.to_arrow())
        try:
            select = ", ".join(f"b.{n}" for n in names)
            where = (" LEFT JOIN sink_positions p ON p.stream = b.stream WHERE p.seq IS NULL OR b.seq > p.seq"
                     if guarded else "")
            cur = self.con.execute(
                f"INSERT INTO {table} ({', '.join(names)}) SELECT {select} FROM _grid_batch b{where}"
            )
            return int(cur.fetchone()[0])  # type: ignore[index]
        finally:
            # In a transaction the failed insert aborted, unregistering fails too; the next
            # register of the name replaces the view anyway.
            with contextlib.suppress(duckdb.Error):
                self.con.unregister("_grid_batch")

    # --- driving ---------------------------------------------------------------------------

    async def sync(self, log: EventLog, *, streams: tuple[str, ...] = ALL_STREAMS,
                   progress: Callable[[int], None] | None = None, offload: bool = False) -> int:
        """Catch up every stream from the stored position to the current end. Returns events read.

        The streams are merged by receipt time (the controller's catch-up order), so a
        revocation applies to the same messages here as in the folds.
        With `offload`, batch inserts run in a worker thread (a long catch-up inside the
        controller must not starve its lease renewals)."""
        self._adopt_authorship(log)
        positions = self.positions()
        read = 0
        iterators = {stream: log.replay(stream, start_seq=positions.get(stream, 0) + 1).__aiter__()
                     for stream in streams}
        merged = merge_by_receipt_time(iterators)
        batch: list[StoredMessage] = []

        async def add_batch() -> None:
            # Signatures checked in one call on a worker thread, then added in order.
            nonlocal read
            await self._add_checked(batch)
            read += len(batch)
            batch.clear()
            if self.pending_rows() >= self.batch_rows:
                if offload:
                    await asyncio.to_thread(self.flush)
                else:
                    self.flush()
                if progress is not None:
                    progress(read)

        try:
            async for msg in merged:
                batch.append(msg)
                if len(batch) >= SIGNATURE_BATCH:
                    await add_batch()
            await add_batch()
        finally:
            await merged.aclose()
            for it in iterators.values():
                await it.aclose()  # type: ignore[attr-defined]
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
                    # With what has queued meanwhile: their signatures are checked in one call on
                    # a worker thread, then added in order, as one by one.
                    batch = [msg]
                    while len(batch) < SIGNATURE_BATCH and not queue.empty():
                        batch.append(queue.get_nowait())
                    await self._add_checked(batch)
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
