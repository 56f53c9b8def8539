"""Fixtures for host-agent tests with real llama-server children and the real SmolLM2 GGUF.

`engine_runtime` and `bundled_gguf` come from tests/conftest.py (session-wide).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from grid.agent.engines.runtime import Runtime
from grid.agent.service import HostAgent
from grid.config import GridConfig
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import agent_factory, seed_cache
from tests.ports import engine_ports


@pytest.fixture
def grid_config(grid_home: Path, bundled_gguf: Path, engine_runtime: Runtime) -> GridConfig:
    config = GridConfig(home=grid_home, nats_url=None)
    seed_cache(config, bundled_gguf)
    return config


@pytest.fixture
async def start_agent(js_log: JetStreamLog, grid_config: GridConfig) -> AsyncIterator[Callable[..., Awaitable[HostAgent]]]:
    async with agent_factory(js_log, grid_config, heartbeat_interval=0.5, sample_interval=0.5,
                             port_range=engine_ports()) as factory:
        yield factory
