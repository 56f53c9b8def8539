"""A second machine joins a `gridctl up` grid with an invitation and nothing else copied, and is
revoked: real gridctl processes, separate grid homes, the grid's own secured nats-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from grid.agent.launch import DEFAULT_YIELD_TO_USER_SECONDS
from grid.identity.creds import connect_options
from tests.e2e.gridctl_kit import (
    gridctl,
    gridctl_up,
    grid_env,
    invite,
    join,
    start_agent,
    status_hosts,
    stop,
    wait_for_text,
)

pytestmark = pytest.mark.e2e

JOINER = "joiner-1"


async def _connects(url: str, creds: Path) -> bool:
    try:
        nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3,
                                **connect_options(creds, None))
    except Exception:
        return False
    await nc.close()
    return True


class Grid:
    def __init__(self, controller_env: dict[str, str], node_env: dict[str, str], node_home: Path) -> None:
        self.controller_env = controller_env
        self.node_env = node_env
        self.node_home = node_home


@pytest.fixture(scope="module")
def joined(tmp_path_factory: pytest.TempPathFactory, bundled_model_home: Path) -> Iterator[Grid]:
    base = tmp_path_factory.mktemp("enrolment")
    controller_home, node_home = base / "controller", base / "node"
    env_b = grid_env(node_home)
    with gridctl_up(controller_home, base / "up.log", bundled_model_home) as env_a:
        # Without joining, an agent is refused by the server, and told how to join.
        url = (controller_home / "nats.url").read_text().strip()
        unjoined = gridctl(grid_env(base / "unjoined"), "node", "start", "--nats", url)
        assert unjoined.returncode != 0 and "gridctl node join" in unjoined.stderr, unjoined.stderr
        token = invite(env_a, JOINER, "--failure-domain", "rack-2", "--tags", "gpu,lab")

        # Bad input loses nothing: garbage is refused before any connection.
        garbage = gridctl(env_b, "node", "join", "gridjoin1.not-a-token")
        assert garbage.returncode != 0 and "token" in garbage.stderr
        assert not (node_home / "agent" / "identity" / "host.creds").exists()

        join(env_b, token)
        creds = node_home / "agent" / "identity" / "host.creds"
        assert (creds.stat().st_mode & 0o777) == 0o600
        # Single use: the same token admits nobody else.
        again = gridctl(grid_env(base / "third"), "node", "join", token)
        assert again.returncode != 0 and "invitation_used" in again.stderr, again.stderr

        agent_log = base / "agent.log"
        agent = start_agent(env_b, agent_log)
        try:
            wait_for_text(agent_log, f"agent {JOINER} running", agent, 60)
            yield Grid(env_a, env_b, node_home)
        finally:
            stop(agent)


def test_a_joined_machine_shows_in_status(joined: Grid) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        hosts = status_hosts(joined.controller_env)
        if hosts.get(JOINER, {}).get("fresh"):
            break
        time.sleep(0.5)
    host = status_hosts(joined.controller_env).get(JOINER)
    assert host is not None and host["fresh"], host
    # Invited without --dedicated: an employee machine, yielding to its user by default.
    assert (host["use"], host["yield_to_user_seconds"]) == ("employee", DEFAULT_YIELD_TO_USER_SECONDS), host


def test_a_revoked_host_is_disconnected_and_cannot_come_back(joined: Grid) -> None:
    revoked = gridctl(joined.controller_env, "node", "revoke", JOINER)
    assert revoked.returncode == 0, revoked.stderr
    url = (Path(joined.controller_env["GRID_HOME"]) / "nats.url").read_text().strip()
    creds = joined.node_home / "agent" / "identity" / "host.creds"
    assert not asyncio.run(_connects(url, creds))
    # The live connection is closed by the server within seconds: heartbeats stop.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        host = status_hosts(joined.controller_env).get(JOINER) or {}
        age = host.get("heartbeat_age_seconds")
        if isinstance(age, (int, float)) and age > 5:
            break
        time.sleep(0.5)
    assert isinstance(age, (int, float)) and age > 5, host
    unknown = gridctl(joined.controller_env, "node", "revoke", "never-admitted")
    assert unknown.returncode != 0 and "never-admitted" in unknown.stderr
