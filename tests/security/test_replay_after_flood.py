"""A replay from the log reproduces every plan made while a host flooded (issue 36, attack 5).

A host flooding its own heartbeat subject at its best rate used to have every message stored:
the subject's bounded history then held only the flood's last moments, the heartbeats the live
controller had folded and planned with were gone, and `gridctl replay` of that window folded
something else (7 of 12 plans reproduced). Through the ingress (grid.controller.ingress) the log
holds exactly what was within the host's budget, so the live fold and the replay read the same
messages. Real secured nats-server, the flood from its own process with the host's real
credential, plans recorded the controller's way (tests.unit.replay.session), `gridctl replay`
as a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grid.clock import SystemClock
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.identity.permissions import Role
from grid.transport.jetstream import HOST_SUBJECT_HISTORY, JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats
from tests.unit.replay.session import Session

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FLOODER = "host-1"
FLOOD_SECONDS = 6.0
# Acks in flight at once: as fast as the ingress answers.
FLOOD_WINDOW = 256


async def test_a_replay_from_the_log_reproduces_every_plan_made_while_a_host_flooded(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog, operator_home: Path,
) -> None:
    session = Session(controller_log, SystemClock(), hosts=3, models=2, seed=4)
    await session.setup()
    await session.heartbeats()
    await session.tick()
    subject = host_subject(FLOODER, "heartbeat")
    flood = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench._flooder", secured_server.url, str(creds(Role.HOST, host_id=FLOODER)), subject,
        str(FLOOD_SECONDS), "signed", FLOODER, str(FLOOD_WINDOW), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    done = asyncio.create_task(flood.communicate())
    # Plans all through the flood, each folding what the ingress stored of it so far.
    while not done.done():
        await session.heartbeats()
        await session.tick()
        await asyncio.sleep(0.3)
    out, err = done.result()
    assert flood.returncode == 0, err.decode()[-2000:]
    sent = json.loads(out.decode().strip().splitlines()[-1])
    await session.heartbeats()
    await session.tick()
    assert sent["sent"] > 2 * HOST_SUBJECT_HISTORY, sent  # enough to turn its history over, were it stored
    assert len(session.plans) >= 8

    # Only what was within the flooder's heartbeat budget was stored: its history never turned over.
    info = await controller_log.client.jetstream().stream_info(HOSTS_STREAM, subjects_filter=subject)
    stored = sum((info.state.subjects or {}).values())
    assert stored < HOST_SUBJECT_HISTORY, stored

    env = {**os.environ, "GRID_HOME": str(operator_home), "GRID_NATS_URL": secured_server.url, "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "grid.cli.main", "replay", "--check", "--json", "--no-store"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    replayed = json.loads(proc.stdout)
    assert replayed["summary"]["plans_compared"] == len(session.plans), replayed["summary"]
    assert replayed["reproduced"] is True, replayed["summary"]
