"""A `gridctl up`-style grid inside the test process (grid.localgrid.LocalGrid: embedded
nats-server with identities, controller, gateway, host agent, a real engine on the bundled
GGUF), and the wait until the gateway serves its model."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import openai

from grid.agent.service import AgentOptions
from grid.config import GridConfig
from grid.controller.service import ControllerSettings
from grid.localgrid import LocalGrid, bundled_profile
from tests.ports import engine_ports


def local_grid(tmp_path: Path, bundled_model_home: Path, *, embeddings: bool = False, **agent: Any) -> LocalGrid:
    """A grid (not started) for the bundled model, on this test's engine ports; `agent` adds
    AgentOptions (a runtime, say)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "artifacts").symlink_to(bundled_model_home / "artifacts")
    return LocalGrid(
        GridConfig(home=home, nats_url=None),
        profile=bundled_profile(embeddings=embeddings),
        agent_options=AgentOptions(failure_domain="local", heartbeat_interval=0.5, sample_interval=0.5,
                                   port_range=engine_ports(), **agent),
        controller_settings=ControllerSettings(tick_interval_seconds=1.0, restart_grace_seconds=0.0),
    )


async def wait_served(grid: LocalGrid, client: openai.AsyncOpenAI, timeout: float = 120.0) -> str:
    """The grid's model, once its residency is ready and the gateway lists it (and only it)."""
    model = grid.profile.model_id
    deadline = time.monotonic() + timeout
    while grid.residency_state(model) != "ready":
        assert time.monotonic() < deadline, f"{model} never became ready"
        await asyncio.sleep(0.5)
    while [m.id for m in (await client.models.list()).data] != [model]:
        assert time.monotonic() < deadline, f"the gateway never listed {model}"
        await asyncio.sleep(0.25)
    return model
