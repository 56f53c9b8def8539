"""Fixtures for host-agent tests against the real nats-server (js_log) and real files."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from grid.agent.sensors import FixedSensors
from grid.agent.service import AgentOptions, HostAgent
from grid.config import GridConfig
from grid.events.jetstream import JetStreamLog
from tests.integration.agent.agentkit import HOST


@pytest.fixture
def grid_config(grid_home: Path) -> GridConfig:
    return GridConfig(home=grid_home, nats_url=None)


AgentFactory = Callable[..., Awaitable[HostAgent]]


@pytest.fixture
async def start_agent(js_log: JetStreamLog, grid_config: GridConfig) -> AsyncIterator[AgentFactory]:
    agents: list[HostAgent] = []

    async def factory(sensors: FixedSensors | None = None, **overrides: Any) -> HostAgent:
        options = AgentOptions(
            host_id=overrides.pop("host_id", HOST),
            heartbeat_interval=overrides.pop("heartbeat_interval", 0.3),
            sample_interval=overrides.pop("sample_interval", 0.1),
            port_range=overrides.pop("port_range", (39200, 39299)),
            **overrides,
        )
        agent = HostAgent(js_log, grid_config, options, sensor_source=sensors or FixedSensors())
        await agent.start()
        agents.append(agent)
        return agent

    yield factory
    for agent in agents:
        await agent.stop(drain=True)
