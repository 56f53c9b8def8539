"""`gridctl replay` over a window holding forged events, on a real server with identities.

A host writes a heartbeat naming another host on its own subject (signed, but not vouched for by
the subject), and a raw client with the host's credential publishes one without a signature.
The controller's folds skipped both, so replay must too: it exits 0, every recorded plan
reproduces, and the report lists the two events as rejected, from the log and from an export
file alike (the export carries the signatures and the grid's account key).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nats.js.errors
import pytest

from grid.clock import SystemClock
from grid.events import codec
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.identity.connect import connect_log
from grid.identity.permissions import Role
from grid.identity.provenance import SUBJECT_MISMATCH
from grid.identity.signing import UNSIGNED
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats, event, raw_client
from tests.unit.replay.session import Session

pytestmark = pytest.mark.slow


def gridctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grid.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.fixture
def operator_env(operator_home: Path, secured_server: SecuredNats) -> dict[str, str]:
    """gridctl on a grid home whose operator credential this module's authority issued."""
    return {**os.environ, "GRID_HOME": str(operator_home), "GRID_NATS_URL": secured_server.url, "COLUMNS": "200"}


async def test_replay_carries_on_past_forged_heartbeats_and_lists_them(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
    operator_env: dict[str, str], tmp_path: Path,
) -> None:
    session = Session(controller_log, SystemClock(), hosts=3, models=2, seed=4)
    await session.setup()
    await session.heartbeats()
    await session.tick()
    host_creds = creds(Role.HOST, host_id="host-1")
    host = await connect_log(secured_server.url, credentials=host_creds, ensure_streams=False)
    try:
        forged = event("host.heartbeat.v1", host_id="host-2")
        mismatch = await host.append_raw(host_subject("host-1", "heartbeat"), codec.encode(forged),
                                         msg_id=forged.event_id)
    finally:
        await host.close()
    unsigned_heartbeat = codec.encode(event("host.heartbeat.v1", host_id="host-1"))
    nc = await raw_client(secured_server, host_creds)
    try:  # a host's unsigned append never reaches the log: the ingress refuses it
        with pytest.raises(nats.js.errors.APIError, match="refused at the grid's ingress: unsigned"):
            await nc.jetstream().publish(host_subject("host-1", "heartbeat"), unsigned_heartbeat)
    finally:
        await nc.close()
    # One can still land there another way (any GRID client that may publish the subject, a
    # server-written reply): replay skips it like the folds do.
    nc = await raw_client(secured_server, creds(Role.CONTROLLER))
    try:
        ack = await nc.jetstream().publish(host_subject("host-1", "heartbeat"), unsigned_heartbeat)
        unsigned = int(ack.seq)
    finally:
        await nc.close()
    await session.heartbeats()
    await session.tick()  # a plan based on both forged events
    assert session.runner.rejected == {SUBJECT_MISMATCH: 1, UNSIGNED: 1}

    expected = [
        {"stream": HOSTS_STREAM, "seq": mismatch.seq, "subject": host_subject("host-1", "heartbeat"),
         "reason": SUBJECT_MISMATCH, "role": Role.HOST.value},
        {"stream": HOSTS_STREAM, "seq": unsigned, "subject": host_subject("host-1", "heartbeat"),
         "reason": UNSIGNED, "role": ""},
    ]

    def listed(out: dict) -> list[dict]:
        return sorted(({k: r[k] for k in ("stream", "seq", "subject", "reason", "role")} for r in out["rejections"]),
                      key=lambda r: r["seq"])

    proc = gridctl("replay", "--check", "--json", "--no-store", env=operator_env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = json.loads(proc.stdout)
    assert out["reproduced"] is True and out["summary"]["plans_compared"] == 2
    assert out["rejected"] == {SUBJECT_MISMATCH: 1, UNSIGNED: 1}
    assert listed(out) == expected

    # The table names them too.
    table = gridctl("replay", "--no-store", env=operator_env)
    assert table.returncode == 0, table.stderr
    assert "rejected events" in table.stdout and SUBJECT_MISMATCH in table.stdout
    assert "2 events rejected: subject_mismatch=1, unsigned=1" in " ".join(table.stderr.split())

    # From an export file: the lines carry the stored headers and the grid's account key.
    export = tmp_path / "window.ndjson"
    done = gridctl("events", "export", "-o", str(export), env=operator_env)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    signed = [line for line in lines if line.get("headers", {}).get("Grid-Sig")]
    assert len(signed) == len(lines) - 1  # all but the unsigned heartbeat
    assert {line.get("account") for line in lines} == {secured_server.authority.account_public}
    proc = gridctl("replay", "--source", "file", "--file", str(export), "--check", "--json", "--no-store",
                   env=operator_env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = json.loads(proc.stdout)
    assert out["reproduced"] is True and listed(out) == expected
