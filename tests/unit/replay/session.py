"""A recorded session for replay tests: real events on a real log, ticks the controller's way.

Each controller pass is the production tick (grid.controller.tick.run_tick, automatic mode): it
appends PlanCreated with based_on = the positions its runner had folded, then the commands
grid.controller.issue makes of the reconciler's decision. The hosts are simulated agents
(grid.sim.agent.SimAgent) that execute those commands at once and ack them, and converge one
step per heartbeat round (the session may run on the wall clock): a new engine is reported
warming once, then ready; an unloading one once, then gone.
"""

from __future__ import annotations

import math
import random
from typing import Any

import msgspec

from grid.clock import Clock, SimulatedClock
from grid.controller.issue import Issuer, decision_events
from grid.controller.tick import PROJECTIONS, Controls, encode_policy, run_tick
from grid.events.acks import ActionAck
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.events.host import CachedArtifact, HostHeartbeat, HostRegistered, HostResources, Residency
from grid.events.log import EventLog
from grid.events.plan import PlanCreated, make_generation
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import PLAN_SUBJECT
from grid.fleet.planning import Policy, encode_plan
from grid.planner.digest import inputs_digest
from grid.projections.runner import ProjectionRunner
from grid.sim.agent import SimAgent, Timing

CONTROLLER_ID = "controller-1"
EPOCH = "epoch-1"
LEASE_SECONDS = 30.0
# Timed, so that warming and unloading are states a heartbeat reports; a round settles them.
TIMING = Timing()


