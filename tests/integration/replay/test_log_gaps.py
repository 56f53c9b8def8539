"""A replay from the log says so when messages it needed are gone from the log.

A recorded session on real JetStream; then one host floods its own heartbeat subject past the
stream's per-subject history (HOST_SUBJECT_HISTORY), as a hostile host did in bench.hostile_flood.
The server keeps the subject's newest messages only, so the heartbeats the controller folded for
the recorded plans are gone: those plans cannot reproduce from the log. `replay_window` names the
stream and how many messages between those it read are missing, and where an intact copy is (the
analytics store), instead of only reporting plans that differ.
"""

from __future__ import annotations

import pytest

from grid.clock import SystemClock
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.transport.jetstream import HOST_SUBJECT_HISTORY
from replay import LogSource, replay_window
from tests.unit.replay.session import Session

pytestmark = pytest.mark.slow


async def test_messages_a_flood_overwrote_are_named_by_the_replay(js_log) -> None:
    session = Session(js_log, SystemClock(), hosts=3, models=2, seed=5)
    plans = await session.run(rounds=3)
    subject = host_subject(session.hosts[0], "heartbeat")
    heartbeat = [m async for m in js_log.replay(HOSTS_STREAM) if m.subject == subject][-1]
    intact = await replay_window(LogSource(js_log))
    assert intact.reproduced and not any("no longer in the log" in w for w in intact.warnings)

    for _ in range(HOST_SUBJECT_HISTORY + 8):  # the host's own subject, past its history
        await js_log.append_raw(subject, heartbeat.data)

    result = await replay_window(LogSource(js_log))
    assert result.summary.plans_compared == len(plans)
    gaps = [w for w in result.warnings if "no longer in the log" in w]
    assert len(gaps) == 1 and gaps[0].startswith(f"{HOSTS_STREAM}: ") and "--source duckdb" in gaps[0], result.warnings
    assert not result.reproduced  # the plans folded heartbeats the log lost
