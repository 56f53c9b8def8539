"""The DuckDB sink stores only what a grid identity provably wrote for its subject.

A message that is unsigned, badly signed, signed by a key another grid issued, by a principal
that may not write its subject, by a key revoked earlier in the log, or that its subject does
not vouch for, writes no row (forged bytes are never stored), moves the position on, and is
counted by reason.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import duckdb
import pytest

from grid.analytics.schema import TABLES
from grid.analytics.sink import AnalyticsSink, open_store
from grid.clock import SimulatedClock
from grid.events import codec
from grid.events.authorship import SIG_HEADER
from grid.events.base import Event
from grid.events.control import CredentialRevoked
from grid.events.host import HostHeartbeat, Residency
from grid.events.log import InMemoryLog
from grid.events.requests import RequestCompleted, RequestFeatures
from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM, REQUESTS_STREAM, host_subject
from grid.identity.permissions import Role
from grid.identity.provenance import SUBJECT_MISMATCH
from grid.identity.signing import (
    BAD_SIGNATURE,
    NOT_PERMITTED,
    REVOKED_SIGNER,
    UNKNOWN_SIGNER,
    UNSIGNED,
    Identity,
)
from grid.projections.runner import ReplayError
from replay.extract import DuckDBSource, extract_window
from tests.identities import Identities
from tests import heartbeats

T0 = 1_800_000_000.0
DATA_TABLES = [t for t in TABLES if t != "sink_positions"]


def heartbeat(host: str, n: int) -> HostHeartbeat:
    return heartbeats.heartbeat(host, Residency(model_id="m.gguf", memory_mb=900, state="ready"),
                                event_id=f"hb-{host}-{n}", at=T0 + n, capacity_mb=8000)


def completed(n: int) -> RequestCompleted:
    return RequestCompleted(event_id=f"rc-{n}", at=T0 + n, features=RequestFeatures(
        endpoint="chat", requested_model="m.gguf", input_units=10, output_units=5, finished_at=T0 + n))


class Writer:
    """One log, appended to as whichever identity a step names (None: unsigned)."""

    def __init__(self, ids: Identities) -> None:
        self.clock = SimulatedClock(T0)
        self.log = InMemoryLog(self.clock)
        self.ids = ids

    async def put(self, event: Event, author: Identity | None, *, subject: str | None = None) -> int:
        self.clock.advance(1.0)
        self.log.authorship = author
        try:
            if subject is None:
                return (await self.log.append(event)).seq
            return (await self.log.append_raw(subject, codec.encode(event))).seq
        finally:
            self.log.authorship = None


def counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in DATA_TABLES}  # type: ignore[index]


def stored(con: duckdb.DuckDBPyConnection) -> list[tuple[str, int]]:
    return [tuple(r) for r in con.execute("SELECT stream, seq FROM events ORDER BY stream, seq").fetchall()]  # type: ignore[misc]


@pytest.fixture
def ids(tmp_path: Path) -> Identities:
    return Identities(tmp_path / "grid")


async def test_forged_and_unsigned_messages_write_nothing_and_are_counted(ids: Identities, tmp_path: Path) -> None:
    w = Writer(ids)
    good = await w.put(heartbeat("node-1", 1), ids.host("node-1"))
    unsigned = await w.put(heartbeat("node-1", 2), None)
    # node-1 names node-2 inside a message on its own subject: signed, but not vouched for.
    mismatch = await w.put(heartbeat("node-2", 3), ids.host("node-1"), subject=host_subject("node-1", "heartbeat"))
    # node-1 signs for node-2's subject (a reflected message would be stored there).
    not_permitted = await w.put(heartbeat("node-2", 4), ids.host("node-1"))
    # A key another grid's account issued.
    foreign = await w.put(heartbeat("node-1", 5), Identities(tmp_path / "other").host("node-1"))
    # A signature that does not cover what is stored.
    w.log.authorship = ids.host("node-1")
    sig = ids.host("node-1").sign(host_subject("node-1", "heartbeat"), b"other bytes")
    w.log.authorship = None
    w.clock.advance(1.0)
    bad = (await w.log.append_raw(host_subject("node-1", "heartbeat"), codec.encode(heartbeat("node-1", 6)),
                                  headers=sig)).seq
    served = await w.put(completed(7), ids.gateway)
    forged_request = await w.put(completed(8), ids.host("node-1"))

    con = open_store(":memory:")
    sink = AnalyticsSink(con)
    w.log.authorship = ids.operator  # the reader's own identity: the trust anchor
    read = await sink.sync(w.log)
    assert read == 8
    assert stored(con) == [(HOSTS_STREAM, good), (REQUESTS_STREAM, served)]
    assert counts(con) == {**{t: 0 for t in DATA_TABLES}, "events": 2, "residencies": 1, "request_features": 1,
                           "rejected": 6}
    # Every position moved on: nothing is read twice.
    assert sink.positions() == {HOSTS_STREAM: bad, REQUESTS_STREAM: forged_request}
    assert sink.rejected == {UNSIGNED: 1, SUBJECT_MISMATCH: 1, NOT_PERMITTED: 2, UNKNOWN_SIGNER: 1,
                             BAD_SIGNATURE: 1}
    by_seq = {(r.stream, r.seq): r for r in sink.gate.rejections}
    assert by_seq[(HOSTS_STREAM, unsigned)].reason == UNSIGNED
    assert by_seq[(HOSTS_STREAM, mismatch)].reason == SUBJECT_MISMATCH
    assert by_seq[(HOSTS_STREAM, mismatch)].role == Role.HOST.value
    assert by_seq[(HOSTS_STREAM, not_permitted)].reason == NOT_PERMITTED
    assert by_seq[(HOSTS_STREAM, foreign)].reason == UNKNOWN_SIGNER
    assert by_seq[(HOSTS_STREAM, bad)].reason == BAD_SIGNATURE
    assert by_seq[(REQUESTS_STREAM, forged_request)].reason == NOT_PERMITTED
    assert sink.malformed == 0
    # A second pass reads nothing new and stores nothing.
    assert await sink.sync(w.log) == 0 and stored(con) == [(HOSTS_STREAM, good), (REQUESTS_STREAM, served)]


async def test_a_replay_from_the_store_reads_past_what_the_sink_rejected(ids: Identities) -> None:
    """The sink keeps the position and reason of each message it keeps no row of (never its
    bytes), so a replay from the store knows those sequences were read, not lost."""
    w = Writer(ids)
    first = await w.put(heartbeat("node-1", 1), ids.host("node-1"))
    unsigned = [await w.put(heartbeat("node-1", n), None) for n in (2, 3, 4)]
    last = await w.put(heartbeat("node-1", 5), ids.host("node-1"))
    con = open_store(":memory:")
    sink = AnalyticsSink(con)
    w.log.authorship = ids.operator
    await sink.sync(w.log)
    assert con.execute("SELECT seq, reason FROM rejected ORDER BY seq").fetchall() == [(q, UNSIGNED) for q in unsigned]
    assert [m.seq async for m in extract_window(DuckDBSource(con), HOSTS_STREAM)] == [first, last]
    # A store written before the sink kept what it rejected: the same sequences are a gap.
    con.execute("DROP TABLE rejected")
    with pytest.raises(ReplayError, match="gap"):
        [m async for m in extract_window(DuckDBSource(con), HOSTS_STREAM)]


async def test_a_signed_message_is_stored_byte_for_byte(ids: Identities) -> None:
    w = Writer(ids)
    await w.put(heartbeat("node-1", 1), ids.host("node-1"))
    msg = [m async for m in w.log.replay(HOSTS_STREAM)][0]
    assert msg.headers is not None and SIG_HEADER in msg.headers
    con = open_store(":memory:")
    sink = AnalyticsSink(con, authorship=ids.controller)
    sink.add(msg)
    sink.flush()
    (payload,) = con.execute("SELECT payload FROM events").fetchone()  # type: ignore[misc]
    assert payload.encode() == msg.data and sink.rejected == {}


async def test_a_revocation_refuses_the_keys_later_messages_also_after_a_restart(ids: Identities) -> None:
    w = Writer(ids)
    host = ids.host("node-1")
    before = await w.put(heartbeat("node-1", 1), host)
    revocation = await w.put(CredentialRevoked(event_id="rv-1", at=T0 + 2, host_id="node-1",
                                               keys=(host.public_key,), reason="laptop lost"), ids.operator)
    after = await w.put(heartbeat("node-1", 3), host)
    other = await w.put(heartbeat("node-2", 4), ids.host("node-2"))

    con = open_store(":memory:")
    sink = AnalyticsSink(con, authorship=ids.operator)
    await sink.sync(w.log)
    assert stored(con) == [(CONTROL_STREAM, revocation), (HOSTS_STREAM, before), (HOSTS_STREAM, other)]
    assert sink.rejected == {REVOKED_SIGNER: 1}
    assert sink.gate.rejections[0].seq == after and sink.gate.revoked == {host.public_key: f"{CONTROL_STREAM}:{revocation}"}

    # A restarted sink takes the revocation back from the store and judges new messages alike.
    late = await w.put(heartbeat("node-1", 5), host)
    again = AnalyticsSink(con, authorship=ids.operator)
    assert again.gate.revoked == {host.public_key: f"{CONTROL_STREAM}:{revocation}"}
    await again.sync(w.log)
    assert again.rejected == {REVOKED_SIGNER: 1} and again.gate.rejections[0].seq == late
    assert (HOSTS_STREAM, late) not in stored(con)


async def test_a_sink_without_identities_verifies_nothing_but_subjects(ids: Identities) -> None:
    w = Writer(ids)
    await w.put(heartbeat("node-1", 1), None)
    await w.put(heartbeat("node-2", 2), ids.host("node-1"), subject=host_subject("node-1", "heartbeat"))
    con = open_store(":memory:")
    sink = AnalyticsSink(con)
    await sink.sync(w.log)  # the log has no authorship: nothing to verify against
    assert stored(con) == [(HOSTS_STREAM, 1)]
    assert sink.rejected == {SUBJECT_MISMATCH: 1}


async def test_a_failed_flush_does_not_count_its_rejections_twice(ids: Identities, tmp_path: Path) -> None:
    w = Writer(ids)
    await w.put(heartbeat("node-1", 1), ids.host("node-1"))
    await w.put(heartbeat("node-1", 2), None)
    con = open_store(tmp_path / "a.duckdb")
    sink = AnalyticsSink(con, authorship=ids.operator)
    async for msg in w.log.replay(HOSTS_STREAM):
        sink.add(msg)
    assert sink.rejected == {UNSIGNED: 1}
    con.execute("DROP TABLE residencies")  # the next insert fails: the batch is rolled back
    with pytest.raises(duckdb.Error):
        sink.flush()
    assert sink.rejected == {} and sink.gate.rejections == []


async def test_the_live_follow_judges_each_message_of_a_batch_as_a_sync_does(ids: Identities, tmp_path: Path) -> None:
    """Messages that queued while the sink was busy are checked in one worker-thread call: the
    forged ones are refused with their reasons and cost the honest ones around them nothing."""
    import asyncio

    w = Writer(ids)
    live_con = open_store(":memory:")
    live = AnalyticsSink(live_con)
    w.log.authorship = ids.operator  # the readers' own identity: the trust anchor
    follower = asyncio.create_task(live.follow(w.log, flush_seconds=0.05))
    await asyncio.sleep(0.1)
    w.log.authorship = None
    other_grid = Identities(tmp_path / "other").host("node-1")
    for n in range(60):
        author = (ids.host("node-1"), None, other_grid, ids.host("node-2"), ids.host("node-1"))[n % 5]
        await w.put(heartbeat("node-1", n), author)  # node-2 signing node-1's subject: not permitted
        await w.put(completed(n), ids.gateway if n % 2 else ids.host("node-1"))
    end = {HOSTS_STREAM: await w.log.last_sequence(HOSTS_STREAM),
           REQUESTS_STREAM: await w.log.last_sequence(REQUESTS_STREAM)}
    for _ in range(300):
        if all(live.committed.get(s, 0) >= q for s, q in end.items()):
            break
        await asyncio.sleep(0.02)
    follower.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await follower

    synced_con = open_store(":memory:")
    synced = AnalyticsSink(synced_con)
    w.log.authorship = ids.operator
    await synced.sync(w.log)
    assert live.positions() == synced.positions() == end
    assert stored(live_con) == stored(synced_con)
    assert counts(live_con) == counts(synced_con)
    assert live.rejected == synced.rejected == {UNSIGNED: 12, UNKNOWN_SIGNER: 12, NOT_PERMITTED: 42}


async def test_a_host_over_its_budget_writes_no_rows_and_costs_no_signature_check(ids: Identities) -> None:
    """A flood of a host's own valid heartbeats (all at one receipt time) fills no store: past its
    burst it is dropped before its signature is checked, counted as over_rate; an honest host's
    heartbeats among it are all stored."""
    from grid.projections.budget import HOST_BURST_MESSAGES, OVER_RATE

    w = Writer(ids)
    flooder, honest = ids.host("node-1"), ids.host("node-2")
    burst = int(HOST_BURST_MESSAGES)
    n = 0
    for i in range(burst + 200):
        w.log.authorship = flooder
        n += 1
        await w.log.append(heartbeat("node-1", n))  # the simulated clock stands still: one receipt time
        if i % 100 == 0:
            w.log.authorship = honest
            await w.log.append(heartbeat("node-2", n))
    w.log.authorship = None
    con = open_store(":memory:")
    sink = AnalyticsSink(con)
    w.log.authorship = ids.operator
    await sink.sync(w.log)
    assert sink.rejected == {OVER_RATE: 200}
    hosts = dict(con.execute("SELECT host_id, count(*) FROM events GROUP BY host_id").fetchall())
    assert hosts == {"node-1": burst, "node-2": (burst + 200 + 99) // 100}
    assert sink.budget is not None and sorted(sink.budget.flagged) == ["node-1"]
