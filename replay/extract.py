"""Window extraction: the stored messages of each stream, in sequence order, from one source.

Three sources give the same ``StoredMessage`` values (stream, seq, subject, data, receipt time):

* ``LogSource``: a live log (JetStream, or the InMemoryLog twin). Each stream is read by one
  long-lived ordered consumer that the replay advances plan by plan; window bounds given as
  times are resolved with an ordered consumer by start time.
* ``FileSource``: an NDJSON file written by ``gridctl events export`` (one stored message per
  line: stream, seq, subject, time, type, valid, event, and, from a grid with identities, the
  stored headers and the exporting grid's account key). The payload of a valid event is
  embedded verbatim, so the bytes read back are the bytes the log held.
* ``DuckDBSource``: the analytics store. ``events`` keeps every payload except RequestBatch,
  whose records live in ``request_features``; a batch is rebuilt from those rows (its
  event_id/at/source and the feature fields the store does not keep are lost, and
  ``lossy_request_batches`` counts them so the replay can say so).

Each source names the ``authorship`` a replay verifies its messages with, by the rules of the
live folds (grid.events.authorship): the log's own (the identity the replaying process opened
it as); for a file, the replaying operator's identity, or a verifier pinned to the account key
the file records when the operator's is another grid's or absent. A file without signature
headers (exported before events were signed, or by a grid without identities) replays without
verification, and says so in a warning. The store keeps no headers: the sink judged authorship
when it stored each event (a rejected one was never stored), so its replay verifies nothing.

A file or the store must hold each stream without holes: a sequence jump inside a stream is a
``ReplayError`` naming the first missing sequence. (JetStream itself is the truth; sequences a
retention limit removed are simply not delivered.) A stream that starts after sequence 1 is an
incomplete prefix: allowed, but reported as a warning, because state folded before it is lost.
"""

from __future__ import annotations

import bisect
import collections
import os
from array import array
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import msgspec

from grid.events import codec
from grid.events.authorship import SIG_HEADER, SIGNER_HEADER, Authorship
from grid.events.log import EventLog, StoredMessage
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import ALL_STREAMS, PLANS_STREAM
from grid.identity.signing import Verifier
from grid.projections.runner import ReplayError

SOURCE_KINDS: tuple[str, ...] = ("jetstream", "file", "duckdb")
BATCH_TAG = RequestBatch.__struct_config__.tag  # type: ignore[attr-defined]
# How long a log reader waits for a message it knows should exist before giving up.
LOG_READ_TIMEOUT_SECONDS = 10.0
DUCKDB_CHUNK_ROWS = 20_000


class SourceError(ValueError):
    """The source itself cannot be read (missing file, not an export line, no store)."""


class Window(msgspec.Struct, frozen=True, kw_only=True):
    """Which recorded plans to re-run: by receipt time and/or plans-stream sequence (inclusive)."""

    start_time: float | None = None
    end_time: float | None = None
    start_seq: int | None = None
    end_seq: int | None = None

    def contains(self, seq: int, time: float) -> bool:
        if self.start_seq is not None and seq < self.start_seq:
            return False
        if self.end_seq is not None and seq > self.end_seq:
            return False
        if self.start_time is not None and time < self.start_time:
            return False
        if self.end_time is not None and time > self.end_time:
            return False
        return True

    def past(self, seq: int, time: float) -> bool:
        """True once a plan lies beyond the window's end (plans are read in order)."""
        return (self.end_seq is not None and seq > self.end_seq) or (
            self.end_time is not None and time > self.end_time
        )


class StreamReader(Protocol):
    """A cursor over one stream that only moves forward."""

    stream: str

    def take(self, end_seq: int) -> AsyncIterator[StoredMessage]:
        """The next messages with seq <= end_seq (possibly none)."""
        ...

    async def close(self) -> None: ...


