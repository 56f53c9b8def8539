"""An engine a restarted agent adopts keeps its route: its warm ack stays in the log.

A real agent process warms the bundled model on a command; the controller's plan (appended as
the controller records it) assigns the model to that host. The gateway over the real nats-server
routes to it only once the agent's own warm ack is in the log. The agent is SIGKILLed and
restarted: it adopts the child (no new warm, no new ack), and both the running gateway and a
gateway started afterwards (which replays the warm ack from the older part of the hosts stream,
outside its recent tail) still route to it. A claim of a host the plan does not name gets no
route all along.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from grid.agent.artifacts import BUNDLED_SHA256
from grid.agent.state import AgentPaths, StateStore
from grid.config import GridConfig
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.events.subjects import HOSTS_STREAM
from grid.gateway import state as gateway_state
from grid.gateway.app import create_gateway_app, start_gateway
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import make_command, seed_cache, wait_ack, wait_for
from tests.placement import plan_event
from tests.ports import engine_ports_arg

pytestmark = pytest.mark.e2e

HOST = "host-adopt-route"
# One engine port block for every start of the agent in this file: a restarted agent keeps its ports.
PORT_RANGE = engine_ports_arg()
MODEL = "smol-routed.gguf"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def _spawn_agent(nats_url: str, home: Path, log_file: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GRID_HOME": str(home)}
    env.pop("GRID_NATS_URL", None)
    argv = [sys.executable, "-m", "grid.cli.node", "start", "--nats", nats_url, "--host-id", HOST,
            "--heartbeat-interval", "0.5", "--sample-interval", "0.5", "--port-range", PORT_RANGE, "--json-logs"]
    with open(log_file, "ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


async def claim(log: JetStreamLog) -> None:
    """A host the plan does not name heartbeats the model ready, with the real digest."""
    await log.append(HostHeartbeat(
        event_id=new_event_id(), at=time.time(), host_id="claimant", resources=HostResources(capacity_mb=16000),
        residencies=(Residency(model_id=MODEL, memory_mb=300, state="ready", endpoint="http://127.0.0.1:9",
                               max_concurrency=8, artifact_sha256=BUNDLED_SHA256),)))


async def _gateway(log: JetStreamLog, home: Path) -> Any:
    app = create_gateway_app(log, GridConfig(home=home, nats_url=None), api_keys=[])
    return await start_gateway(app, "127.0.0.1", 0, write_url_file=False)


async def _served_by(url: str) -> str | None:
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        return r.headers.get("x-grid-host") if r.status_code == 200 else None


async def _stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=10, trust_env=False) as client:
        return (await client.get("/gateway/stats")).json()  # type: ignore[no-any-return]


async def _routes_to(url: str, host: str, timeout: float = 30.0) -> None:
    async def ok() -> bool:
        return await _served_by(url) == host

    await wait_for(ok, timeout=timeout, interval=0.3)


async def test_an_adopted_engine_keeps_its_route_across_agent_and_gateway_restarts(
        js_log: JetStreamLog, nats_server: EmbeddedNats, grid_config: GridConfig, bundled_gguf: Path,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed_cache(grid_config, bundled_gguf, (MODEL,))
    paths = AgentPaths.for_config(grid_config)
    log_file = tmp_path / "agent.log"
    await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
        model_id=MODEL, memory_mb=300, artifact_sha256=BUNDLED_SHA256)))
    await js_log.append(plan_event([(HOST, MODEL)]))
    gw_home = tmp_path / "gw"
    gw_home.mkdir(mode=0o700)
    gateway = await _gateway(js_log, gw_home)
    second = None
    agent = _spawn_agent(nats_server.url, grid_config.home, log_file)
    try:
        art = dict(model_id=MODEL, artifact_sha256=BUNDLED_SHA256, memory_mb=300)
        await js_log.append(make_command("load-r", "load", host_id=HOST, **art))
        await js_log.append(make_command("warm-r", "warm", host_id=HOST, dependencies=("load-r",), **art))
        ack = await wait_ack(js_log, "warm-r", timeout=90)
        assert ack.status == "succeeded", (ack, log_file.read_text()[-2000:])
        await _routes_to(gateway.url, HOST)

        # A host the plan does not name claims the same model, with the real digest: no route.
        await claim(js_log)

        pid = StateStore(paths.state).load()[0].residencies[MODEL].process.pid  # type: ignore[union-attr]
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        agent = _spawn_agent(nats_server.url, grid_config.home, log_file)

        async def adopted() -> bool:
            rec = StateStore(paths.state).load()[0].residencies.get(MODEL)
            return rec is not None and rec.note == "adopted" and rec.state == "ready"

        await wait_for(adopted, timeout=60)
        assert StateStore(paths.state).load()[0].residencies[MODEL].process.pid == pid  # type: ignore[union-attr]
        await claim(js_log)
        for _ in range(5):  # every request goes to the adopted engine, none to the claimant
            assert await _served_by(gateway.url) == HOST

        # A gateway started now replays only the last few host events (heartbeats of both
        # hosts): the warm ack is older, and still corroborates the adopted engine.
        last = await js_log.last_sequence(HOSTS_STREAM)
        monkeypatch.setattr(gateway_state, "HOST_REPLAY_MAX_MESSAGES", 4)
        second_home = tmp_path / "gw2"
        second_home.mkdir(mode=0o700)
        second = await _gateway(js_log, second_home)
        stats = await _stats(second.url)
        assert stats["projection"]["ack_scan"]["from"] == 1 and stats["projection"]["ack_scan"]["to"] >= last - 4
        assert stats["projection"]["ack_scan"]["folded"] >= 2, stats["projection"]
        await _routes_to(second.url, HOST, timeout=10)
        for _ in range(5):
            assert await _served_by(second.url) == HOST
        await claim(js_log)

        async def claimed() -> set[tuple[str, str]]:
            return {(c["host_id"], c["reason"]) for c in (await _stats(second.url))["unplaced_claims"]}

        assert await wait_for(claimed, timeout=10) == {("claimant", "not_in_plan")}
        assert await _served_by(second.url) == HOST
    finally:
        if second is not None:
            await second.stop()
        await gateway.stop()
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if str(paths.engine_key) in cmd:
                proc.kill()
        await asyncio.sleep(0)
