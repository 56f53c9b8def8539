"""A recorded session for replay tests: real events on a real log, plans recorded the controller's way.

Agents are modelled at the event level (they follow each plan: a new placement is commanded,
reported as loading, then ready; a managed residency no longer planned drains, then
disappears), and the
controller tick is the controller's own composition (grid.controller.tick.compose_tick) and
appends PlanCreated with based_on = the positions its runner had folded.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec

from grid.clock import Clock, SimulatedClock
from grid.controller.tick import PROJECTIONS, compose_tick, encode_policy
from grid.events.commands import CommandIssued
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.events.host import HostHeartbeat, HostRegistered, HostResources, Residency
from grid.events.log import EventLog
from grid.events.plan import PlanCreated, make_generation
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import PLAN_SUBJECT
from grid.fleet.planning import Policy, encode_plan
from grid.planner.digest import inputs_digest
from grid.projections.runner import ProjectionRunner


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
        self.residencies: dict[str, dict[str, str]] = {h: {} for h in self.hosts}
        self.paused: set[str] = set()
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

    async def heartbeats(self) -> None:
        for h in self.hosts:
            res = tuple(
                Residency(model_id=m, memory_mb=2000, state=state, loaded_age_seconds=30.0,
                          last_used_age_seconds=5.0, endpoint=f"http://127.0.0.1:9{self.hosts.index(h):03d}")
                for m, state in sorted(self.residencies[h].items())
            )
            await self.log.append(HostHeartbeat(
                event_id=self._eid("hb"), at=self.clock.now(), host_id=h, resources=self._resources(h),
                state="paused" if h in self.paused else "accepting", residencies=res,
                disk_free_bytes=100 << 30, disk_total_bytes=200 << 30,
            ))
        # The agents converge one step per heartbeat round.
        for h in self.hosts:
            for m, state in list(self.residencies[h].items()):
                if state == "loading":
                    self.residencies[h][m] = "ready"
                elif state == "draining":
                    del self.residencies[h][m]

    def _route(self, model: str) -> str | None:
        ready = [h for h in self.hosts if self.residencies[h].get(model) == "ready"]
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
        """One controller pass: catch up, build the input, plan, append PlanCreated.

        ``drift`` reproduces a recorder bug: more events are folded between building the input
        and reading the positions recorded as based_on.
        """
        await self.runner.catch_up(self.log)
        now = self.clock.now()
        tick = compose_tick(self.runner.states, now, self.policy)
        pin, plan = tick.planner_input, tick.plan
        digest = inputs_digest(pin)
        if drift:
            self._advance(1.0)
            await self.heartbeats()
            await self.runner.catch_up(self.log)
        self.sequence += 1
        event = PlanCreated(
            event_id=self._eid("plan"), at=now, planner_version=plan.planner_version,
            generation=make_generation("epoch-1", self.sequence, digest), epoch="epoch-1", sequence=self.sequence,
            inputs_digest=digest, based_on=dict(sorted(self.runner.positions.items())), now=now,
            controller_id="controller-1", controller_term=1, plan=msgspec.Raw(encode_plan(plan)),
            policy=encode_policy(self.policy) if self.record_policy else msgspec.Raw(b"null"),
        )
        await self.log.append(event, expected_last_subject_seq=await self.log.last_subject_sequence(PLAN_SUBJECT))
        self.plans.append(event)
        # Agents act on the plan.
        wanted = {(p.host_id, p.model_id) for p in plan.placements}
        for p in plan.placements:
            if p.model_id not in self.residencies[p.host_id]:
                self.residencies[p.host_id][p.model_id] = "loading"
                # The controller's command: a residency nobody commanded is no replica.
                await self.log.append(CommandIssued(
                    event_id=self._eid("cmd"), at=now, action_id=self._eid("load"), kind="load", host_id=p.host_id,
                    model_id=p.model_id, memory_mb=p.memory_mb, generation=event.generation, controller_term=1,
                    controller_id="controller-1", lease_expires_at=now + 30.0, lease_ttl_seconds=30.0))
        for h in self.hosts:
            for m, state in list(self.residencies[h].items()):
                if (h, m) not in wanted and state in ("ready", "loading"):
                    self.residencies[h][m] = "draining"
        return event

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
                self.paused.add(self.hosts[0])
            if r == 4:
                self.paused.discard(self.hosts[0])
            await self.heartbeats()
            self._advance(10.0)
            await self.tick()
            self._advance(5.0)
        return self.plans
