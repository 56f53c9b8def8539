"""Measured per-engine throughput is part of every recorded plan's input, and replays byte for byte."""

from __future__ import annotations

import pytest

from grid.clock import SystemClock
from grid.controller.tick import tick_input
from grid.planner.types import Policy
from replay import LogSource, replay_window
from tests.unit.replay.session import Session

pytestmark = pytest.mark.slow


async def test_plans_made_with_measured_throughput_replay_byte_for_byte(js_log) -> None:
    session = Session(js_log, SystemClock(), hosts=4, models=2, seed=11, served=True)
    plans = await session.run(rounds=6)
    assert len(plans) == 6
    # The controller's input really carried measurements (else this would prove nothing).
    await session.runner.catch_up(js_log)
    hosts = tick_input(session.runner.states, session.clock.now(), Policy()).planner_input.hosts
    measured = {h.host_id: h.measured_tokens_per_second for h in hosts if h.measured_tokens_per_second}
    assert measured and all(v > 0 for rates in measured.values() for v in rates.values())

    result = await replay_window(LogSource(js_log))
    assert result.reproduced, result.summary
    assert result.summary.plans_compared == 6 and result.summary.identical == 6
