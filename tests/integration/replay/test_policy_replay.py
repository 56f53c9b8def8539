"""A controller running a non-default planner Policy is reproduced by replay (real nats-server).

PlanCreated records the policy, so replay rebuilds the input the controller planned from instead
of reporting a digest mismatch for every plan.
"""

from __future__ import annotations

import time
from pathlib import Path

from grid.controller.service import Controller, ControllerSettings
from grid.controller.tick import recorded_policy
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.plan import PlanCreated
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import PLANS_STREAM
from grid.fleet.planning import Policy
from grid.transport.jetstream import JetStreamLog
from replay import LogSource, replay_window
from tests.integration.controller.simhost import SimHost

POLICY = Policy(max_evictions=4, explain_host_limit=1, admission_headroom_fraction=0.1)
SETTINGS = ControllerSettings(background_ticks=False, lease_ttl_seconds=5.0, lease_renew_seconds=1.0,
                              restart_grace_seconds=0.0, plan_refresh_seconds=0.0, policy=POLICY)


async def test_plans_of_a_controller_with_a_non_default_policy_reproduce(js_log: JetStreamLog, tmp_path: Path) -> None:
    hosts = [SimHost("h1"), SimHost("h2")]
    for h in hosts:
        await h.heartbeat(js_log)
    ctl = Controller(js_log, tmp_path / "home", settings=SETTINGS, controller_id="ctl-policy")
    await ctl.start()
    try:
        for i, model in enumerate(("m-a", "m-b")):
            await ctl.append_control(ProfileSet(event_id=new_event_id(), at=0, profile=ModelProfile(
                model_id=model, memory_mb=1000 + 500 * i, min_replicas=1, max_replicas=2)))
            records = tuple(
                RequestFeatures(endpoint="chat", requested_model=model, served_model=model, workload="coding",
                                input_units=50, output_units=10, service_seconds=0.2, finished_at=time.time())
                for _ in range(5)
            )
            await js_log.append(RequestBatch(event_id=new_event_id(), at=time.time(), source="gw", records=records))
            await ctl.runner.catch_up(js_log)
            report = await ctl.tick("test")
            assert report.error is None and report.plan_recorded
    finally:
        await ctl.stop()

    recorded = [codec.decode(m.data) async for m in js_log.replay(PLANS_STREAM)]
    assert len(recorded) == 2 and all(isinstance(p, PlanCreated) for p in recorded)
    assert all(recorded_policy(p) == POLICY for p in recorded)
    result = await replay_window(LogSource(js_log))
    assert result.summary.plans_compared == 2
    assert result.summary.digest_mismatches == 0 and result.reproduced, result.plans
