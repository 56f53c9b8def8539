"""The owner token decides which children an agent may claim: another state directory's child
is never touched, and a child carrying our token that cannot be adopted is stopped, never left
running."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import psutil
import pytest

from grid.agent.ownership import EngineOwner, owner_token
from grid.agent.service import HostAgent
from grid.agent.state import AgentPaths
from grid.config import GridConfig
from grid.secrets import ENGINE_SECRET_FILE, load_or_create_secret
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import HOST, agent_factory
from tests.ports import engine_ports


@pytest.fixture
def grid_config(grid_home: Path) -> GridConfig:
    return GridConfig(home=grid_home, nats_url=None)


@pytest.fixture
async def start_agent(js_log: JetStreamLog, grid_config: GridConfig) -> AsyncIterator[Callable[..., Awaitable[HostAgent]]]:
    async with agent_factory(js_log, grid_config, heartbeat_interval=0.3, sample_interval=0.1,
                             port_range=engine_ports(), ready_timeout=2.0) as factory:
        yield factory


@pytest.fixture
def spawn_marked() -> Iterator[Callable[[dict[str, str]], psutil.Process]]:
    """Live processes carrying an owner marker in their environment (not engines)."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(marker: dict[str, str]) -> psutil.Process:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                env={**os.environ, **marker}, start_new_session=True)
        procs.append(proc)
        return psutil.Process(proc.pid)

    yield spawn
    for proc in procs:
        proc.kill()
        proc.wait()


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_only_our_token_is_claimed(start_agent, grid_config: GridConfig, spawn_marked, tmp_path: Path):
    paths = AgentPaths.for_config(grid_config)
    paths.ensure()
    secret = load_or_create_secret(grid_config.home / ENGINE_SECRET_FILE)
    ours = EngineOwner(token=owner_token(secret, paths.root), host_id=HOST)
    # Same secret, another state directory: another agent's child on this machine.
    theirs = EngineOwner(token=owner_token(secret, tmp_path / "other-agent"), host_id=HOST)
    foreign = spawn_marked(theirs.environ(100))
    unservable = spawn_marked(ours.environ(100))  # ours, but no engine command line to adopt

    agent = await start_agent()
    assert _alive(foreign), "another state directory's child must never be signalled"
    unservable.wait(timeout=15)
    assert not _alive(unservable), "an owned child that cannot be adopted must be stopped"
    assert agent.state.residencies == {}
    assert any("not adoptable" in w for w in agent.warnings)
    await agent.stop(drain=True)
    assert _alive(foreign)
