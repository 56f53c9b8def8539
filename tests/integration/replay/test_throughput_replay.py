"""Measured per-engine throughput and owner evaluations feed recorded plans, which replay byte for byte."""

from __future__ import annotations

import pytest

from grid.clock import SystemClock
from grid.controller.tick import tick_input
from grid.demand import outcomes
from grid.events.evaluations import EvaluationRecorded
from grid.fleet.planning import Policy
from replay import LogSource, replay_window
from tests.unit.replay.session import Session

pytestmark = pytest.mark.slow


async def test_plans_made_with_measured_throughput_replay_byte_for_byte(js_log) -> None:
    session = Session(js_log, SystemClock(), hosts=4, models=2, seed=11, served=True)
    await session.setup()
    for r in range(6):  # Session.run's rounds, with an owner's evaluation on the control stream
        await session.heartbeats()
        await session.requests()
        if r == 2:
            await js_log.append(EvaluationRecorded(event_id="eval-1", at=session.clock.now(),
                                                   model_id=session.models[0], workload="coding", score=0.5,
                                                   samples=4, passed=2, total=4))
        await session.heartbeats()
        await session.tick()
    plans = session.plans
    assert len(plans) == 6
    # The controller's input really carried measurements (else this would prove nothing).
    await session.runner.catch_up(js_log)
    hosts = tick_input(session.runner.states, session.clock.now(), Policy()).planner_input.hosts
    measured = {h.host_id: h.measured_tokens_per_second for h in hosts if h.measured_tokens_per_second}
    assert measured and all(v > 0 for rates in measured.values() for v in rates.values())
    view = outcomes.view(session.runner.states["demand"].outcomes, session.models[0], "coding", None,
                         session.clock.now())
    assert view.quality == 0.5 and view.quality_samples > 3.99

    result = await replay_window(LogSource(js_log))
    assert result.reproduced, result.summary
    assert result.summary.plans_compared == 6 and result.summary.identical == 6