class Source(Protocol):
    kind: str
    description: str
    # Extra notes the replay reports (e.g. lossy reconstruction).
    warnings: list[str]
    # What the replay verifies each message's author with (None: nothing is verified).
    authorship: Authorship | None

    async def bounds(self, stream: str) -> tuple[int, int]:
        """(first, last) sequence the source holds for `stream`; (0, 0) when it holds none."""
        ...

    async def first_seq_at(self, stream: str, time: float) -> int | None:
        """The first sequence whose receipt time is >= `time` (None if there is none)."""
        ...

    async def reader(self, stream: str, start_seq: int = 1) -> StreamReader: ...

    async def close(self) -> None: ...


class _GapGuard:
    """Raises ReplayError when a stream's sequences jump (file and store sources), but for the
    sequences a source says were read and rejected (`rejected`)."""

    def __init__(self, stream: str, origin: str) -> None:
        self.stream = stream
        self.origin = origin
        self.last = 0
        self.rejected: set[int] = set()

    def check(self, seq: int) -> None:
        while self.last and self.last + 1 in self.rejected:
            self.rejected.discard(self.last + 1)
            self.last += 1
        last = self.last
        if last and seq != last + 1:
            if seq <= last:
                raise ReplayError(self.stream, seq, f"sequence {seq} follows {last} in {self.origin} (out of order or duplicated)")
            missing = f"{last + 1}" if seq == last + 2 else f"{last + 1}..{seq - 1}"
            raise ReplayError(self.stream, last + 1, f"gap in {self.origin}: sequence {last} is followed by {seq} (missing {missing})")
        self.last = seq


async def extract_window(
    source: Source,
    stream: str,
    *,
    start_seq: int | None = None,
    end_seq: int | None = None,
    start_time: float | None = None,
    end_time: float | None = None,
) -> AsyncIterator[StoredMessage]:
    """The messages of one stream inside a window of sequences and/or receipt times (inclusive).

    A start time is resolved to a sequence by the source (JetStream: an ordered consumer by
    start time); the window then reads forward in sequence order.
    """
    first, last = await source.bounds(stream)
    if last == 0:
        return
    lo = max(first, start_seq or 1)
    if start_time is not None:
        at = await source.first_seq_at(stream, start_time)
        if at is None:
            return
        lo = max(lo, at)
    hi = last if end_seq is None else min(end_seq, last)
    if hi < lo:
        return
    reader = await source.reader(stream, lo)
    try:
        async for msg in reader.take(hi):
            if end_time is not None and msg.time > end_time:
                return
            yield msg
    finally:
        await reader.close()


async def read_range(source: Source, stream: str, start_seq: int, end_seq: int) -> list[StoredMessage]:
    reader = await source.reader(stream, start_seq)
    try:
        return [m async for m in reader.take(end_seq)]
    finally:
        await reader.close()


# --- the log (JetStream or InMemoryLog) -------------------------------------------------------


class _LogReader:
    def __init__(self, source: "LogSource", stream: str, start_seq: int, last: int) -> None:
        self.stream = stream
        self._source = source
        self._start = max(1, start_seq)
        self._last = last
        self._sub: Any = None
        self._buffered: StoredMessage | None = None
        self._done = False
        self._prev: int | None = None  # the sequence last read from the server

    async def take(self, end_seq: int) -> AsyncIterator[StoredMessage]:
        if self._done:
            return
        buffered = self._buffered
        if buffered is not None:
            if buffered.seq > end_seq:
                return
            self._buffered = None
            yield buffered
            if buffered.seq >= end_seq:
                return
        stop = min(end_seq, self._last)
        if self._sub is None:
            if self._start > stop:
                return
            self._sub = await self._source.log.subscribe(self.stream, start_seq=self._start)
        sub = self._sub
        while True:
            msg = await sub.next(timeout=LOG_READ_TIMEOUT_SECONDS)
            if msg is None:
                # Only possible when the messages up to `stop` were removed (retention/deletion).
                self._done = True
                return
            if self._prev is not None and msg.seq > self._prev + 1:
                self._source.missing[self.stream] = self._source.missing.get(self.stream, 0) + msg.seq - self._prev - 1
            self._prev = msg.seq
            if msg.seq > end_seq:
                self._buffered = msg
                return
            yield msg
            if msg.seq >= stop:
                if msg.seq >= self._last:
                    self._done = True
                return

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.close()
            self._sub = None


