"""Damaged local state never orphans or duplicates an engine.

A real agent process (`gridctl node start`) with real llama-server children is SIGKILLed, its
state directory is damaged, and a restarted agent must find the children from the processes
themselves (their owner token), adopt them without spawning duplicates, and `gridctl node stop`
must leave no Grid-owned engine behind.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from grid.agent.artifacts import BUNDLED_SHA256
from grid.agent.engines.runtime import Runtime
from grid.agent.state import AgentPaths
from grid.config import GridConfig
from grid.events.host import HostHeartbeat, HostRegistered
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import host_events, make_command, seed_cache, wait_ack, wait_for
from tests.faults.agentproc import agent_env, spawn_agent
from tests.ports import engine_ports_arg

pytestmark = pytest.mark.engine

# One engine port block for every start of the agent in this file: a restarted agent keeps its ports.
PORT_RANGE = engine_ports_arg()


@pytest.fixture
def grid_config(grid_home: Path, bundled_gguf: Path, engine_runtime: Runtime) -> GridConfig:
    return GridConfig(home=grid_home, nats_url=None)


def _spawn_agent(nats_url: str, home: Path, log_file: Path) -> subprocess.Popen[bytes]:
    return spawn_agent(nats_url, home, log_file, "--port-range", PORT_RANGE)


def _engines(key_file: Path) -> list[psutil.Process]:
    """Every live llama-server started with this home's key file."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(key_file) in (proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


async def _heartbeat(log: JetStreamLog, host_id: str, registrations: int, ready: int) -> HostHeartbeat | None:
    """The latest heartbeat of `host_id` after its n-th registration, if it reports `ready` ready models."""
    events = await host_events(log)
    regs = [i for i, e in enumerate(events) if isinstance(e, HostRegistered) and e.host_id == host_id]
    if len(regs) < registrations:
        return None
    for e in reversed(events[regs[registrations - 1]:]):
        if isinstance(e, HostHeartbeat) and e.host_id == host_id:
            return e if sum(r.state == "ready" for r in e.residencies) == ready else None
    return None


def _truncate_state(paths: AgentPaths) -> None:
    data = paths.state.read_bytes()
    paths.state.write_bytes(data[: len(data) // 2])


def _change_one_create_time_digit(paths: AgentPaths) -> None:
    text = paths.state.read_text()
    # The last digit of the whole seconds of the first child's birth time: a 1-9 s difference.
    match = re.search(r'"create_time":(\d+)\.', text)
    assert match, text
    digits = match.group(1)
    changed = digits[:-1] + str((int(digits[-1]) + 1) % 10)
    paths.state.write_text(text[: match.start(1)] + changed + text[match.end(1):])


def _empty_host_id(paths: AgentPaths) -> None:
    paths.host_id.write_text("")


DAMAGE = {
    "truncated_state": (_truncate_state, 2),
    "changed_create_time": (_change_one_create_time_digit, 1),
    "empty_host_id": (_empty_host_id, 1),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
async def test_restart_after_damage_adopts_every_child_and_stop_leaves_none(
    damage: str, js_log: JetStreamLog, nats_server: EmbeddedNats, grid_config: GridConfig,
    bundled_gguf: Path, tmp_path: Path,
):
    damage_fn, children = DAMAGE[damage]
    models = tuple(f"smol-{i}.gguf" for i in range(children))
    seed_cache(grid_config, bundled_gguf, models)
    paths = AgentPaths.for_config(grid_config)
    log_file = tmp_path / "agent.log"
    agent = _spawn_agent(nats_server.url, grid_config.home, log_file)
    try:
        await wait_for(lambda: _registered_host(js_log), timeout=30)
        host_id = paths.host_id.read_text().strip()
        for i, model in enumerate(models):
            art = dict(model_id=model, artifact_sha256=BUNDLED_SHA256, memory_mb=300, host_id=host_id)
            await js_log.append(make_command(f"load-{i}", "load", **art))
            await js_log.append(make_command(f"warm-{i}", "warm", dependencies=(f"load-{i}",), **art))
        for i in range(children):
            ack = await wait_ack(js_log, f"warm-{i}", timeout=90)
            assert ack.status == "succeeded", (ack, log_file.read_text()[-2000:])
        pids = sorted(p.pid for p in _engines(paths.engine_key))
        assert len(pids) == children

        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        damage_fn(paths)

        agent = _spawn_agent(nats_server.url, grid_config.home, log_file)
        hb = await wait_for(lambda: _heartbeat(js_log, host_id, 2, children), timeout=90)
        assert {r.model_id for r in hb.residencies if r.state == "ready"} == set(models)
        assert paths.host_id.read_text().strip() == host_id
        assert sorted(p.pid for p in _engines(paths.engine_key)) == pids, "no orphan, no duplicate"

        stop = subprocess.run([sys.executable, "-m", "grid.cli.node", "stop", "--timeout", "60"],
                              env=agent_env(grid_config.home), capture_output=True, text=True, timeout=90)
        assert stop.returncode == 0, stop.stderr
        assert agent.wait(timeout=10) == 0
        assert _engines(paths.engine_key) == [], "a Grid-owned engine outlived `node stop`"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        for proc in _engines(paths.engine_key):
            proc.kill()


async def _registered_host(log: JetStreamLog) -> bool:
    return any(isinstance(e, HostRegistered) for e in await host_events(log))
