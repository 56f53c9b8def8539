"""Fixtures for host-agent tests against the real nats-server (js_log) and real files."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from grid.agent.service import HostAgent
from grid.config import GridConfig
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import agent_factory
from tests.ports import engine_ports


@pytest.fixture
def grid_config(grid_home: Path) -> GridConfig:
    return GridConfig(home=grid_home, nats_url=None)


AgentFactory = Callable[..., Awaitable[HostAgent]]


@pytest.fixture
async def start_agent(js_log: JetStreamLog, grid_config: GridConfig) -> AsyncIterator[AgentFactory]:
    async with agent_factory(js_log, grid_config, heartbeat_interval=0.3, sample_interval=0.1,
                             port_range=engine_ports()) as factory:
        yield factory
