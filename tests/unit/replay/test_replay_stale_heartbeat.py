"""Replay judges heartbeat freshness exactly as the live folds did.

A session is recorded on a signed log; between ticks a host's earlier heartbeat is stored again,
byte for byte with its signature, both soon after (older than the host's newer heartbeats) and
long after (older than receipt minus the allowed skew). The session's own controller rejected
both as `stale_replay`; `gridctl replay` (replay_window) lists the same positions with the same
reason and every plan still reproduces byte for byte.
"""

from __future__ import annotations

from pathlib import Path

from grid.clock import SimulatedClock
from grid.events.authorship import SIGNED_TIME_SKEW_SECONDS, STALE_REPLAY
from grid.events.log import InMemoryLog
from grid.events.subjects import HOSTS_STREAM, host_subject
from replay import LogSource, replay_window
from tests.identities import Identities
from tests.unit.replay.session import Session


async def test_replayed_heartbeats_are_rejected_alike_live_and_on_replay(tmp_path: Path) -> None:
    ids = Identities(tmp_path / "grid")
    clock = SimulatedClock(1_800_000_000.0)
    log = InMemoryLog(clock, authorship=ids.controller)
    session = Session(log, clock, hosts=3, models=2)
    await session.setup()
    replayed: list[tuple[str, int]] = []
    first = None
    for r in range(4):
        await session.heartbeats()
        if first is None:
            first = [m async for m in log.replay(HOSTS_STREAM) if m.subject == host_subject("host-1", "heartbeat")][0]
        clock.advance(2.0)
        if r in (1, 3):  # soon after (within the skew), then long after it
            assert first is not None and first.headers is not None
            own, log.authorship = log.authorship, None  # stored as it was: its own signature
            try:
                res = await log.append_raw(first.subject, first.data, headers=dict(first.headers))
            finally:
                log.authorship = own
            replayed.append((res.stream, res.seq))
        await session.requests()
        clock.advance(1.0 if r < 3 else SIGNED_TIME_SKEW_SECONDS * 3)
        await session.tick()
        clock.advance(2.0)
    assert session.runner.rejected == {STALE_REPLAY: 2}

    result = await replay_window(LogSource(log))
    assert result.reproduced, result.summary
    assert result.summary.plans_compared == len(session.plans) == 4
    assert {(r.stream, r.seq): r.reason for r in result.rejections} == {pos: STALE_REPLAY for pos in replayed}
    assert result.rejected == {STALE_REPLAY: 2}