class Session:
    def __init__(self, log: EventLog, clock: Clock | None = None, *, hosts: int = 4, models: int = 3, seed: int = 1,
                 policy: Policy = Policy(), record_policy: bool = True, served: bool = False) -> None:
        """`record_policy=False` records plans the way controllers did before PlanCreated carried the policy.

        `served=True` attributes each request to a host with a ready copy of its model (as the
        gateway does), so the throughput projection learns per-engine rates.
        """
        self.log = log
        self.clock = clock or SimulatedClock(1_800_000_000.0)
        self.rng = random.Random(seed)
        self.hosts = [f"host-{i}" for i in range(hosts)]
        self.models = [f"model-{i}.Q4.gguf" for i in range(models)]
        self.policy = policy
        self.record_policy = record_policy
        self.served = served
        self.runner = ProjectionRunner(PROJECTIONS)
        self.agents = {h: SimAgent(h, capacity_mb=self._resources(h).capacity_mb, timing=TIMING) for h in self.hosts}
        self.controls = Controls(policy=policy, mode="automatic")
        self.sequence = 0
        self.plans: list[PlanCreated] = []
        self._n = 0

    def _eid(self, kind: str) -> str:
        self._n += 1
        return f"{kind}-{self._n}"

    def _advance(self, seconds: float) -> None:
        if isinstance(self.clock, SimulatedClock):
            self.clock.advance(seconds)

    async def setup(self) -> None:
        now = self.clock.now()
        await self.log.append(ModeSet(event_id=self._eid("mode"), at=now, mode="automatic"))
        for i, m in enumerate(self.models):
            await self.set_profile(m, min_replicas=1 + (i == 0), memory_mb=2000 + 500 * i)
        for h in self.hosts:
            await self.log.append(HostRegistered(event_id=self._eid("reg"), at=now, host_id=h,
                                                 resources=self._resources(h)))

    def _resources(self, host: str) -> HostResources:
        idx = self.hosts.index(host)
        return HostResources(capacity_mb=8000 + 2000 * (idx % 3), failure_domain=f"rack-{idx % 2}")

    async def set_profile(self, model: str, **kw: Any) -> None:
        profile = ModelProfile(model_id=model, max_replicas=3, **kw)
        await self.log.append(ProfileSet(event_id=self._eid("profile"), at=self.clock.now(), profile=profile))

    def pause(self, host: str, paused: bool = True) -> None:
        self.agents[host].state = "paused" if paused else "accepting"

    async def heartbeats(self) -> None:
        now = self.clock.now()
        for h in self.hosts:
            agent = self.agents[h]
            res = tuple(
                Residency(model_id=m, memory_mb=r.memory_mb, state=r.state,  # type: ignore[arg-type]
                          artifact_sha256=r.sha, loaded_age_seconds=now - r.loaded_at,
                          last_used_age_seconds=now - r.last_used_at,
                          endpoint=f"http://127.0.0.1:9{self.hosts.index(h):03d}")
                for m, r in sorted(agent.residencies.items())
            )
            await self.log.append(HostHeartbeat(
                event_id=self._eid("hb"), at=now, host_id=h, resources=self._resources(h),
                state=agent.state, residencies=res,  # type: ignore[arg-type]
                cached=tuple(CachedArtifact(model_id=m, sha256="", size_bytes=1) for m in sorted(agent.cached)),
                disk_free_bytes=100 << 30, disk_total_bytes=200 << 30, highest_term=agent.fence.highest_term,
            ))
        for agent in self.agents.values():
            agent.settle(math.inf)

    def _route(self, model: str) -> str | None:
        ready = [h for h in self.hosts if (r := self.agents[h].residencies.get(model)) and r.state == "ready"]
        return self.rng.choice(ready) if (self.served and ready) else None

    async def requests(self, n: int = 20) -> None:
        records = []
        for _ in range(n):
            model = self.rng.choice(self.models)
            host = self._route(model)
            records.append(RequestFeatures(
                endpoint="chat", requested_model=model,
                served_model=model if host else None, host_id=host,
                workload=self.rng.choice(["coding", "research", "general"]),
                input_units=self.rng.randint(10, 2000), output_units=self.rng.randint(10, 500),
                service_seconds=round(self.rng.uniform(0.1, 4.0), 3), queue_seconds=0.01,
                finished_at=self.clock.now(),
            ))
        records = tuple(records)
        await self.log.append(RequestBatch(event_id=self._eid("rb"), at=self.clock.now(), source="gw-1", records=records))

    async def tick(self, *, drift: bool = False) -> PlanCreated:
        """One controller pass: catch up, run the tick, append PlanCreated, then its commands
        (which the agents execute and ack at once).

        ``drift`` reproduces a recorder bug: more events are folded between building the input
        and reading the positions recorded as based_on.
        """
        await self.runner.catch_up(self.log)
        now = self.clock.now()
        tick = run_tick(self.runner.states, now, self.controls)
        pin, plan = tick.planner_input, tick.plan
        digest = inputs_digest(pin)
        if drift:
            self._advance(1.0)
            await self.heartbeats()
            await self.runner.catch_up(self.log)
        self.sequence += 1
        event = PlanCreated(
            event_id=self._eid("plan"), at=now, planner_version=plan.planner_version,
            generation=make_generation(EPOCH, self.sequence, digest), epoch=EPOCH, sequence=self.sequence,
            inputs_digest=digest, based_on=dict(sorted(self.runner.positions.items())), now=now,
            controller_id=CONTROLLER_ID, controller_term=1, plan=msgspec.Raw(encode_plan(plan)),
            policy=encode_policy(self.policy) if self.record_policy else msgspec.Raw(b"null"),
        )
        await self.log.append(event, expected_last_subject_seq=await self.log.last_subject_sequence(PLAN_SUBJECT))
        self.plans.append(event)
        issuer = Issuer(controller_id=CONTROLLER_ID, controller_term=1, generation=event.generation)
        for ev in decision_events(tick.result, issuer, at=now, lease_remaining=LEASE_SECONDS):
            await self.log.append(ev)
            if isinstance(ev, CommandWithdrawn):
                self.agents[ev.host_id].withdraw(ev.action_id)
            else:
                await self._execute(ev, now)
        return event

    async def _execute(self, cmd: CommandIssued, now: float) -> None:
        for status, message in self.agents[cmd.host_id].execute(cmd, now, lease_remaining=LEASE_SECONDS):
            await self.log.append(ActionAck(
                event_id=self._eid("ack"), at=now, host_id=cmd.host_id, action_id=cmd.action_id, status=status,  # type: ignore[arg-type]
                message=message, kind=cmd.kind, model_id=cmd.model_id, generation=cmd.generation,
                controller_term=cmd.controller_term))

    async def run(self, rounds: int = 6) -> list[PlanCreated]:
        """A scripted session: heartbeats every 10 s, requests, a plan every round, a few changes."""
        await self.setup()
        for r in range(rounds):
            await self.heartbeats()
            self._advance(10.0)
            await self.requests()
            if r == 2:
                await self.set_profile(self.models[-1], min_replicas=2, memory_mb=3000)
            if r == 3:
                self.pause(self.hosts[0])
            if r == 4:
                self.pause(self.hosts[0], paused=False)
            await self.heartbeats()
            self._advance(10.0)
            await self.tick()
            self._advance(5.0)
        return self.plans
