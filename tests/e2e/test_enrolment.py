"""A second machine joins a `gridctl up` grid with an invitation and nothing else copied, and is
revoked: real gridctl processes, separate grid homes, the grid's own secured nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from grid.identity.creds import connect_options
from tests.ports import engine_ports_arg

pytestmark = pytest.mark.e2e

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]
JOINER = "joiner-1"


def gridctl(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GRIDCTL, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_NATS_URL", None)
    env.pop("GRID_AGENT_STATE_DIR", None)
    return env


def _wait_for_text(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text()
        if text in content or proc.poll() is not None:
            break
        time.sleep(0.3)
    content = path.read_text()
    assert text in content, content[-3000:]
    return content


def _status_hosts(env: dict[str, str]) -> dict[str, dict[str, object]]:
    out = gridctl(env, "status", "--json")
    assert out.returncode == 0, out.stderr
    return {h["host_id"]: h for h in json.loads(out.stdout)["hosts"]}


async def _connects(url: str, creds: Path) -> bool:
    try:
        nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3,
                                **connect_options(creds, None))
    except Exception:
        return False
    await nc.close()
    return True


class Grid:
    def __init__(self, controller_env: dict[str, str], node_env: dict[str, str], node_home: Path,
                 agent: subprocess.Popen[bytes], agent_log: Path) -> None:
        self.controller_env = controller_env
        self.node_env = node_env
        self.node_home = node_home
        self.agent = agent
        self.agent_log = agent_log


@pytest.fixture(scope="module")
def joined(tmp_path_factory: pytest.TempPathFactory, bundled_model_home: Path) -> Iterator[Grid]:
    base = tmp_path_factory.mktemp("enrolment")
    controller_home, node_home = base / "controller", base / "node"
    controller_home.mkdir()
    (controller_home / "artifacts").symlink_to(bundled_model_home / "artifacts")
    env_a, env_b = _env(controller_home), _env(node_home)
    up_log = base / "up.log"
    with open(up_log, "w") as out:
        up = subprocess.Popen([*GRIDCTL, "up", "--port", "0", "--mode", "observe", "--no-wait"], env=env_a,
                              stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    agent: subprocess.Popen[bytes] | None = None
    try:
        _wait_for_text(up_log, "grid is up", up, 120)
        # Without joining, an agent is refused by the server, and told how to join.
        url = (controller_home / "nats.url").read_text().strip()
        unjoined = gridctl(_env(base / "unjoined"), "node", "start", "--nats", url)
        assert unjoined.returncode != 0 and "gridctl node join" in unjoined.stderr, unjoined.stderr
        invited = gridctl(env_a, "invite", "--host-id", JOINER, "--ttl", "10m", "--failure-domain", "rack-2",
                          "--tags", "gpu,lab", "--json")
        assert invited.returncode == 0, invited.stderr
        token = json.loads(invited.stdout)["token"]

        # Bad input loses nothing: garbage is refused before any connection.
        garbage = gridctl(env_b, "node", "join", "gridjoin1.not-a-token")
        assert garbage.returncode != 0 and "token" in garbage.stderr
        assert not (node_home / "agent" / "identity" / "host.creds").exists()

        join = gridctl(env_b, "node", "join", token)
        assert join.returncode == 0, join.stderr
        creds = node_home / "agent" / "identity" / "host.creds"
        assert (creds.stat().st_mode & 0o777) == 0o600
        # Single use: the same token admits nobody else.
        again = gridctl(_env(base / "third"), "node", "join", token)
        assert again.returncode != 0 and "invitation_used" in again.stderr, again.stderr

        agent_log = base / "agent.log"
        with open(agent_log, "w") as out:
            agent = subprocess.Popen([*GRIDCTL, "node", "start", "--heartbeat-interval", "0.5",
                                      "--port-range", engine_ports_arg(), "--log-format", "json"],
                                     env=env_b, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _wait_for_text(agent_log, f"agent {JOINER} running", agent, 60)
        yield Grid(env_a, env_b, node_home, agent, agent_log)
    finally:
        if agent is not None and agent.poll() is None:
            agent.terminate()
            agent.wait(60)
        gridctl(env_a, "down", timeout=120)
        if up.poll() is None:
            up.terminate()
            up.wait(60)


def test_a_joined_machine_shows_in_status(joined: Grid) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        hosts = _status_hosts(joined.controller_env)
        if hosts.get(JOINER, {}).get("fresh"):
            break
        time.sleep(0.5)
    host = _status_hosts(joined.controller_env).get(JOINER)
    assert host is not None and host["fresh"], host


def test_a_revoked_host_is_disconnected_and_cannot_come_back(joined: Grid) -> None:
    revoked = gridctl(joined.controller_env, "node", "revoke", JOINER)
    assert revoked.returncode == 0, revoked.stderr
    url = (Path(joined.controller_env["GRID_HOME"]) / "nats.url").read_text().strip()
    creds = joined.node_home / "agent" / "identity" / "host.creds"
    assert not asyncio.run(_connects(url, creds))
    # The live connection is closed by the server within seconds: heartbeats stop.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        host = _status_hosts(joined.controller_env).get(JOINER) or {}
        age = host.get("heartbeat_age_seconds")
        if isinstance(age, (int, float)) and age > 5:
            break
        time.sleep(0.5)
    assert isinstance(age, (int, float)) and age > 5, host
    unknown = gridctl(joined.controller_env, "node", "revoke", "never-admitted")
    assert unknown.returncode != 0 and "never-admitted" in unknown.stderr
