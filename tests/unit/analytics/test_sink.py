"""The DuckDB sink: idempotent without key indexes, payloads kept byte for byte, zstd for documents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from bench._common import heartbeat, request_record
from grid.analytics.schema import TABLES
from grid.analytics.sink import AnalyticsSink, open_store
from grid.events import codec
from grid.events.log import StoredMessage
from grid.events.requests import RequestBatch, RequestCompleted
from grid.events.subjects import HOSTS_STREAM, REQUESTS_STREAM, subject_for

T0 = 1_800_000_000.0
DATA_TABLES = [t for t in TABLES if t != "sink_positions"]


def _messages(n: int) -> list[StoredMessage]:
    out = []
    for i in range(n):
        event: Any
        if i % 5 == 0:
            event, stream = heartbeat(i), HOSTS_STREAM
        elif i % 7 == 0:
            event = RequestBatch(event_id=f"rb-{i}", at=T0 + i, source="gw-1",
                                 records=(request_record(i), request_record(i + 1)))
            stream = REQUESTS_STREAM
        else:
            event, stream = RequestCompleted(event_id=f"rc-{i}", at=T0 + i, features=request_record(i)), REQUESTS_STREAM
        out.append(StoredMessage(stream=stream, seq=i + 1, subject=subject_for(event), data=codec.encode(event),
                                 time=T0 + i))
    return out


def _counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in DATA_TABLES}  # type: ignore[index]


def _dupes(con: duckdb.DuckDBPyConnection) -> int:
    total = 0
    for table, (columns, key) in TABLES.items():
        total += con.execute(
            f"SELECT count(*) FROM (SELECT {', '.join(key)} FROM {table} GROUP BY ALL HAVING count(*) > 1)"
        ).fetchone()[0]  # type: ignore[index]
    return total


def test_reingesting_the_same_events_adds_nothing(tmp_path: Path) -> None:
    msgs = _messages(400)
    con = open_store(tmp_path / "a.duckdb")
    sink = AnalyticsSink(con, batch_rows=10**9)
    for m in msgs[:250]:
        sink.add(m)
    sink.flush()
    for m in msgs:  # overlaps what is stored, then goes on
        sink.add(m)
    sink.flush()
    once = _counts(con)
    assert once["events"] == 400 and once["request_features"] > 300 and once["residencies"] == 80 * 3
    # A new sink on the same store (a restarted controller, `replay --sync`) re-reads everything.
    again = AnalyticsSink(con, batch_rows=10**9)
    for m in msgs:
        again.add(m)
    assert again.flush() == 0 and again.skipped == 400
    assert _counts(con) == once and _dupes(con) == 0
    con.close()
    # The positions survive a reopen with the rows (same transaction).
    con = open_store(tmp_path / "a.duckdb")
    third = AnalyticsSink(con)
    for m in msgs:
        third.add(m)
    assert third.flush() == 0 and _counts(con) == once
    con.close()


def test_a_sink_that_was_overtaken_inserts_only_what_is_new(tmp_path: Path) -> None:
    msgs = _messages(300)
    con = open_store(tmp_path / "b.duckdb")
    slow = AnalyticsSink(con, batch_rows=10**9)
    for m in msgs:
        slow.add(m)  # buffered, not yet flushed
    fast = AnalyticsSink(con, batch_rows=10**9)
    for m in msgs[:180]:
        fast.add(m)
    fast.flush()
    slow.flush()  # must skip what `fast` stored meanwhile
    ref = open_store(":memory:")
    one = AnalyticsSink(ref)
    for m in msgs:
        one.add(m)
    one.flush()
    assert _counts(con) == _counts(ref) and _dupes(con) == 0
    assert slow.positions() == one.positions()
    # What each sink committed, kept in memory for metrics: no further than what it stored itself.
    assert one.committed == one.positions() and fast.committed == {
        s: max(m.seq for m in msgs[:180] if m.stream == s) for s in {m.stream for m in msgs[:180]}}
    # A position never moves back: a sink that flushes older messages last leaves the newer one.
    late = AnalyticsSink(open_store(tmp_path / "f.duckdb"))
    for m in msgs[:100]:
        late.add(m)
    newer = AnalyticsSink(late.con)
    for m in msgs:
        newer.add(m)
    newer.flush()
    assert late.flush() == 0
    assert late.positions() == one.positions() and _counts(late.con) == _counts(ref)


def test_payloads_are_stored_exactly_and_undecodable_bytes_replaced(tmp_path: Path) -> None:
    msgs = _messages(30)
    bad = StoredMessage(stream=REQUESTS_STREAM, seq=1000, subject="grid.req.completed", data=b'{"type": "x\xff\xfe',
                        time=T0)
    con = open_store(tmp_path / "c.duckdb")
    sink = AnalyticsSink(con)
    for m in [*msgs, bad]:
        sink.add(m)
    sink.flush()
    stored = dict(con.execute("SELECT seq, payload FROM events WHERE stream = ? OR seq = 1000",
                              [REQUESTS_STREAM]).fetchall())
    for m in msgs:
        if m.stream == REQUESTS_STREAM:
            assert stored[m.seq] == m.data.decode()
    assert stored[1000] == bad.data.decode("utf-8", "replace") and sink.malformed == 1


def test_data_tables_have_no_key_index_and_documents_are_zstd(tmp_path: Path) -> None:
    con = open_store(tmp_path / "d.duckdb")
    sink = AnalyticsSink(con)
    for m in _messages(200):
        sink.add(m)
    sink.flush()
    con.execute("CHECKPOINT")
    indexed = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY'").fetchall()}
    assert indexed == {"sink_positions"}
    codecs = {r[0] for r in con.execute(
        "SELECT DISTINCT compression FROM pragma_storage_info('events') WHERE column_name = 'payload' "
        "AND segment_type = 'VARCHAR'").fetchall()}
    assert codecs == {"ZSTD"}


def test_no_private_columns() -> None:
    names = {c for columns, _ in TABLES.values() for c, _ in columns}
    for forbidden in ("prompt", "response", "messages", "user", "api_key", "affinity_key"):
        assert not any(forbidden in n for n in names), names


def test_a_failed_flush_stores_nothing_and_the_sink_resumes_from_the_store(tmp_path: Path) -> None:
    """A store from before (key indexes kept) with a row the sink does not expect: the batch's
    insert fails, the whole batch rolls back, and re-reading from the stored positions loses nothing."""
    con = duckdb.connect(str(tmp_path / "old.duckdb"))
    for name, (columns, key) in TABLES.items():
        cols = ", ".join(f"{c} {t}" for c, t in columns)
        con.execute(f"CREATE TABLE {name} ({cols}, PRIMARY KEY ({', '.join(key)}))")
    msgs = _messages(100)
    sink = AnalyticsSink(con)
    for m in msgs[:40]:
        sink.add(m)
    sink.flush()
    stored = _counts(con)
    victim = next(m for m in msgs[40:] if m.stream == REQUESTS_STREAM)
    con.execute("INSERT INTO request_features (stream, seq, idx) VALUES (?, ?, 0)", [victim.stream, victim.seq])
    for m in msgs[40:]:
        sink.add(m)
    committed = dict(sink.committed)
    with pytest.raises(duckdb.ConstraintException):
        sink.flush()
    assert sink.committed == committed == sink.positions()  # a failed flush commits no position
    after = _counts(con)
    assert after["events"] == stored["events"] and after["residencies"] == stored["residencies"]
    assert sink.pending_rows() == 0
    con.execute("DELETE FROM request_features WHERE stream = ? AND seq = ?", [victim.stream, victim.seq])
    for m in msgs:  # what a restarted follow() does: replay from the stored positions
        sink.add(m)
    sink.flush()
    ref = open_store(":memory:")
    one = AnalyticsSink(ref)
    for m in msgs:
        one.add(m)
    one.flush()
    assert _counts(con) == _counts(ref) and _dupes(con) == 0