class LogSource:
    """Replay straight from the log: one ordered consumer per stream, advanced plan by plan."""

    kind = "jetstream"

    def __init__(self, log: EventLog, *, description: str = "jetstream") -> None:
        self.log = log
        self.description = description
        self._warnings: list[str] = []
        # Messages read past and no longer in the log, per stream: a subject's history limit (a
        # host that flooded its own subject overwrote heartbeats the controller had folded) or a
        # deletion removed them. Plans that folded them cannot reproduce from the log.
        self.missing: dict[str, int] = {}
        # Verified as the log's own readers verify (None: a log without identities).
        self.authorship: Authorship | None = getattr(log, "authorship", None)
        self._last: dict[str, int] = {}

    async def _last_seq(self, stream: str) -> int:
        if stream not in self._last:
            self._last[stream] = await self.log.last_sequence(stream)
        return self._last[stream]

    async def bounds(self, stream: str) -> tuple[int, int]:
        last = await self._last_seq(stream)
        if last == 0:
            return (0, 0)
        async for msg in self.log.replay(stream, start_seq=1, end_seq=last):
            return (msg.seq, last)
        return (0, 0)

    async def first_seq_at(self, stream: str, time: float) -> int | None:
        # An ordered consumer by start time: the server finds the first message at or after it.
        last = await self._last_seq(stream)
        if last == 0:
            return None
        async for msg in self.log.replay(stream, start_time=time, end_seq=last):
            return msg.seq
        return None

    async def reader(self, stream: str, start_seq: int = 1) -> StreamReader:
        return _LogReader(self, stream, start_seq, await self._last_seq(stream))

    @property
    def warnings(self) -> list[str]:
        return self._warnings + [
            f"{stream}: {n} message(s) between those replayed are no longer in the log (a subject's history "
            "limit or a deletion removed them after the controller folded them): plans that used them cannot "
            "reproduce from the log; `gridctl replay --source duckdb` reads the analytics store's copy"
            for stream, n in sorted(self.missing.items())
        ]

    async def close(self) -> None:
        return None


# --- an export file ---------------------------------------------------------------------------


class _ExportLine(msgspec.Struct):
    stream: str
    seq: int
    subject: str
    time: float
    type: str | None = None
    valid: bool = True
    event: msgspec.Raw = msgspec.Raw(b"null")
    # The stored headers (the producer's signature among them); absent in older exports.
    headers: dict[str, str] | None = None
    # The account key of the grid that exported the line (absent without identities).
    account: str | None = None


_line_decoder = msgspec.json.Decoder(_ExportLine)
_str_decoder = msgspec.json.Decoder(str)


def _line_message(line: bytes, where: str) -> StoredMessage:
    try:
        rec = _line_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SourceError(f"{where}: not a `gridctl events export` record: {exc}") from exc
    raw = bytes(rec.event)
    if rec.valid:
        data = raw
    else:
        # The exporter stores an undecodable payload as a JSON string of its (replaced) text.
        try:
            data = _str_decoder.decode(raw).encode("utf-8")
        except (msgspec.DecodeError, msgspec.ValidationError):
            data = raw
    return StoredMessage(rec.stream, rec.seq, rec.subject, data, rec.time, None, rec.headers or None)


def account_of(authorship: object | None) -> str | None:
    """The account key an authorship verifies against (an Identity's verifier, or a Verifier)."""
    if authorship is None:
        return None
    verifier = getattr(authorship, "verifier", authorship)
    account = getattr(verifier, "account", None)
    return account if isinstance(account, str) and account else None


