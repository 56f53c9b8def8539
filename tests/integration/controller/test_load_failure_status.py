"""A load that fails on a host for an artifact reason shows on the controller's status as a
shortfall with that reason (real controller, real host agent, real NATS), not only in the
host's own log."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from grid.agent.sensors import FixedSensors
from grid.agent.service import AgentOptions, HostAgent
from grid.config import GridConfig
from grid.controller.service import Controller, ControllerSettings
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.transport.jetstream import JetStreamLog
from tests.integration.controller.simhost import wait_for
from tests.ports import engine_ports

SETTINGS = ControllerSettings(tick_interval_seconds=0.3, coalesce_seconds=0.05, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0)
MODEL = "never-pushed.gguf"
HOST = "host-lacking"


async def test_failed_artifact_load_is_a_shortfall_with_its_reason(js_log: JetStreamLog, tmp_path: Path) -> None:
    sha = hashlib.sha256(b"weights nobody pushed").hexdigest()
    agent = HostAgent(js_log, GridConfig(home=tmp_path / "agent-home", nats_url=None),
                      AgentOptions(host_id=HOST, heartbeat_interval=0.3, sample_interval=0.2,
                                   port_range=engine_ports(10)),
                      sensor_source=FixedSensors())
    controller = Controller(js_log, tmp_path / "controller-home", settings=SETTINGS, controller_id="ctl-lf")
    await agent.start()
    try:
        await controller.start()
        await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
            model_id=MODEL, memory_mb=300, artifact_sha256=sha, min_replicas=1, max_replicas=1)))
        await js_log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))

        def short() -> dict | None:
            status = controller.status()
            row = next((m for m in status["models"] if m["model_id"] == MODEL), None)
            return status if row is not None and row["shortfall"] is not None else None

        status = await wait_for(short, timeout=30.0)
        row = next(m for m in status["models"] if m["model_id"] == MODEL)
        assert row["shortfall"]["reason"] == "artifact_not_cached", row
        assert row["shortfall"]["host_id"] == HOST and HOST in row["shortfall"]["detail"]
        assert (row["shortfall"]["wanted"], row["shortfall"]["placed"]) == (1, 0)
        failure = next(f for f in status["load_failures"] if f["model_id"] == MODEL)
        assert (failure["host_id"], failure["reason"], failure["artifact_sha256"]) == (HOST, "artifact_not_cached", sha)
    finally:
        await controller.stop()
        await agent.stop(drain=True)
