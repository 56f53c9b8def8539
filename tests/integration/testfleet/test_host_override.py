"""`gridctl host pause|resume HOST` from the control machine steers another machine's agent.

Real processes: a secured test fleet of two hosts (`gridctl test start --machines 2`). The operator
override travels as a signed `HostOverride` on the log; h2's own agent reports it (its state file
and its heartbeat, as `gridctl status` shows), and a HostOverride a host credential signed is
ignored by the agent and rejected by the controller's fold.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from grid.agent.engines.runtime import Runtime
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.control import HostOverride
from grid.events.host import ProtectionTransition
from grid.events.subjects import HOSTS_STREAM
from grid.identity.connect import connect_log
from grid.identity.local import local_credential, local_tls_ca
from grid.identity.signing import Identity
from tests.integration.testfleet.test_fleet_cli import gridctl, seed_fleet_models
from tests.ports import fleet_engine_port_base

pytestmark = pytest.mark.engine


@pytest.fixture
def fleet(tmp_path: Path, bundled_model_home: Path, engine_runtime: Runtime) -> Iterator[dict[str, Any]]:
    home = tmp_path / "home"
    seed_fleet_models(home, bundled_model_home)
    try:
        started = gridctl(home, "test", "start", "--machines", "2", "--engine-port-base", str(fleet_engine_port_base(2)),
                          "--json")
        assert started.returncode == 0, started.stderr
        status = json.loads(started.stdout)
        status["home"] = home
        yield status
    finally:
        gridctl(home, "test", "stop", timeout=180)


def as_home(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GRID_NATS_URL", "GRID_AGENT_STATE_DIR")}
    env |= {"GRID_HOME": str(home), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "grid.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def control_home(fleet: dict[str, Any]) -> Path:
    return Path(fleet["root"]) / "control"


def host_home(fleet: dict[str, Any], host_id: str) -> Path:
    return Path(next(h["home"] for h in fleet["hosts"] if h["host_id"] == host_id))


def agent_state(fleet: dict[str, Any], host_id: str) -> dict[str, Any]:
    """What the host's own agent reports (its state file), read on that machine."""
    done = as_home(host_home(fleet, host_id), "node", "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def seen(fleet: dict[str, Any]) -> dict[str, Any]:
    """`gridctl status --json` on the control machine."""
    done = as_home(control_home(fleet), "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def host_row(fleet: dict[str, Any], host_id: str) -> dict[str, Any]:
    return next(h for h in seen(fleet)["hosts"] if h["host_id"] == host_id)


# What the host's sensors may make of a busy CI machine: anything but an override's states.
FREE = ("accepting", "throttled")


def wait_for(what: str, check: Callable[[], bool], timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_operator_pauses_and_resumes_another_host_and_a_host_forgery_is_ignored(fleet: dict[str, Any]) -> None:
    ctl = control_home(fleet)
    nats = fleet["nats_url"]
    paused = as_home(ctl, "host", "pause", "h2", "--reason", "maintenance", "--nats", nats, "--json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["state"] == "paused"

    # h2's own agent honours it (its state file, and the heartbeat the controller shows) ...
    wait_for("h2's agent to report paused", lambda: agent_state(fleet, "h2")["protection_state"] == "paused")
    assert agent_state(fleet, "h2")["protection_reason"].startswith("override:paused: maintenance")
    wait_for("status to show h2 paused by its own heartbeat",
             lambda: host_row(fleet, "h2")["protection_reason"].startswith("override:paused"))
    row = host_row(fleet, "h2")
    assert row["state"] == "paused" and row["override"]["state"] == "paused"
    # ... and only h2.
    assert agent_state(fleet, "h1")["protection_state"] in FREE

    resumed = as_home(ctl, "host", "resume", "h2", "--nats", nats)
    assert resumed.returncode == 0, resumed.stderr
    wait_for("h2's agent to release the pause", lambda: agent_state(fleet, "h2")["protection_state"] in FREE)
    wait_for("status to show h2 released", lambda: host_row(fleet, "h2")["state"] in FREE)
    assert host_row(fleet, "h2")["override"] is None

    # A quarantine signed by a host credential (h1's), stored through a connection that may
    # publish there (the controller's): the agent ignores it and the controller's fold rejects it.
    h1_creds = Path(json.loads((host_home(fleet, "h1") / "agent" / "identity" / "enrolment.json")
                               .read_text())["creds_path"])

    async def forge() -> None:
        log = await connect_log(nats, credentials=local_credential(ctl, "controller"), tls_ca=local_tls_ca(ctl),
                                ensure_streams=False)
        log.authorship = Identity.from_creds(h1_creds)
        try:
            await log.append(HostOverride(event_id=new_event_id(), at=time.time(), host_id="h2",
                                          state="quarantined", reason="forged"))
        finally:
            await log.close()

    async def h2_transitions() -> list[ProtectionTransition]:
        log = await connect_log(nats, credentials=local_credential(ctl, "controller"), tls_ca=local_tls_ca(ctl),
                                ensure_streams=False)
        try:
            events = [codec.decode(msg.data) async for msg in log.replay(HOSTS_STREAM)]
        finally:
            await log.close()
        return [e for e in events if isinstance(e, ProtectionTransition) and e.host_id == "h2"]

    asyncio.run(forge())
    wait_for("the controller to reject the forgery",
             lambda: seen(fleet)["rejected_events"]["by_reason"].get("not_permitted", 0) >= 1)
    # The agent reads overrides in log order: once it honours a genuine one appended after the
    # forgery, it has read the forgery too, and its transitions say what it made of it.
    after = as_home(ctl, "host", "pause", "h2", "--reason", "after the forgery", "--nats", nats)
    assert after.returncode == 0, after.stderr
    wait_for("h2's agent to honour the override after the forgery",
             lambda: agent_state(fleet, "h2")["protection_reason"].startswith("override:paused: after the forgery"))
    transitions = asyncio.run(h2_transitions())
    assert any(t.to_state == "paused" and "after the forgery" in t.reason for t in transitions), transitions
    assert [t.reason for t in transitions if t.to_state == "quarantined"] == []
    resumed = as_home(ctl, "host", "resume", "h2", "--nats", nats)
    assert resumed.returncode == 0, resumed.stderr
    wait_for("h2's agent to release the pause", lambda: agent_state(fleet, "h2")["protection_state"] in FREE)
    wait_for("status to show h2 released", lambda: host_row(fleet, "h2")["state"] in FREE)
    mine = agent_state(fleet, "h2")
    assert mine["protection_state"] in FREE and not mine["protection_reason"].startswith("override"), mine
    row = host_row(fleet, "h2")
    assert row["state"] in FREE and row["override"] is None
    assert any(r["subject"] == "grid.ctl.override.h2" and r["reason"] == "not_permitted"
               for r in seen(fleet)["rejected_events"]["latest"])
