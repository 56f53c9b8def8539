"""The controller's tick counts an external engine only once an operator admitted it: a heartbeat's
`managed: false, ready` claim is no supply for the planner, no ready replica for the forecast and
no proof for the reconciler, until a RouteAdmitted for that host, model, kind and endpoint is on
the control stream and the profile lets that host serve the model.

The projection states are folded from an in-process log exactly as the controller folds them,
and the tick is the controller's own pure composition (grid.controller.tick.run_tick).
"""

from __future__ import annotations

import pytest

from grid.clock import SimulatedClock
from grid.controller.inputs import ready_replicas
from grid.controller.tick import PROJECTIONS, Controls, Tick, run_tick
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet, RouteWithdrawn
from grid.events.host import Residency
from grid.events.log import InMemoryLog
from grid.fleet.planning import Policy
from grid.projections.runner import ProjectionRunner
from tests.heartbeats import heartbeat
from tests.placement import route_admitted

NOW = 1_800_000_000.0
MODEL = "m"
ENDPOINT = "http://127.0.0.1:8080"
POLICY = Policy(heartbeat_timeout_seconds=40.0)


def claim() -> Residency:
    return Residency(model_id=MODEL, memory_mb=300, state="ready", managed=False, runtime="llama.cpp",
                     endpoint=ENDPOINT, loaded_age_seconds=600.0)


class Grid:
    def __init__(self) -> None:
        self.clock = SimulatedClock(NOW)
        self.log = InMemoryLog(self.clock)

    async def profile(self, **kw: object) -> None:
        await self.log.append(ProfileSet(event_id=new_event_id(), at=NOW, profile=ModelProfile(
            model_id=MODEL, memory_mb=300, min_replicas=1, max_replicas=1, **kw)))  # type: ignore[arg-type]

    async def tick(self) -> Tick:
        for host, residencies in (("ext-host", (claim(),)), ("other", ())):
            await self.log.append(heartbeat(host, *residencies, at=self.clock.now()))
        runner = ProjectionRunner(PROJECTIONS)
        await runner.catch_up(self.log)
        return run_tick(runner.states, self.clock.now(), Controls(policy=POLICY, mode="automatic"))


def counted(tick: Tick) -> list[tuple[str, str, bool]]:
    return [(p.host_id, p.status, p.managed) for p in tick.plan.placements if p.model_id == MODEL]


@pytest.fixture
async def grid() -> Grid:
    g = Grid()
    await g.profile()
    return g


async def test_an_unadmitted_external_claim_is_no_supply_no_ready_replica_and_no_proof(grid: Grid) -> None:
    tick = await grid.tick()
    hosts = tick.planned.planner_input.hosts
    assert all(r.model_id != MODEL for h in hosts for r in h.residencies)  # not even an incumbent
    assert ready_replicas(hosts, grid.clock.now(), POLICY) == {}
    # The planner places a managed replica of its own; nothing is satisfied by the claim.
    assert counted(tick) and all(managed and status == "new" for _, status, managed in counted(tick))
    assert tick.result.satisfied == 0
    # Its memory still counts as used on its host.
    ext_host = next(h for h in hosts if h.host_id == "ext-host")
    assert ext_host.unmanaged_memory_mb >= 300


async def test_an_admitted_external_engine_is_supply_until_the_admission_is_withdrawn(grid: Grid) -> None:
    await grid.log.append(route_admitted("ext-host", MODEL, kind="llama.cpp", endpoint=ENDPOINT, at=NOW))
    tick = await grid.tick()
    assert counted(tick) == [("ext-host", "existing", False)]
    assert tick.result.satisfied == 1 and not [a for a in tick.result.actions if a.model_id == MODEL]
    assert ready_replicas(tick.planned.planner_input.hosts, grid.clock.now(), POLICY) == {MODEL: 1}
    await grid.log.append(RouteWithdrawn(event_id=new_event_id(), at=NOW, host_id="ext-host", model_id=MODEL))
    tick = await grid.tick()
    assert ("ext-host", "existing", False) not in counted(tick) and tick.result.satisfied == 0


async def test_an_admission_for_a_host_the_profile_does_not_allow_counts_for_nothing(grid: Grid) -> None:
    await grid.profile(allow_hosts=("other",))
    await grid.log.append(route_admitted("ext-host", MODEL, kind="llama.cpp", endpoint=ENDPOINT, at=NOW))
    tick = await grid.tick()
    assert counted(tick) == [("other", "new", True)] and tick.result.satisfied == 0


async def test_an_admission_of_another_endpoint_or_kind_counts_for_nothing(grid: Grid) -> None:
    await grid.log.append(route_admitted("ext-host", MODEL, kind="llama.cpp", endpoint="http://127.0.0.1:9", at=NOW))
    await grid.log.append(route_admitted("ext-host", "unrelated", kind="llama.cpp", endpoint=ENDPOINT, at=NOW))
    tick = await grid.tick()
    assert ("ext-host", "existing", False) not in counted(tick)
    await grid.log.append(route_admitted("ext-host", MODEL, kind="vllm", endpoint=ENDPOINT, at=NOW))
    tick = await grid.tick()
    assert ("ext-host", "existing", False) not in counted(tick)
