"""Logical hosts partition one machine's memory: an agent offering a share bears only its
share's fraction of the memory used outside Grid (else N agents count it N times)."""

from __future__ import annotations

import psutil

from grid.agent.context import MIB
from grid.agent.service import share_of_unmanaged_mb
from grid.config import GridConfig
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import agent_factory, wait_for


def test_a_share_bears_its_fraction_of_unmanaged_memory() -> None:
    assert share_of_unmanaged_mb(2000, None, 16000) == 2000  # no share: the whole machine's
    assert share_of_unmanaged_mb(2000, 16000, 16000) == 2000  # the whole machine as a share
    assert share_of_unmanaged_mb(2000, 4000, 16000) == 500
    assert share_of_unmanaged_mb(1, 1000, 16000) == 1  # rounded up, never under-charged
    assert share_of_unmanaged_mb(-50, 1000, 16000) == 0


async def test_a_real_agent_with_a_small_share_reports_its_fraction(js_log: JetStreamLog, grid_home) -> None:  # type: ignore[no-untyped-def]
    vm = psutil.virtual_memory()
    machine_mb = vm.total // MIB
    share = 1024
    async with agent_factory(js_log, GridConfig(home=grid_home, nats_url=None), heartbeat_interval=0.3,
                             capacity_mb=share) as start:
        agent = await start()
        async def beat() -> bool:
            return agent.last_heartbeat is not None

        await wait_for(beat, timeout=10)
        hb = agent.last_heartbeat
        assert hb is not None and hb.resources.capacity_mb == share
        used = (psutil.virtual_memory().total - psutil.virtual_memory().available) // MIB
        # The machine runs more than a share's fraction outside Grid (this test process alone),
        # and the heartbeat charges the share with its fraction, not all of it.
        assert used > 200
        assert hb.unmanaged_memory_mb <= -(-used * 2 * share // machine_mb) + 10, (hb.unmanaged_memory_mb, used)
        assert hb.unmanaged_memory_mb < used / 2
