"""gridctl node drain/pause/quarantine/resume/status/stop against a running in-process agent."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import msgspec
import psutil
from typer.testing import CliRunner

from grid.agent.state import AgentPaths
from grid.cli.node import PidRecord, node_app
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import heartbeats, transitions, wait_for

runner = CliRunner()


async def _state_is(log: JetStreamLog, state: str):
    hbs = await heartbeats(log)
    return hbs[-1] if hbs and hbs[-1].state == state else None


async def test_overrides_are_durable_picked_up_and_expire(js_log: JetStreamLog, start_agent, grid_config):
    agent = await start_agent()
    result = runner.invoke(node_app, ["drain", "--reason", "taking laptop home", "--for-seconds", "3600"])
    assert result.exit_code == 0, result.output
    await wait_for(lambda: _state_is(js_log, "draining"))
    tr = (await transitions(js_log))[-1]
    assert (tr.from_state, tr.to_state, tr.override) == ("accepting", "draining", True)
    assert "taking laptop home" in tr.reason

    status = runner.invoke(node_app, ["status", "--json"])
    report = json.loads(status.output)
    assert report["override"]["state"] == "draining" and report["override"]["active"]
    assert report["protection_state"] == "draining" and report["host_id"] == agent.host_id
    # Hardware as the running agent reported it in its heartbeat (this machine: CPU only).
    hw = report["hardware"]
    assert (hw["source"], hw["accelerator"], hw["engine_backend"], hw["placement_memory"]) == (
        "agent", "cpu", "cpu", "ram")
    assert hw["ram_mb"] == agent.options.capacity_mb and hw["cpu_count"] > 0

    # Survives a restart of the agent.
    await agent.stop(drain=True)
    agent = await start_agent()
    assert agent.protection.state == "draining"

    assert runner.invoke(node_app, ["quarantine", "--reason", "thermal fault"]).exit_code == 0
    await wait_for(lambda: _state_is(js_log, "quarantined"))
    assert runner.invoke(node_app, ["resume"]).exit_code == 0
    await wait_for(lambda: _state_is(js_log, "accepting"))

    # An expiring pause releases itself.
    assert runner.invoke(node_app, ["pause", "--reason", "battery", "--for-seconds", "1"]).exit_code == 0
    await wait_for(lambda: _state_is(js_log, "paused"))
    await wait_for(lambda: _state_is(js_log, "accepting"), timeout=10)
    assert runner.invoke(node_app, ["pause", "--for-seconds", "-5"]).exit_code != 0


def test_stop_refuses_an_unverified_pid(grid_home):
    paths = AgentPaths(grid_home / "agent")
    paths.ensure()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc = psutil.Process(victim.pid)
        # The pid file claims this PID but with another command line (a recycled agent PID).
        record = PidRecord(pid=victim.pid, create_time=proc.create_time(), cmdline=("python", "-m", "grid", "node"),
                           instance="x")
        paths.pid_file.write_bytes(msgspec.json.encode(record))
        result = runner.invoke(node_app, ["stop", "--timeout", "1"])
        assert result.exit_code != 0 and "not signalling" in result.output
        time.sleep(0.2)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
    result = runner.invoke(node_app, ["stop"])
    assert result.exit_code == 0 and "stale" in result.output
    assert not paths.pid_file.exists()
