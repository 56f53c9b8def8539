"""A simulated host for controller integration tests: real log, no engine.

It consumes its command subject in order, fences each command with the real agent's pure
admission chain (grid.agent.fencing), applies the lifecycle transition to an in-memory
inventory, appends "accepted" and terminal acks and a fresh heartbeat, like the real agent.
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
from grid.tasks import cancel_and_wait
from tests.heartbeats import heartbeat


class SimHost:
    def __init__(self, host_id: str, *, capacity_mb: int = 16_000, respond: bool = True) -> None:
        self.host_id = host_id
        self.capacity_mb = capacity_mb
        self.respond = respond
        self.residencies: dict[str, str] = {}
        self.memory: dict[str, int] = {}
        self.authority = fencing.Authority()
        self.executed: list[CommandIssued] = []
        self.refused: list[tuple[CommandIssued, str]] = []
        self.withdrawn: set[str] = set()
        self.receipts: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None

    def heartbeat_event(self) -> HostHeartbeat:
        return heartbeat(
            self.host_id,
            *(Residency(model_id=m, memory_mb=self.memory.get(m, 1000), state=s, loaded_age_seconds=10_000.0,  # type: ignore[arg-type]
                        last_used_age_seconds=10_000.0)
              for m, s in sorted(self.residencies.items())),
            capacity_mb=self.capacity_mb, highest_term=self.authority.highest_term,
        )

    async def heartbeat(self, log: EventLog) -> None:
        await log.append(self.heartbeat_event())

    async def _ack(self, log: EventLog, cmd: CommandIssued, status: str, message: str = "") -> None:
        await log.append(ActionAck(
            event_id=f"{cmd.action_id}-{status}", at=time.time(), host_id=self.host_id, action_id=cmd.action_id,
            status=status, message=message, duration_seconds=0.01, kind=cmd.kind, model_id=cmd.model_id,  # type: ignore[arg-type]
            generation=cmd.generation, controller_term=cmd.controller_term,
        ))

    def check(self, cmd: CommandIssued, received_mono: float) -> fencing.Verdict:
        return fencing.check_command(
            cmd, host_id=self.host_id, authority=self.authority,
            lease_remaining_seconds=fencing.lease_remaining(cmd.lease_ttl_seconds, received_mono=received_mono,
                                                            now_mono=time.monotonic()),
            dependency_status=self.receipts, protection_state="accepting",
        )

    async def handle(self, log: EventLog, cmd: CommandIssued, received_mono: float) -> None:
        if cmd.action_id in self.receipts:
            return  # redelivery of a finished action
        if cmd.action_id in self.withdrawn:
            self.receipts[cmd.action_id] = "cancelled"
            await self._ack(log, cmd, "cancelled", "withdrawn")
            return
        verdict = self.check(cmd, received_mono)
        if not verdict.ok:
            self.refused.append((cmd, verdict.reason))
            self.receipts[cmd.action_id] = verdict.status
            await self._ack(log, cmd, verdict.status, verdict.message)
            return
        self.authority = fencing.advance_authority(self.authority, cmd)
        self.executed.append(cmd)
        await self._ack(log, cmd, "accepted", "started")
        m = cmd.model_id
        if cmd.kind == "load":
            self.residencies[m] = "cached"
        elif cmd.kind == "warm":
            self.residencies[m] = "ready"
            self.memory[m] = cmd.memory_mb
        elif cmd.kind == "drain":
            self.residencies[m] = "draining"
        elif cmd.kind == "unload":
            self.residencies[m] = "cached"
        self.receipts[cmd.action_id] = "succeeded"
        await self._ack(log, cmd, "succeeded", "ok")
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
                    self.withdrawn.add(ev.action_id)
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
