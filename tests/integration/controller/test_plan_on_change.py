"""The controller appends a plan only when its decisions change (plus a slow keepalive).

An idle one-host grid used to append a plan every tick (~2 s): heartbeats move a host's free
memory, free memory moves the placement's fit score, and the score was part of what counted as
"changed". Scores and explanations are not decisions.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from grid.controller.service import Controller, ControllerSettings
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.subjects import HOSTS_STREAM
from grid.transport.jetstream import JetStreamLog

from grid.sim.agent import SimResidency
from tests.integration.controller.simhost import SimHost

MODEL = "m.gguf"


async def _heartbeat(ctl: Controller, log: JetStreamLog, host: SimHost) -> None:
    res = await log.append(host.heartbeat_event())
    await ctl._await_position(HOSTS_STREAM, res.seq)


async def test_unchanged_decisions_append_no_plan_until_the_keepalive(js_log: JetStreamLog, tmp_path: Path) -> None:
    settings = ControllerSettings(lease_ttl_seconds=3.0, lease_renew_seconds=0.5, restart_grace_seconds=0.0,
                                  background_ticks=False, plan_refresh_seconds=300.0)
    ctl = Controller(js_log, tmp_path / "home", settings=settings, controller_id="ctl-plan-change")
    host = SimHost("host-1", capacity_mb=16_000)
    host.agent.residencies[MODEL] = SimResidency("ready", 1000, time.time())
    await host.heartbeat(js_log)
    await ctl.start()
    try:
        await ctl.append_control(ProfileSet(event_id=new_event_id(), at=0.0, profile=ModelProfile(
            model_id=MODEL, memory_mb=1000, min_replicas=1)))
        first = await ctl.tick("test")
        assert first.plan_recorded and ctl.last_plan is not None and ctl.last_plan.placements
        scores = set()
        recorded = 0
        for capacity in (15_000, 14_000, 13_000, 12_000, 11_000):
            host.agent.capacity_mb = capacity  # free memory moves, so the fit score moves
            await _heartbeat(ctl, js_log, host)
            report = await ctl.tick("test")
            scores.add(ctl.last_plan.placements[0].score)
            recorded += report.plan_recorded
        assert len(scores) > 1, "the scores must drift for this test to mean anything"
        assert recorded == 0
        # A decision that changes (a second replica wanted) is recorded at once.
        await ctl.append_control(ProfileSet(event_id=new_event_id(), at=0.0, profile=ModelProfile(
            model_id=MODEL, memory_mb=1000, min_replicas=2, max_replicas=2)))
        assert (await ctl.tick("test")).plan_recorded
        # The keepalive: an unchanged plan is re-recorded once it is older than the refresh period.
        ctl.settings = ControllerSettings(**{**{f: getattr(settings, f) for f in settings.__struct_fields__},
                                             "plan_refresh_seconds": 0.05})
        await asyncio.sleep(0.1)
        assert (await ctl.tick("test")).plan_recorded
    finally:
        await ctl.stop()