class _FileIndex:
    def __init__(self) -> None:
        self.seqs = array("q")
        self.offsets = array("q")
        self.lengths = array("l")
        self.times = array("d")
        self.lines = array("q")


class _FileReader:
    def __init__(self, source: "FileSource", stream: str, start: int) -> None:
        self.stream = stream
        self._source = source
        self._index = source._index[stream]
        self._i = start
        self._f: Any = None

    async def take(self, end_seq: int) -> AsyncIterator[StoredMessage]:
        idx = self._index
        n = len(idx.seqs)
        if self._i >= n or idx.seqs[self._i] > end_seq:
            return
        if self._f is None:
            self._f = open(self._source.path, "rb")
        f = self._f
        while self._i < n and idx.seqs[self._i] <= end_seq:
            i = self._i
            f.seek(idx.offsets[i])
            line = f.read(idx.lengths[i])
            self._i += 1
            yield _line_message(line, f"{self._source.path} line {idx.lines[i]}")

    async def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class FileSource:
    """An NDJSON export, indexed once (offsets only); payloads are read lazily per stream.

    `authorship` is the replaying operator's own identity, if any: it verifies the file's
    signatures when the file records that same grid's account key (or none). A file recording
    another account is verified against the key it records (a warning says so); a file with no
    signatures at all is replayed unverified (a warning says so too).
    """

    kind = "file"

    def __init__(self, path: str | os.PathLike[str], *, authorship: Authorship | None = None) -> None:
        self.path = Path(path)
        self.description = f"file {self.path}"
        self.warnings: list[str] = []
        if not self.path.is_file():
            raise SourceError(f"export file {self.path} does not exist")
        self._index: dict[str, _FileIndex] = {}
        self._signed = 0
        self._accounts: set[str] = set()
        self._build_index()
        self.authorship = self._trust(authorship)

    def _trust(self, own: Authorship | None) -> Authorship | None:
        """Who verifies this file's messages (see the class docstring)."""
        if not self._signed:
            self.warnings.append(
                f"{self.path.name} carries no signatures (exported before events were signed, or by a grid "
                "without identities): its events were replayed without verifying who wrote them"
            )
            return None
        if len(self._accounts) > 1:
            raise SourceError(f"{self.path} mixes exports of several grids (accounts {', '.join(sorted(self._accounts))})")
        recorded = next(iter(self._accounts), None)
        mine = account_of(own)
        if own is not None and (recorded is None or recorded == mine):
            return own
        if recorded is None:
            self.warnings.append(
                f"{self.path.name} records no account key and this operator has no credential to verify with: "
                "its events were replayed without verifying who wrote them"
            )
            return None
        if mine is not None:
            self.warnings.append(
                f"{self.path.name} was exported by another grid (account {recorded[:12]}..., this operator's is "
                f"{mine[:12]}...): signatures were verified against the account key the file records"
            )
        return Verifier(recorded)  # type: ignore[return-value]  # verifies only, which is all a replay asks

    def _build_index(self) -> None:
        guards: dict[str, _GapGuard] = {}
        offset = 0
        with open(self.path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                length = len(line)
                body = line.strip()
                if body:
                    try:
                        rec = _line_decoder.decode(body)
                    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                        raise SourceError(f"{self.path} line {lineno}: not a `gridctl events export` record: {exc}") from exc
                    if rec.stream not in ALL_STREAMS:
                        raise SourceError(f"{self.path} line {lineno}: unknown stream {rec.stream!r}")
                    guard = guards.get(rec.stream)
                    if guard is None:
                        guard = guards[rec.stream] = _GapGuard(rec.stream, f"file {self.path.name}")
                        self._index[rec.stream] = _FileIndex()
                    guard.check(rec.seq)
                    if rec.headers and SIG_HEADER in rec.headers and SIGNER_HEADER in rec.headers:
                        self._signed += 1
                    if rec.account:
                        self._accounts.add(rec.account)
                    idx = self._index[rec.stream]
                    idx.seqs.append(rec.seq)
                    idx.offsets.append(offset)
                    idx.lengths.append(length)
                    idx.times.append(rec.time)
                    idx.lines.append(lineno)
                offset += length

    async def bounds(self, stream: str) -> tuple[int, int]:
        idx = self._index.get(stream)
        if idx is None or not idx.seqs:
            return (0, 0)
        return (idx.seqs[0], idx.seqs[-1])

    async def first_seq_at(self, stream: str, time: float) -> int | None:
        idx = self._index.get(stream)
        if idx is None:
            return None
        i = bisect.bisect_left(idx.times, time)
        return idx.seqs[i] if i < len(idx.seqs) else None

    async def reader(self, stream: str, start_seq: int = 1) -> _FileReader:
        idx = self._index.get(stream)
        if idx is None:
            self._index[stream] = idx = _FileIndex()
        return _FileReader(self, stream, bisect.bisect_left(idx.seqs, start_seq))

    async def close(self) -> None:
        return None


# --- the DuckDB analytics store ---------------------------------------------------------------

# request_features columns that map straight onto RequestFeatures fields.
_FEATURE_COLUMNS: tuple[str, ...] = (
    "endpoint", "requested_model", "served_model", "host_id", "modality", "input_units", "output_units",
    "workload", "service_seconds", "queue_seconds", "outcome", "status_code", "finished_at", "auto",
)
_LOST_FEATURE_FIELDS: tuple[str, ...] = tuple(
    sorted(set(RequestFeatures.__struct_fields__) - set(_FEATURE_COLUMNS))
)


class _DuckDBReader:
    """Reads ahead in chunks of sequences (one range query per chunk), yields up to each end."""

    def __init__(self, source: "DuckDBSource", stream: str, start_seq: int) -> None:
        self.stream = stream
        self._source = source
        self._next = max(1, start_seq)
        self._buffer: collections.deque[StoredMessage] = collections.deque()
        self._guard = _GapGuard(stream, "the DuckDB store")
        self._exhausted = False

    def _fill(self) -> None:
        con = self._source.con
        stream = self.stream
        rows = con.execute(
            "SELECT seq, subject, time, type, payload FROM events WHERE stream = ? AND seq >= ? AND seq < ? ORDER BY seq",
            [stream, self._next, self._next + DUCKDB_CHUNK_ROWS],
        ).fetchall()
        if not rows:
            # Nothing in this range: find where the stream continues (a gap), if anywhere.
            row = con.execute("SELECT min(seq) FROM events WHERE stream = ? AND seq >= ?", [stream, self._next]).fetchone()
            if row is None or row[0] is None:
                self._exhausted = True
                return
            self._note_rejected(self._next, int(row[0]))
            self._next = int(row[0])
            return self._fill()
        self._note_rejected(self._next, rows[-1][0])
        batches = [r[0] for r in rows if r[3] == BATCH_TAG and not r[4]]
        features = self._source._batch_features(stream, batches[0], batches[-1]) if batches else {}
        for seq, subject, time, tag, payload in rows:
            if tag == BATCH_TAG and not payload:
                data = self._source._rebuild_batch(stream, seq, time, features.get(seq, ()))
            else:
                data = payload.encode("utf-8")
            self._buffer.append(StoredMessage(stream, seq, subject, data, time))
        self._next = rows[-1][0] + 1

    def _note_rejected(self, lo: int, hi: int) -> None:
        """Messages the sink read and kept no row of (rejected, or over a host's budget) between
        `lo` and `hi`: not a gap."""
        if self._source.keeps_rejected:
            self._guard.rejected.update(seq for (seq,) in self._source.con.execute(
                "SELECT seq FROM rejected WHERE stream = ? AND seq >= ? AND seq <= ?", [self.stream, lo, hi],
            ).fetchall())

    async def take(self, end_seq: int) -> AsyncIterator[StoredMessage]:
        buffer = self._buffer
        while True:
            if not buffer:
                if self._exhausted:
                    return
                self._fill()
                if not buffer:
                    return
            msg = buffer[0]
            if msg.seq > end_seq:
                return
            buffer.popleft()
            self._guard.check(msg.seq)
            yield msg

    async def close(self) -> None:
        self._buffer.clear()


class DuckDBSource:
    """The analytics store (``grid.analytics``): rows keyed by (stream, seq)."""

    kind = "duckdb"

    def __init__(self, con: Any, *, description: str = "duckdb") -> None:
        self.con = con
        self.description = description
        self.warnings: list[str] = []
        # The sink verified each event before storing it; the store keeps no signatures.
        self.authorship: Authorship | None = None
        self.lossy_request_batches = 0
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if "events" not in tables:
            raise SourceError(f"{description} has no `events` table: is it a grid analytics store?")
        self._positions: dict[str, int] = {}
        # A store written before the sink recorded what it rejected has no such table.
        self.keeps_rejected = "rejected" in tables
        if "sink_positions" in tables:
            self._positions = dict(con.execute("SELECT stream, seq FROM sink_positions").fetchall())

    async def bounds(self, stream: str) -> tuple[int, int]:
        row = self.con.execute("SELECT min(seq), max(seq) FROM events WHERE stream = ?", [stream]).fetchone()
        if row is None or row[0] is None:
            return (0, 0)
        return (int(row[0]), int(row[1]))

    async def first_seq_at(self, stream: str, time: float) -> int | None:
        row = self.con.execute("SELECT min(seq) FROM events WHERE stream = ? AND time >= ?", [stream, time]).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    async def reader(self, stream: str, start_seq: int = 1) -> _DuckDBReader:
        reader = _DuckDBReader(self, stream, start_seq)
        first, _ = await self.bounds(stream)
        if first and start_seq > first:
            reader._guard.last = start_seq - 1  # reading on from inside the stream: the next one must follow
        return reader

    def _batch_features(self, stream: str, lo: int, hi: int) -> dict[int, list[tuple[Any, ...]]]:
        cols = ", ".join(_FEATURE_COLUMNS)
        out: dict[int, list[tuple[Any, ...]]] = {}
        for row in self.con.execute(
            f"SELECT seq, {cols} FROM request_features WHERE stream = ? AND seq >= ? AND seq <= ? ORDER BY seq, idx",
            [stream, lo, hi],
        ).fetchall():
            out.setdefault(row[0], []).append(row[1:])
        return out

    def _rebuild_batch(self, stream: str, seq: int, time: float, rows: Any) -> bytes:
        if self.lossy_request_batches == 0:
            self.warnings.append(
                "request batches were rebuilt from request_features (the store keeps no RequestBatch payload): "
                f"event_id, at, source and {', '.join(_LOST_FEATURE_FIELDS)} are lost, so demand folded from "
                "them may differ from what the controller saw"
            )
        self.lossy_request_batches += 1
        records = tuple(
            RequestFeatures(**{k: v for k, v in zip(_FEATURE_COLUMNS, row) if v is not None}) for row in rows
        )
        return codec.encode(RequestBatch(event_id=f"duckdb-{stream}-{seq}", at=time, source="duckdb", records=records))

    def synced_to(self, stream: str) -> int | None:
        return self._positions.get(stream)

    async def close(self) -> None:
        return None


def stream_names() -> tuple[str, ...]:
    return ALL_STREAMS


__all__ = [
    "DuckDBSource",
    "FileSource",
    "LogSource",
    "PLANS_STREAM",
    "SOURCE_KINDS",
    "Source",
    "SourceError",
    "StreamReader",
    "Window",
    "extract_window",
    "read_range",
]
