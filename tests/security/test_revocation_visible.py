"""A revocation you can see: status marks the host revoked (with when), the revoked agent stops
with one clear message and a non-zero exit, and `gridctl node revoke` works with a cluster's URL
list and from an operator machine.

Real parts only: the module's secured nats-server, a real controller with its identity service
(enrolment, and applying revocations an operator machine asks for), a real agent process
(`gridctl node join` + `gridctl node start` in its own grid home), and gridctl processes.

Found by an attack with a legitimately enrolled host: a revoked host showed only as stale, its
agent retried every 0.5 s forever without saying why, and `gridctl node revoke` failed from an
operator machine and with a URL list.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from grid.controller.service import Controller
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.control import CredentialRevoked
from grid.events.host import HostHeartbeat, HostResources
from grid.events.subjects import CONTROL_STREAM, revocation_subject
from grid.identity.admin import invite
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.creds import connect_options
from grid.identity.local import CREDS_DIR
from grid.identity.permissions import Principal, Role
from grid.identity.service import ControllerIdentity
from grid.transport.jetstream import JetStreamLog
from tests.integration.controller.statuskit import serving_controller
from tests.ports import engine_ports_arg
from tests.security.conftest import CredsFactory, SecuredNats

pytestmark = pytest.mark.slow

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]
# How soon a revoked agent must have said so and exited (the servers drop it at once; the agent
# probes its credential once a second while disconnected, then drains and stops).
AGENT_EXIT_SECONDS = 30.0


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    for name in ("GRID_NATS_URL", "GRID_AGENT_STATE_DIR", "GRID_ADMIN_URL"):
        env.pop(name, None)
    return env


async def gridctl(home: Path, *args: str, timeout: float = 90.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*GRIDCTL, *args, env=_env(home), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


def url_list(server: SecuredNats) -> str:
    """A cluster's URL list as an operator passes it: a server that is down, and the real one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]
    return f"nats://127.0.0.1:{down},{server.url}"


@contextlib.asynccontextmanager
async def controller(log: JetStreamLog, home: Path, authority: Authority) -> AsyncIterator[Controller]:
    """A controller as `gridctl up` runs it on the authority's machine: with its identity
    (enrolment, host consumers, revocations asked for on the log) and its admin API."""
    async with serving_controller(log, home, "ctl-revoke", identity=ControllerIdentity(authority.directory)) as ctl:
        yield ctl


async def status(home: Path) -> dict[str, Any]:
    rc, out, err = await gridctl(home, "status", "--json")
    assert rc == 0, err
    return json.loads(out)


