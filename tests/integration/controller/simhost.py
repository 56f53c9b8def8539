"""A simulated host for controller integration tests: real log, no engine.

It consumes its command subject in order and hands each command to the one simulated agent
(grid.sim.agent.SimAgent: the real agent's admission chain, then the lifecycle transition on an
in-memory inventory), appending its "accepted" and terminal acks and a fresh heartbeat, like the
real agent.
"""

from __future__ import annotations

import asyncio
import time

from grid.agent import fencing
from grid.events import codec
from grid.events.acks import ActionAck
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.host import HostHeartbeat, Residency
from grid.events.log import EventLog
from grid.events.subjects import COMMANDS_STREAM, command_subject
from grid.sim.agent import SimAgent
from grid.tasks import cancel_and_wait
from tests.heartbeats import heartbeat


class SimHost:
    """grid.sim.agent.SimAgent on a real log: commands from its subject, acks and heartbeats back."""

    def __init__(self, host_id: str, *, capacity_mb: int = 16_000, respond: bool = True) -> None:
        self.host_id = host_id
        self.agent = SimAgent(host_id, capacity_mb=capacity_mb)
        self.respond = respond
        self._task: asyncio.Task[None] | None = None

    @property
    def residencies(self) -> dict[str, str]:
        """Model id -> state as the heartbeat reports it (weights on disk without an engine: cached)."""
        out = {m: "cached" for m in self.agent.cached}
        out.update({m: r.state for m, r in self.agent.residencies.items()})
        return dict(sorted(out.items()))

    @property
    def executed(self) -> list[CommandIssued]:
        return self.agent.executed

    def heartbeat_event(self) -> HostHeartbeat:
        # Every engine is reported long loaded and idle: minimum residency and scale-down
        # cooldowns never hold these tests back.
        engines = self.agent.residencies
        return heartbeat(
            self.host_id,
            *(Residency(model_id=m, memory_mb=engines[m].memory_mb if m in engines else 1000, state=s,  # type: ignore[arg-type]
                        loaded_age_seconds=10_000.0, last_used_age_seconds=10_000.0)
              for m, s in self.residencies.items()),
            capacity_mb=self.agent.capacity_mb, highest_term=self.agent.fence.highest_term,
        )

    async def heartbeat(self, log: EventLog) -> None:
        await log.append(self.heartbeat_event())

    async def handle(self, log: EventLog, cmd: CommandIssued, received_mono: float) -> None:
        remaining = fencing.lease_remaining(cmd.lease_ttl_seconds, received_mono=received_mono,
                                            now_mono=time.monotonic())
        acks = self.agent.execute(cmd, time.time(), lease_remaining=remaining)
        for status, message in acks:
            await log.append(ActionAck(
                event_id=f"{cmd.action_id}-{status}", at=time.time(), host_id=self.host_id, action_id=cmd.action_id,
                status=status, message=message, duration_seconds=0.01, kind=cmd.kind, model_id=cmd.model_id,  # type: ignore[arg-type]
                generation=cmd.generation, controller_term=cmd.controller_term,
            ))
        if acks and acks[0][0] == "accepted":  # the transition ran: report it at once, like the agent
            await self.heartbeat(log)

    async def run(self, log: EventLog) -> None:
        sub = await log.subscribe(COMMANDS_STREAM, start_seq=1, subject_filter=command_subject(self.host_id))
        try:
            while True:
                msg = await sub.next(timeout=None)
                if msg is None:
                    return
                ev = codec.decode(msg.data)
                if isinstance(ev, CommandWithdrawn):
                    self.agent.withdraw(ev.action_id)
                elif isinstance(ev, CommandIssued) and self.respond:
                    await self.handle(log, ev, time.monotonic())
        finally:
            await sub.close()

    def start(self, log: EventLog) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(log))

    async def stop(self) -> None:
        await cancel_and_wait([self._task])


async def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError("condition not met in time")


async def commands_in_log(log: EventLog) -> list[CommandIssued]:
    out = []
    async for msg in log.replay(COMMANDS_STREAM):
        ev = codec.decode(msg.data)
        if isinstance(ev, CommandIssued):
            out.append(ev)
    return out
