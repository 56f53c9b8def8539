"""Replay judges authorship with the live folds' rules and carries on past what they reject.

A session is recorded on a signed log (the controller's identity), with forged events mixed in:
an unsigned heartbeat, a host's heartbeat naming another host on its own subject, a heartbeat
signed by a host for another host's subject, a plan no controller signed, and a host's messages
after its key was revoked on the log. Every plan still reproduces byte for byte (the session's
own controller skipped the same events), and the replay lists each rejected event.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from grid.cli.events import _ndjson_line
from grid.clock import SimulatedClock
from grid.events import codec
from grid.events.base import Event
from grid.events.control import CredentialRevoked
from grid.events.host import HostHeartbeat
from grid.events.log import InMemoryLog
from grid.events.subjects import ALL_STREAMS, CONTROL_STREAM, PLAN_SUBJECT, PLANS_STREAM, host_subject
from grid.identity.permissions import Role
from grid.identity.provenance import SUBJECT_MISMATCH
from grid.identity.signing import Identity, NOT_PERMITTED, REVOKED_SIGNER, UNKNOWN_SIGNER, UNSIGNED
from replay import FileSource, LogSource, replay_window
from tests.identities import Identities
from tests.unit.replay.session import Session
from tests import heartbeats


class Forger:
    def __init__(self, log: InMemoryLog, ids: Identities) -> None:
        self.log = log
        self.ids = ids

    async def as_(self, author: Identity | None, event: Event, subject: str | None = None) -> tuple[str, int, str]:
        own = self.log.authorship
        self.log.authorship = author
        try:
            if subject is None:
                res = await self.log.append(event)
            else:
                res = await self.log.append_raw(subject, codec.encode(event))
        finally:
            self.log.authorship = own
        return res.stream, res.seq, subject or ""


def heartbeat(host: str, n: int, at: float) -> HostHeartbeat:
    return heartbeats.heartbeat(host, event_id=f"forged-{host}-{n}", at=at, capacity_mb=64_000, state="accepting")


@pytest.fixture
async def recorded(tmp_path: Path) -> tuple[InMemoryLog, Session, Identities, dict[str, tuple[str, int]]]:
    ids = Identities(tmp_path / "grid")
    clock = SimulatedClock(1_800_000_000.0)
    log = InMemoryLog(clock, authorship=ids.controller)
    session = Session(log, clock, hosts=4, models=3)
    forger = Forger(log, ids)
    await session.setup()
    forged: dict[str, tuple[str, int]] = {}
    session.kept = kept = {}  # type: ignore[attr-defined]
    host1 = ids.host("host-1")
    for r in range(5):
        await session.heartbeats()
        clock.advance(5.0)
        now = clock.now()
        if r == 1:
            stream, seq, _ = await forger.as_(None, heartbeat("host-1", r, now))
            forged[UNSIGNED] = (stream, seq)
            stream, seq, _ = await forger.as_(host1, heartbeat("host-2", r, now), host_subject("host-1", "heartbeat"))
            forged[SUBJECT_MISMATCH] = (stream, seq)
            stream, seq, _ = await forger.as_(host1, heartbeat("host-3", r, now))
            forged[NOT_PERMITTED] = (stream, seq)
            stream, seq, _ = await forger.as_(Identities(tmp_path / "elsewhere").controller, heartbeat("host-0", r, now))
            forged[UNKNOWN_SIGNER] = (stream, seq)
            # A plan nobody signed (a copy of the last one).
            plan = msgspec.structs.replace(session.plans[-1], event_id="forged-plan")
            stream, seq, _ = await forger.as_(None, plan)
            forged["plan"] = (stream, seq)
        if r == 2:
            stream, seq, _ = await forger.as_(host1, heartbeat("host-1", r, now))  # still valid: folded
            kept["before_revocation"] = (stream, seq)
            # Later in receipt time (at the same instant the control stream would come first).
            clock.advance(1.0)
            stream, seq, _ = await forger.as_(ids.operator, CredentialRevoked(event_id="rv", at=now, host_id="host-1",
                                                             keys=(host1.public_key,), reason="stolen"))
            kept["revocation"] = (stream, seq)
            clock.advance(1.0)
            stream, seq, _ = await forger.as_(host1, heartbeat("host-1", r + 100, clock.now()))
            forged[REVOKED_SIGNER] = (stream, seq)
        clock.advance(5.0)
        await session.requests()
        await session.heartbeats()
        clock.advance(10.0)
        await session.tick()
        clock.advance(5.0)
    return log, session, ids, forged


def expected(forged: dict[str, tuple[str, int]]) -> dict[tuple[str, int], str]:
    return {pos: (UNSIGNED if name == "plan" else name) for name, pos in forged.items()}


async def test_replay_from_the_log_carries_on_and_lists_every_rejected_event(recorded) -> None:
    log, session, _ids, forged = recorded
    # The live controller skipped the same events (its runner verified with the log's identity).
    assert session.runner.rejected[UNSIGNED] >= 1
    result = await replay_window(LogSource(log))
    assert result.reproduced, result.summary
    assert result.summary.plans_compared == len(session.plans) == 5
    listed = {(r.stream, r.seq): r.reason for r in result.rejections}
    assert listed == expected(forged)
    assert result.rejected == {UNSIGNED: 2, SUBJECT_MISMATCH: 1, NOT_PERMITTED: 1, UNKNOWN_SIGNER: 1,
                               REVOKED_SIGNER: 1}
    roles = {(r.stream, r.seq): r.role for r in result.rejections}
    assert roles[forged[SUBJECT_MISMATCH]] == roles[forged[REVOKED_SIGNER]] == Role.HOST.value
    assert roles[forged[UNSIGNED]] == ""
    assert any("6 events rejected: " in w for w in result.warnings)
    # The report is plain data (gridctl replay --json prints it).
    out = json.loads(msgspec.json.encode(result))
    assert {"stream": PLANS_STREAM, "seq": forged["plan"][1], "subject": PLAN_SUBJECT, "reason": UNSIGNED,
            "signer": "", "role": ""} in out["rejections"]


async def export(log: InMemoryLog, path: Path, *, account: str | None, headers: bool = True) -> Path:
    with open(path, "wb") as f:
        for stream in ALL_STREAMS:
            async for msg in log.replay(stream):
                f.write(_ndjson_line(msg.stream, msg.seq, msg.subject, msg.time, msg.data,
                                     msg.headers if headers else None, account))
    return path


async def test_an_export_file_carries_the_signatures_and_replays_alike(recorded, tmp_path: Path) -> None:
    log, session, ids, forged = recorded
    path = await export(log, tmp_path / "signed.ndjson", account=ids.account)
    line = json.loads(path.read_text().splitlines()[0])
    assert line["account"] == ids.account and "Grid-Sig" in line["headers"]
    # Verified with the replaying operator's own credential...
    mine = FileSource(path, authorship=ids.operator)
    assert mine.authorship is ids.operator and not mine.warnings
    # ...or, without one, against the account key the file records.
    recorded_key = FileSource(path)
    for source in (mine, recorded_key):
        result = await replay_window(source)
        assert result.reproduced, result.summary
        assert {(r.stream, r.seq): r.reason for r in result.rejections} == expected(forged)
    # An operator of another grid verifies against the file's key, and says so.
    stranger = FileSource(path, authorship=Identities(tmp_path / "stranger").operator)
    assert any("exported by another grid" in w for w in stranger.warnings)
    assert {(r.stream, r.seq) for r in (await replay_window(stranger)).rejections} == set(expected(forged))


async def test_an_old_export_without_headers_replays_unverified_with_a_warning(recorded, tmp_path: Path) -> None:
    log, _session, ids, forged = recorded
    path = await export(log, tmp_path / "old.ndjson", account=None, headers=False)
    source = FileSource(path, authorship=ids.operator)
    assert source.authorship is None
    result = await replay_window(source)
    assert any("carries no signatures" in w for w in result.warnings)
    # Only what the subject itself refutes is rejected; the plan nobody signed is re-run too.
    assert {(r.stream, r.seq): r.reason for r in result.rejections} == {forged[SUBJECT_MISMATCH]: SUBJECT_MISMATCH}
    assert forged["plan"][1] in {p.plan_seq for p in result.plans}


async def test_a_revocation_applies_from_its_log_position(recorded) -> None:
    log, session, _ids, forged = recorded
    result = await replay_window(LogSource(log))
    rejected = {(r.stream, r.seq) for r in result.rejections}
    # The revoked key's heartbeat before the revocation folds; the one after it is refused.
    assert session.kept["before_revocation"] not in rejected
    assert forged[REVOKED_SIGNER] in rejected
    assert session.kept["revocation"] not in rejected and session.kept["revocation"][0] == CONTROL_STREAM
