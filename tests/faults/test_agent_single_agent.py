"""One agent per state directory: a second agent on the grid home of a running one refuses to
start, `node status` sees the in-process agent (as `gridctl up` runs it), and `node stop`
cannot reach into it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from grid.agent.service import HostAgent
from grid.config import GridConfig
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import agent_factory, heartbeats, wait_for
from tests.ports import engine_ports, engine_ports_arg


@pytest.fixture
def grid_config(grid_home: Path) -> GridConfig:
    return GridConfig(home=grid_home, nats_url=None)


@pytest.fixture
async def start_agent(js_log: JetStreamLog, grid_config: GridConfig) -> AsyncIterator[Callable[..., Awaitable[HostAgent]]]:
    async with agent_factory(js_log, grid_config, heartbeat_interval=0.3, sample_interval=0.1,
                             port_range=engine_ports()) as factory:
        yield factory


def _node(home: Path, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRID_HOME": str(home)}
    env.pop("GRID_NATS_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "grid.cli.node", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"`node {' '.join(args)}` was still running after {timeout:.0f}s: {err[-1500:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


async def test_second_agent_on_the_same_state_dir_refuses(
    js_log: JetStreamLog, nats_server: EmbeddedNats, start_agent, grid_config: GridConfig,
):
    agent = await start_agent()
    second = _node(grid_config.home, "start", "--nats", nats_server.url, "--port-range", engine_ports_arg())
    assert second.returncode != 0
    assert "one agent per state directory" in second.stderr, second.stderr

    status = _node(grid_config.home, "status", "--json")
    report = json.loads(status.stdout)
    assert report["running"] is True and report["pid"] == os.getpid()
    assert report["host_id"] == agent.host_id

    stop = _node(grid_config.home, "stop", "--timeout", "5")
    assert stop.returncode != 0
    # The in-process agent is untouched and still reporting.
    before = len(await heartbeats(js_log))
    await wait_for(lambda: _more_heartbeats(js_log, before))

    await agent.stop(drain=True)
    assert json.loads(_node(grid_config.home, "status", "--json").stdout)["running"] is False


async def _more_heartbeats(log: JetStreamLog, before: int) -> bool:
    return len(await heartbeats(log)) > before
