"""Durable state (atomic, owner-only, quarantined when corrupt) and PID ownership fencing."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from grid.agent.state import AgentPaths, AgentState, ProcessProof, ResidencyRecord, StateStore
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import HOST, heartbeats, make_command, wait_ack, wait_for


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def test_state_is_owner_only_and_corrupt_file_is_quarantined(js_log: JetStreamLog, start_agent, grid_config):
    paths = AgentPaths.for_config(grid_config)
    paths.ensure()
    paths.host_id.write_text(HOST + "\n")
    paths.state.write_bytes(b'{"schema_version": 1, "highest_term": "not a number"')
    agent = await start_agent()
    quarantined = [p for p in paths.root.iterdir() if p.name.startswith("state.json.corrupt-")]
    assert len(quarantined) == 1
    assert quarantined[0].read_bytes().startswith(b'{"schema_version": 1')
    assert any(w.startswith("state_file_quarantined") for w in agent.warnings)
    state, warning = StateStore(paths.state).load()
    assert warning is None and state.host_id == HOST
    for p in (paths.state, paths.engine_key):
        assert _mode(p) == 0o600, p
    assert _mode(paths.root) == 0o700
    hb = (await wait_for(lambda: heartbeats(js_log)))[-1]
    assert any(w.startswith("state_file_quarantined") for w in hb.warnings)
    # The engine key never travels in events.
    key = paths.engine_key.read_text().strip()
    assert len(key) == 64
    async for msg in js_log.replay("GRID_HOSTS"):
        assert key.encode() not in msg.data


@pytest.fixture
def stranger() -> Iterator[psutil.Process]:
    """An unrelated live process whose PID a stale state file will claim."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


FAKE_ARGV = ("/opt/llama/llama-server", "--model", "/x.gguf", "--port", "39250", "--alias", "m")


async def test_recycled_pid_is_never_signalled(js_log: JetStreamLog, start_agent, grid_config, stranger):
    paths = AgentPaths.for_config(grid_config)
    paths.ensure()
    paths.host_id.write_text(HOST + "\n")
    born = stranger.create_time()
    state = AgentState(host_id=HOST)
    # reborn: the PID now belongs to a process born later -> our child is provably gone.
    state.residencies["reborn"] = ResidencyRecord(
        model_id="reborn", state="ready", memory_mb=100, port=39250,
        process=ProcessProof(pid=stranger.pid, port=39250, exe=FAKE_ARGV[0], cmdline=FAKE_ARGV, create_time=born - 500),
    )
    # same-birth: exe/cmdline differ but the birth marker matches -> unprovable, fenced.
    state.residencies["mismatch"] = ResidencyRecord(
        model_id="mismatch", state="ready", memory_mb=100, port=39251,
        process=ProcessProof(pid=stranger.pid, port=39251, exe=FAKE_ARGV[0], cmdline=FAKE_ARGV, create_time=born),
    )
    # partial: the agent died after persisting the PID but before the birth proof.
    state.residencies["partial"] = ResidencyRecord(
        model_id="partial", state="warming", memory_mb=100, port=39252,
        process=ProcessProof(pid=stranger.pid, port=39252), spawn_argv=FAKE_ARGV, spawn_started_at=born - 1000,
    )
    StateStore(paths.state).save(state)

    agent = await start_agent()
    res = agent.state.residencies
    assert "reborn" not in res  # released: no artifact cached, nothing to keep
    assert res["mismatch"].state == "failed" and "fenced" in res["mismatch"].note
    assert res["partial"].state == "failed" and "fenced" in res["partial"].note
    hb = (await heartbeats(js_log))[-1]
    by_model = {r.model_id: r for r in hb.residencies}
    assert by_model["mismatch"].state == "failed" and by_model["mismatch"].endpoint is None
    assert any("never signalled" in w for w in hb.warnings)

    await js_log.append(make_command("u1", "unload", model_id="mismatch"))
    await js_log.append(make_command("u2", "unload", model_id="partial"))
    await js_log.append(make_command("w1", "warm", model_id="mismatch"))
    for aid in ("u1", "u2", "w1"):
        ack = await wait_ack(js_log, aid)
        assert ack.status == "failed" and ack.message.startswith("ownership_unproven"), ack
    assert stranger.is_running() and stranger.status() != psutil.STATUS_ZOMBIE
    await agent.stop(drain=True)  # a graceful stop does not touch it either
    assert stranger.is_running() and stranger.status() != psutil.STATUS_ZOMBIE