async def host_row(home: Path, host_id: str, done: Any, what: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc = await status(home)
        row = {h["host_id"]: h for h in doc["hosts"]}.get(host_id)
        if row is not None and done(row):
            return row
        assert time.monotonic() < deadline, f"{what} not within {timeout:g}s: {row}"
        await asyncio.sleep(0.3)


def operator_machine(tmp_path: Path, authority: Authority) -> Path:
    """Another machine's grid home set up for the operator: the operator credential where gridctl
    looks for it, and nothing of the authority (no account key, no registry)."""
    home = tmp_path / "operator-machine"
    creds = home / "identity" / CREDS_DIR / "operator.creds"
    creds.parent.mkdir(parents=True, mode=0o700)
    authority.issue_creds(Principal(Role.OPERATOR), creds, now=time.time(), ttl_seconds=None)
    return home


async def test_revoked_on_the_controllers_machine_with_a_url_list_and_shown_in_status(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog, operator_home: Path,
    authority: Authority, tmp_path: Path,
) -> None:
    host_creds = creds(Role.HOST, host_id="listed-host")
    host = await connect_log(secured_server.url, credentials=host_creds, name="grid-agent", ensure_streams=False)
    home = tmp_path / "controller"
    try:
        async with controller(controller_log, home, authority):
            await host.append(HostHeartbeat(event_id=new_event_id(), at=time.time(), host_id="listed-host",
                                            resources=HostResources(capacity_mb=8000)))
            await host_row(home, "listed-host", lambda h: h["fresh"], "the host")
            started = time.time()
            rc, out, err = await gridctl(operator_home, "node", "revoke", "listed-host", "--reason", "lost",
                                         "--nats", url_list(secured_server))
            assert rc == 0, err
            assert "host listed-host revoked: 1 key(s)" in out, out
            # The servers dropped the host's connection.
            deadline = time.monotonic() + 10
            while host.client.is_connected and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not host.client.is_connected

            row = await host_row(home, "listed-host", lambda h: h["revoked"], "the revoked mark")
            assert started - 1 <= row["revoked_at"] <= time.time() and row["revoked_reason"] == "lost"
            doc = await status(home)
            assert any(w.startswith("host listed-host: credential revoked by the operator at ") for w in doc["warnings"])
            rc, out, err = await gridctl(home, "status")
            assert rc == 0, err
            (line,) = [ln for ln in out.splitlines() if "listed-host" in ln and "revoked" in ln]
            assert time.strftime("%Y-%m-%d", time.gmtime(row["revoked_at"])) in line
    finally:
        await host.client.close()


async def test_revoked_from_an_operator_machine_the_agent_says_so_and_stops(
    secured_server: SecuredNats, controller_log: JetStreamLog, operator_home: Path, authority: Authority,
    tmp_path: Path,
) -> None:
    host_id = "joined-host"
    home = tmp_path / "controller"
    node_home = tmp_path / "node"
    agent: subprocess.Popen[bytes] | None = None
    agent_log = tmp_path / "agent.log"
    async with controller(controller_log, home, authority):
        _, token = invite(operator_home, (secured_server.url,), host_id=host_id, now=time.time())
        rc, out, err = await gridctl(node_home, "node", "join", token)
        assert rc == 0, err
        host_creds = node_home / "agent" / "identity" / "host.creds"
        try:
            with open(agent_log, "wb") as out_file:
                agent = subprocess.Popen([*GRIDCTL, "node", "start", "--heartbeat-interval", "0.5",
                                          "--port-range", engine_ports_arg(), "--memory-mb", "4000"],
                                         env=_env(node_home), stdout=out_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
            await host_row(home, host_id, lambda h: h["fresh"], "the joined agent's heartbeat", timeout=90)

            # An operator machine: the operator credential, not the authority.
            machine = operator_machine(tmp_path, authority)
            assert not (machine / "identity" / "account.nk").exists()
            started = time.time()
            rc, out, err = await gridctl(machine, "node", "revoke", host_id, "--reason", "left the lab",
                                         "--nats", url_list(secured_server))
            assert rc == 0, err
            assert f"host {host_id} revoked: 1 key(s)" in out and "applied by the controller" in out, out
            assert not (machine / "identity" / "account.nk").exists()  # no authority made there
            authority.reload()
            assert authority.host_revoked(host_id)
            # The request (no keys) and the controller's application (the keys), in that order.
            revocations = [m async for m in controller_log.replay(CONTROL_STREAM)
                           if m.subject == revocation_subject(host_id)]
            events = [codec.decode(m.data) for m in revocations]
            assert [bool(e.keys) for e in events] == [False, True]
            assert all(isinstance(e, CredentialRevoked) and e.reason == "left the lab" for e in events)

            # The agent says why and stops, non-zero, instead of retrying forever.
            deadline = time.monotonic() + AGENT_EXIT_SECONDS
            while agent.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            log_text = agent_log.read_text()
            assert agent.poll() is not None, f"the revoked agent still runs:\n{log_text[-3000:]}"
            assert agent.returncode == 3, log_text[-3000:]
            messages = [ln for ln in log_text.splitlines()
                        if "this host's credential was revoked by the operator at" in ln]
            assert len(messages) == 1, log_text[-3000:]
            assert "ask for a new invitation" in messages[0]
            assert time.strftime("%Y-%m-%d", time.gmtime(started)) in messages[0]
            # Not one reconnect attempt logged per half second after it.
            assert log_text.count("Authorization Violation") < 10, log_text[-3000:]

            row = await host_row(home, host_id, lambda h: h["revoked"], "the revoked mark")
            assert started - 1 <= row["revoked_at"] <= time.time() and row["revoked_reason"] == "left the lab"

            # The credential is refused for good; starting the agent again says why at once.
            with pytest.raises(Exception, match="(?i)authorization violation"):
                await nats.connect(secured_server.url, allow_reconnect=False, max_reconnect_attempts=0,
                                   connect_timeout=3, **connect_options(host_creds, None))
            rc, out, err = await gridctl(node_home, "node", "start", "--port-range", engine_ports_arg(),
                                         "--memory-mb", "4000", timeout=60)
            assert rc != 0 and "revoked" in err and "new invitation" in err, err
        finally:
            if agent is not None and agent.poll() is None:
                agent.terminate()
                agent.wait(60)
