"""SIGKILL the agent process with two live children; a restart adopts both, no duplicates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from grid.agent.artifacts import BUNDLED_SHA256
from grid.agent.state import AgentPaths, StateStore
from grid.config import GridConfig
from grid.events.host import HostHeartbeat, HostRegistered
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import host_events, make_command, seed_cache, wait_ack, wait_for
from tests.ports import engine_ports_arg

pytestmark = pytest.mark.e2e

HOST = "host-restart-1"
# One engine port block for every start of the agent in this file: a restarted agent keeps its ports.
PORT_RANGE = engine_ports_arg()
MODELS = ("smol-a.gguf", "smol-b.gguf")


def _agent_cmd(nats_url: str) -> list[str]:
    return [
        sys.executable, "-m", "grid.cli.node", "start", "--nats", nats_url, "--host-id", HOST,
        "--heartbeat-interval", "0.5", "--sample-interval", "0.5", "--port-range", PORT_RANGE,
        "--failure-domain", "rack-1", "--tag", "test", "--json-logs",
    ]


def _spawn_agent(nats_url: str, home: Path, log_file: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GRID_HOME": str(home)}
    env.pop("GRID_NATS_URL", None)
    with open(log_file, "ab") as out:
        return subprocess.Popen(_agent_cmd(nats_url), env=env, stdout=out, stderr=subprocess.STDOUT)


def _engines(key_file: Path) -> list[psutil.Process]:
    """Every llama-server whose argv names this home's key file."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if str(key_file) in cmd and proc.status() != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


async def _heartbeat_after(log: JetStreamLog, registrations: int, ready: int) -> HostHeartbeat | None:
    events = await host_events(log)
    regs = [i for i, e in enumerate(events) if isinstance(e, HostRegistered) and e.host_id == HOST]
    if len(regs) < registrations:
        return None
    for e in reversed(events[regs[registrations - 1]:]):
        if isinstance(e, HostHeartbeat) and e.host_id == HOST:
            if sum(r.state == "ready" for r in e.residencies) == ready:
                return e
            return None
    return None


async def test_sigkill_restart_adopts_both_children(js_log: JetStreamLog, nats_server: EmbeddedNats,
                                                    grid_config: GridConfig, bundled_gguf: Path, tmp_path: Path):
    seed_cache(grid_config, bundled_gguf, MODELS)
    paths = AgentPaths.for_config(grid_config)
    log_file = tmp_path / "agent.log"
    agent = _spawn_agent(nats_server.url, grid_config.home, log_file)
    try:
        await wait_for(lambda: _heartbeat_after(js_log, 1, 0), timeout=30)
        for i, model in enumerate(MODELS):
            art = dict(model_id=model, artifact_sha256=BUNDLED_SHA256, memory_mb=300)
            await js_log.append(make_command(f"load-{i}", "load", host_id=HOST, **art))
            await js_log.append(make_command(f"warm-{i}", "warm", host_id=HOST, dependencies=(f"load-{i}",), **art))
        for i in range(len(MODELS)):
            ack = await wait_ack(js_log, f"warm-{i}", timeout=60)
            assert ack.status == "succeeded", (ack, log_file.read_text()[-2000:])
        before = StateStore(paths.state).load()[0]
        pids = {m: before.residencies[m].process.pid for m in MODELS}
        assert len(set(pids.values())) == 2
        assert sorted(p.pid for p in _engines(paths.engine_key)) == sorted(pids.values())

        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        assert all(psutil.pid_exists(pid) for pid in pids.values()), "children must survive the agent"

        agent = _spawn_agent(nats_server.url, grid_config.home, log_file)
        hb = await wait_for(lambda: _heartbeat_after(js_log, 2, 2), timeout=60)
        assert {r.model_id for r in hb.residencies} == set(MODELS)
        assert hb.resources.failure_domain == "rack-1" and hb.resources.tags == ("test",)
        after = StateStore(paths.state).load()[0]
        assert {m: after.residencies[m].process.pid for m in MODELS} == pids
        assert all(after.residencies[m].note == "adopted" for m in MODELS)
        assert sorted(p.pid for p in _engines(paths.engine_key)) == sorted(pids.values()), "no duplicate process"

        # A repeated warm for an adopted model is a no-op, and the adopted child still serves.
        art = dict(model_id=MODELS[0], artifact_sha256=BUNDLED_SHA256, memory_mb=300)
        await js_log.append(make_command("warm-again", "warm", host_id=HOST, **art))
        assert (await wait_ack(js_log, "warm-again")).message == "already_ready"
        key = paths.engine_key.read_text().strip()
        endpoint = next(r.endpoint for r in hb.residencies if r.model_id == MODELS[0])
        async with httpx.AsyncClient(timeout=60, trust_env=False) as client:
            resp = await client.post(f"{endpoint}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                     json={"model": MODELS[0], "messages": [{"role": "user", "content": "Hi"}],
                                           "max_tokens": 4})
            assert resp.status_code == 200

        # `gridctl node stop` verifies the agent PID, the agent drains and stops both children.
        stop = subprocess.run(
            [sys.executable, "-m", "grid.cli.node", "stop", "--timeout", "60"],
            env={**os.environ, "GRID_HOME": str(grid_config.home)}, capture_output=True, text=True, timeout=90,
        )
        assert stop.returncode == 0, stop.stderr
        assert agent.wait(timeout=10) == 0
        assert _engines(paths.engine_key) == []
        assert not paths.pid_file.exists()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        for proc in _engines(paths.engine_key):
            proc.kill()
