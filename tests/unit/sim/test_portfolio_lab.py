"""The joint portfolio search in the scenario lab: the production tick on a one-slot fleet."""

from __future__ import annotations

import dataclasses

import msgspec

from grid.events.host import HostResources
from grid.sim import catalog as catalog_mod
from grid.sim import traffic
from grid.sim.fleet import GIB, MachineSpec
from grid.sim.personas import Persona
from grid.sim.run import run
from grid.sim.scenario import Scenario, ScenarioConfig
from grid.sim.workday import build_workday


@dataclasses.dataclass(frozen=True, slots=True)
class OneSlotMachine(MachineSpec):
    """A lab machine whose agent reports a model ceiling of one serving model."""

    def resources(self) -> HostResources:
        return msgspec.structs.replace(MachineSpec.resources(self), model_limit=1)


# Two specialists, each slightly better for its workload, and a generalist that serves both.
SPECS = (
    catalog_mod.ModelSpec("coder", 10 * GIB, 60.0, 30.0, (("coding", 0.95),), expected_service_seconds=5.0),
    catalog_mod.ModelSpec("generalist", 6 * GIB, 30.0, 20.0, (("coding", 0.7), ("marketing", 0.7), ("general", 0.8)),
                          expected_service_seconds=3.0),
    catalog_mod.ModelSpec("writer", 5 * GIB, 30.0, 20.0, (("marketing", 0.9),), expected_service_seconds=3.0),
)


def _one_slot_scenario(seed: int = 1, minutes: int = 60) -> Scenario:
    fleet = (OneSlotMachine(
        host_id="m00", kind="nvidia-cuda", memory_mb=24 * GIB, disk_gb=512, failure_domain="rack-a",
        runtimes=("llama.cpp",), backends=("cuda",), speed=1.6, concurrency_factor=1.5, bandwidth_mb_s=400.0,
    ),)
    profiles = {s.model_id: catalog_mod.profile(s) for s in SPECS}
    users = (Persona("developer", (("coding", 1.0),), 0.5),) * 6 + (Persona("marketer", (("marketing", 1.0),), 0.5),) * 6
    # No incidents: the only machine's outage would hide what the portfolio decides.
    day = dataclasses.replace(build_workday(minutes, seed, ("m00",)), incidents=())
    requests = traffic.generate(users, day, seed, frozenset(profiles))
    cfg = ScenarioConfig(machines=1, models=len(SPECS), users=len(users), minutes=minutes, seed=seed)
    return Scenario(cfg, fleet, SPECS, profiles, users, day, requests, traffic.digest(requests))


def test_a_shared_generalist_beats_two_specialists_on_a_one_slot_fleet() -> None:
    # Independently, coding picks the coder and marketing the writer; the machine holds one
    # model, so one of the two workloads got no model all day (service 0). The joint search
    # projects both onto the generalist, which the plan places and the router uses for both.
    sc = _one_slot_scenario()
    joint: list[int] = []

    def on_tick(minute, pin, plan, result) -> None:  # type: ignore[no-untyped-def]
        placed = {p.model_id for p in plan.placements}
        if placed == {"generalist"}:
            joint.append(minute)

    report = run(sc, "smart", on_tick=on_tick).report()
    service = {w.workload: w.service for w in report.workloads}
    assert set(service) == {"coding", "marketing"}
    assert min(service.values()) >= 0.8, service
    assert len(joint) >= 50
    assert report.safety_violations == 0
