"""Real agents on one machine: the heartbeat reports the detected inventory, and capacity
shares are partitioned (a share that does not fit beside the others is refused, clearly)."""

from __future__ import annotations

import psutil
import pytest

from grid.agent.inventory import MIB, CapacityShareError
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import heartbeats, wait_for

pytestmark = pytest.mark.e2e


async def test_two_agents_on_one_machine_never_offer_more_than_it_has(js_log: JetStreamLog, start_agent,
                                                                      tmp_path) -> None:
    total = psutil.virtual_memory().total // MIB
    first = await start_agent(host_id="share-a", capacity_mb=total - 512, state_dir=tmp_path / "a")
    hb = await wait_for(lambda: _latest(js_log, "share-a"))
    res = hb.resources
    assert res.capacity_mb == total - 512 and res.backends == ("cpu",) and res.gpu_count == 0
    assert res.runtimes == (("llama.cpp",) if first.binary else ()) and res.cpu_count == psutil.cpu_count()

    with pytest.raises(CapacityShareError) as err:
        await start_agent(host_id="share-b", capacity_mb=1024, state_dir=tmp_path / "b")
    assert "does not fit" in str(err.value) and "share-a" in str(err.value)
    # Without --memory-mb the second agent takes what is left: the two add up to the machine.
    second = await start_agent(host_id="share-c", state_dir=tmp_path / "c")
    assert second.options.capacity_mb == 512
    await first.stop()
    third = await start_agent(host_id="share-b", capacity_mb=1024, state_dir=tmp_path / "b2")
    assert third.options.capacity_mb == 1024


async def _latest(log: JetStreamLog, host_id: str):  # type: ignore[no-untyped-def]
    hbs = [hb for hb in await heartbeats(log) if hb.host_id == host_id]
    return hbs[-1] if hbs else None
