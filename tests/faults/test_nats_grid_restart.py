"""kill -9 the nats-server under a running grid (agent, controller, gateway, real llama-server).

Each component holds its own NATS connection, as separate processes would. The server is started
again on the same port and store dir; within seconds every component has reconnected, the
projections follow the live streams again, and the gateway serves chat from the llama-server
that kept running: nothing acknowledged before the kill is lost, and no command is applied
twice (the same child keeps serving, every action has one receipt).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grid.agent.engines.runtime import Runtime
from grid.agent.service import AgentOptions, HostAgent
from grid.config import GridConfig
from grid.controller.service import Controller, ControllerSettings
from grid.events.base import new_event_id
from grid.events.control import ModeSet, ProfileSet
from grid.events.subjects import ALL_STREAMS, HOSTS_STREAM
from grid.gateway.app import create_gateway_app, start_gateway
from grid.localgrid import bundled_profile
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.faults.test_nats_restart_log import client_connections, kill_and_restart
from tests.integration.agent.agentkit import seed_cache
from tests.ports import engine_ports

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# Reconnect (0.5 s between attempts) + consumers re-created + one heartbeat + a chat: under a
# second here. Left to nats-py, an ordered consumer is re-created only after two missed idle
# heartbeats (10 s), which this bound rejects.
RESUME_SECONDS = 6.0


class Grid:
    def __init__(self, server: EmbeddedNats) -> None:
        self.server = server
        self.logs: list[JetStreamLog] = []
        self.controller: Any = None
        self.gateway: Any = None
        self.running: Any = None
        self.agent: Any = None


@pytest.fixture
async def grid(tmp_path: Path, bundled_gguf: Path, engine_runtime: Runtime) -> AsyncIterator[Grid]:
    home = tmp_path / "home"
    home.mkdir()
    cfg = GridConfig(home=home, nats_url=None)
    seed_cache(cfg, bundled_gguf)
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    g = Grid(server)
    try:
        controller_log, gateway_log, agent_log = [
            await JetStreamLog.connect(server.url, name=f"grid-{name}") for name in ("controller", "gateway", "agent")
        ]
        g.logs = [controller_log, gateway_log, agent_log]
        g.controller = Controller(controller_log, cfg, settings=ControllerSettings(
            tick_interval_seconds=1.0, restart_grace_seconds=0.0, lease_renew_seconds=1.0))
        await g.controller.start()
        await controller_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=bundled_profile()))
        await controller_log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))
        app = create_gateway_app(gateway_log, cfg)
        g.gateway = app.state.gateway
        g.running = await start_gateway(app, "127.0.0.1", 0, write_url_file=False)
        g.agent = HostAgent(agent_log, cfg, AgentOptions(failure_domain="local", heartbeat_interval=0.5,
                                                         sample_interval=0.5, port_range=engine_ports()))
        await g.agent.start()
        yield g
    finally:
        if g.controller is not None:
            await g.controller.stop()
        if g.agent is not None:
            await g.agent.stop(drain=True)
        if g.running is not None:
            await g.running.stop()
        for log in g.logs:
            await log.close()
        server.stop()


async def chat(client: httpx.AsyncClient, url: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
    try:
        return (await client.post(f"{url}/v1/chat/completions", json=body)).status_code
    except httpx.HTTPError:
        return 0


def child_pid(agent: HostAgent, model: str) -> int | None:
    record = agent.state.residencies.get(model)
    return record.process.pid if record is not None and record.process is not None else None


async def test_grid_serves_again_after_nats_kill_9(grid: Grid) -> None:
    model = bundled_profile().model_id
    url = grid.running.url
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        deadline = time.monotonic() + 120
        while await chat(client, url, model) != 200:
            assert time.monotonic() < deadline, f"never served before the kill: {grid.controller.status()}"
            await asyncio.sleep(0.5)
        pid = child_pid(grid.agent, model)
        assert pid is not None
        log = grid.logs[0]
        before = {s: await log.last_sequence(s) for s in ALL_STREAMS}

        await asyncio.to_thread(kill_and_restart, grid.server, 2.0)
        restarted = time.monotonic()

        deadline = restarted + RESUME_SECONDS
        while client_connections(grid.server) < 3:
            assert time.monotonic() < deadline, f"{client_connections(grid.server)} of 3 components reconnected"
            await asyncio.sleep(0.2)
        while await chat(client, url, model) != 200:
            assert time.monotonic() < deadline, "the gateway did not serve again after the restart"
            await asyncio.sleep(0.5)
        # A heartbeat appended after the restart reaches both projections (live ordered consumers).
        hosts_after = await log.last_sequence(HOSTS_STREAM)
        while (grid.gateway.runner.positions.get(HOSTS_STREAM, 0) < hosts_after
               or grid.controller.runner.positions.get(HOSTS_STREAM, 0) < hosts_after):
            assert time.monotonic() < deadline, "a projection stopped following the hosts stream"
            await asyncio.sleep(0.2)
        resumed = time.monotonic() - restarted

    # Nothing acknowledged before the kill is lost.
    for stream, last in before.items():
        assert await log.last_sequence(stream) >= last, stream
        seqs = [m.seq async for m in log.replay(stream, end_seq=last)]
        assert seqs == list(range(1, last + 1)), f"{stream} lost acknowledged events"
    # No command applied twice: the same llama-server child serves, one receipt per action.
    assert child_pid(grid.agent, model) == pid
    receipts = Counter(r.action_id for r in grid.agent.state.receipts)
    assert receipts and max(receipts.values()) == 1
    assert resumed < RESUME_SECONDS
