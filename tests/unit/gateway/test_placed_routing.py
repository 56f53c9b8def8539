"""The gateway routes a managed residency only to what the controller placed and the host confirmed.

A Gateway over the in-process log twin, fed the events a controller and an agent would append:
a heartbeat's claim alone attracts nothing; the latest plan's assignment plus the host's warm
ack does; a later drain ack, another plan, or another artifact than the profile's take it away;
an external residency is routed only once an operator admitted it. /metrics counts the claims it
refuses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from grid.config import GridConfig
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import Residency
from grid.events.log import InMemoryLog
from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM, PLANS_STREAM
from grid.gateway import routing
from grid.gateway import state as state_module
from grid.gateway.state import Gateway
from grid.metrics import exposition

from tests.placement import Placements, warm_ack
from tests.heartbeats import heartbeat

SHA = "ab" * 32


def ready(model: str = "m", *, managed: bool = True, sha: str | None = SHA, port: int = 1) -> Residency:
    return Residency(model_id=model, memory_mb=300, state="ready", endpoint=f"http://127.0.0.1:{port}",
                     max_concurrency=2, managed=managed, artifact_sha256=sha)


class Fleet:
    def __init__(self, log: InMemoryLog, gw: Gateway) -> None:
        self.log = log
        self.gw = gw
        self.placements = Placements(log)

    async def heartbeat(self, host: str, *residencies: Residency) -> None:
        await self.log.append(heartbeat(host, *residencies))
        await self.settled()

    async def settled(self) -> None:
        want = {s: await self.log.last_sequence(s) for s in (HOSTS_STREAM, CONTROL_STREAM, PLANS_STREAM)}
        for _ in range(500):
            if all(self.gw.runner.positions.get(s, 0) >= seq for s, seq in want.items()):
                return
            await asyncio.sleep(0.005)
        raise AssertionError("the gateway never folded the log")

    def routes(self, model: str = "m") -> list[str]:
        now = time.time()
        return sorted(c.host_id for c in self.gw.table(now).get(model, ()) if routing.exclusion(c, now) is None)

    def excluded(self, model: str = "m") -> dict[str, str | None]:
        now = time.time()
        return {c.host_id: routing.exclusion(c, now) for c in self.gw.table(now).get(model, ())}

    def unplaced(self) -> list[tuple[str, str, str]]:
        return [(c.host_id, c.model_id, c.reason) for c in self.gw.unplaced_claims(time.time())]


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    log = InMemoryLog()
    await log.append(ProfileSet(event_id=new_event_id(), at=time.time(),
                                profile=ModelProfile(model_id="m", memory_mb=300, artifact_sha256=SHA)))
    gw = Gateway(log, GridConfig(home=tmp_path, nats_url=None), api_keys=[])
    await gw.start()
    try:
        yield Fleet(log, gw)
    finally:
        await gw.stop()


async def test_a_claim_without_a_plan_placement_gets_no_route(fleet: Fleet) -> None:
    await fleet.heartbeat("hostile", ready())
    assert fleet.routes() == [] and fleet.gw.ready_models(time.time()) == []
    assert fleet.excluded() == {"hostile": routing.EXCLUDED_UNPLACED}
    assert fleet.unplaced() == [("hostile", "m", "not_in_plan")]
    # its own warm ack does not help: the plan is the controller's
    await fleet.log.append(warm_ack("hostile", "m"))
    await fleet.settled()
    assert fleet.routes() == [] and fleet.unplaced() == [("hostile", "m", "not_in_plan")]


async def test_placed_and_warm_acked_gets_a_route_and_a_later_drain_ack_removes_it(fleet: Fleet) -> None:
    await fleet.placements.place("h1", "m", ack=False)
    await fleet.heartbeat("h1", ready())
    assert fleet.routes() == [] and fleet.unplaced() == [("h1", "m", "no_warm_ack")]
    await fleet.placements.drained("h1", "m", kind="warm")  # the host's succeeded warm
    await fleet.settled()
    assert fleet.routes() == ["h1"] and fleet.gw.ready_models(time.time()) == ["m"] and fleet.unplaced() == []
    await fleet.placements.drained("h1", "m")
    await fleet.settled()
    assert fleet.routes() == [] and fleet.unplaced() == [("h1", "m", "no_warm_ack")]


async def test_a_plan_that_no_longer_assigns_it_removes_the_route(fleet: Fleet) -> None:
    await fleet.placements.place("h1", "m")
    await fleet.placements.place("h2", "m")
    await fleet.heartbeat("h1", ready())
    await fleet.heartbeat("h2", ready(port=2))
    assert fleet.routes() == ["h1", "h2"]
    await fleet.placements.unplace("h1", "m")
    await fleet.settled()
    assert fleet.routes() == ["h2"] and fleet.unplaced() == [("h1", "m", "not_in_plan")]


async def test_another_artifact_than_the_profiles_is_excluded(fleet: Fleet) -> None:
    await fleet.placements.place("h1", "m")
    await fleet.heartbeat("h1", ready(sha="cd" * 32))
    assert fleet.routes() == [] and fleet.unplaced() == [("h1", "m", "artifact_mismatch")]
    await fleet.heartbeat("h1", ready())
    assert fleet.routes() == ["h1"]


async def test_external_residencies_are_routed_only_once_an_operator_admitted_them(fleet: Fleet) -> None:
    claims = (ready(managed=False, sha=None), ready("other", managed=False, sha=None))
    await fleet.heartbeat("ext-host", *claims)
    assert fleet.routes() == [] and fleet.routes("other") == []
    assert fleet.unplaced() == [("ext-host", "m", "route_not_admitted"), ("ext-host", "other", "route_not_admitted")]
    await fleet.placements.admit("ext-host", claims)
    await fleet.settled()
    assert fleet.routes() == ["ext-host"] and fleet.routes("other") == ["ext-host"]
    assert fleet.unplaced() == []


async def test_metrics_and_stats_count_the_unplaced_claims(fleet: Fleet) -> None:
    await fleet.placements.place("h1", "m")
    await fleet.heartbeat("h1", ready())
    await fleet.heartbeat("hostile", ready(), ready("x", sha=None))
    text = exposition(fleet.gw.metrics.registry).decode()
    assert 'grid_gateway_unplaced_claims{reason="not_in_plan"} 2.0' in text
    assert 'grid_gateway_unplaced_claims{reason="no_warm_ack"} 0.0' in text
    stats = fleet.gw.stats()
    assert [(c["host_id"], c["model_id"], c["reason"]) for c in stats["unplaced_claims"]] == [
        ("hostile", "m", "not_in_plan"), ("hostile", "x", "not_in_plan")]
    assert stats["ready_models"] == ["m"]


async def test_startup_finds_warm_acks_older_than_the_replayed_tail(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A residency's warm ack is as old as the residency: startup scans the older acks too."""
    log = InMemoryLog()
    placements = Placements(log)
    await placements.place("h1", "m")  # plan + ack, then many heartbeats
    await placements.place("h2", "m")
    await placements.drained("h2", "m")
    for _ in range(20):
        for host in ("h1", "h2"):
            await log.append(heartbeat(host, ready()))
    monkeypatch.setattr(state_module, "HOST_REPLAY_MAX_MESSAGES", 5)
    monkeypatch.setattr(state_module, "ACK_SCAN_IDLE_SECONDS", 0.05)
    gw = Gateway(log, GridConfig(home=tmp_path, nats_url=None), api_keys=[])
    await gw.start()
    try:
        now = time.time()
        assert [c.host_id for c in gw.table(now)["m"] if routing.exclusion(c, now) is None] == ["h1"]
        assert [(c.host_id, c.reason) for c in gw.unplaced_claims(now)] == [("h2", "no_warm_ack")]
        assert gw.runner.positions[HOSTS_STREAM] == await log.last_sequence(HOSTS_STREAM)
        assert gw.ack_scan["folded"] == 3
    finally:
        await gw.stop()
