"""A command to an agent killed with -9 does not stay pending forever.

A real agent process (`gridctl node start`) heartbeats, is SIGKILLed, and the real controller then
places a model on it (its last heartbeat is still fresh): the load goes to the log and nobody
will ever take it. Once its lease has run out and the host is stale, the command expires: status
shows it in history as `expired` (expired_undelivered) instead of listing it as pending for good,
and no new command goes to the silent host.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import msgspec

from grid.controller.governor import Limits
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.events.host import HostHeartbeat
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog

from tests.faults.agentproc import spawn_agent
from tests.integration.agent.agentkit import host_events, wait_for
from tests.integration.controller.statuskit import SETTINGS, serving_controller, status_until
from tests.integration.controller.test_cli_admin import gridctl
from tests.ports import engine_ports_arg

HOST = "h-killed"
SHA = "ef" * 32
# Stale after 5 s of silence (the default is longer; the rule is the same).
LIMITS = Limits(heartbeat_timeout_seconds=5.0)


async def _heartbeat_seen(log: JetStreamLog) -> bool:
    return any(isinstance(e, HostHeartbeat) and e.host_id == HOST for e in await host_events(log))


async def test_a_command_to_a_killed_agent_expires_with_its_reason(js_log: JetStreamLog, nats_server: EmbeddedNats,
                                                                   tmp_path: Path) -> None:
    agent = spawn_agent(nats_server.url, tmp_path / "agent-home", tmp_path / "agent.log",
                        "--host-id", HOST, "--port-range", engine_ports_arg())
    try:
        await wait_for(lambda: _heartbeat_seen(js_log), timeout=90.0, interval=0.3)
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=30)
    await js_log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))
    await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
        model_id="m", memory_mb=100, min_replicas=1, artifact_sha256=SHA,
        artifact_source=(tmp_path / "absent.gguf").as_uri(), artifact_size_mb=10)))
    home = tmp_path / "home"
    settings = msgspec.structs.replace(SETTINGS, limits=LIMITS)

    async def quiet() -> None:  # the host is dead: nothing heartbeats
        return None

    async with serving_controller(js_log, home, "ctl-dead-host", settings=settings):
        doc = await status_until(home, quiet, lambda d: any(c["host_id"] == HOST for c in d["pending_commands"]),
                                 "a command issued to the killed agent's host", timeout=30.0)
        issued = [c["action_id"] for c in doc["pending_commands"] if c["host_id"] == HOST]
        doc = await status_until(
            home, quiet, lambda d: {c["action_id"] for c in d["history"] if c["status"] == "expired"} >= set(issued),
            "the command to the dead host expired", timeout=60.0)
        expired = [c for c in doc["history"] if c["action_id"] in issued]
        assert all(c["message"] == "expired_undelivered" and c["acked_at"] is None for c in expired), expired
        assert not [c for c in doc["pending_commands"] if c["host_id"] == HOST], doc["pending_commands"]
        # The silent host gets nothing new: its copies are left to the stale-host rule.
        deferred = {(d["host_id"], d["reason"]) for d in doc["reconciliation"]["deferred"]}
        assert (HOST, "host_stale") in deferred, deferred
        rc, out, err = await gridctl(home, "status")
        assert rc == 0, err
        assert f"on {HOST} (expired_undelivered)" in out, out
