"""A simulated host agent without an engine (pure): the real agent's admission chain
(grid.agent.fencing) in front of the lifecycle transitions, applied to an in-memory inventory.

The controller integration tests drive it over a real log (tests/integration/controller/simhost.py)
and the stateful reconciler test drives it directly, delivering its acks and heartbeats late,
twice or never. It has no clock: `now` is always the caller's. (The lab's machines,
grid.sim.world, keep their own executor: they model transfer and start-up time and incidents.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grid.agent import fencing
from grid.events.commands import CommandIssued

# (ack status, message), in the order the agent would append them.
Ack = tuple[str, str]

SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
# Failure messages (the agent's own words for them).
FETCH_FAILED = "fetch_failed"
NOT_CACHED = "not_cached"
INSUFFICIENT_MEMORY = "insufficient_memory"
REQUESTS_IN_FLIGHT = "requests_in_flight"


@dataclass(slots=True)
class SimResidency:
    state: str
    memory_mb: int
    loaded_at: float
    sha: str | None = None
    runtime: str = "llama.cpp"
    active_requests: int = 0
    # False: an engine the host runs itself (Grid must never actuate it).
    managed: bool = True


@dataclass(slots=True)
class SimAgent:
    host_id: str
    capacity_mb: int = 16_000
    # The host's protection state (admission is refused outside the admitting states).
    state: str = "accepting"
    residencies: dict[str, SimResidency] = field(default_factory=dict)
    # Model id -> artifact sha256 of the weights on disk.
    cached: dict[str, str | None] = field(default_factory=dict)
    fence: fencing.Authority = field(default_factory=fencing.Authority)
    # Action id -> terminal status (the agent's receipts: dependencies are judged on them).
    receipts: dict[str, str] = field(default_factory=dict)
    withdrawn: set[str] = field(default_factory=set)
    executed: list[CommandIssued] = field(default_factory=list)
    refused: list[tuple[CommandIssued, str]] = field(default_factory=list)

    def used_mb(self) -> int:
        return sum(r.memory_mb for r in self.residencies.values() if r.state != "cached")

    def withdraw(self, action_id: str) -> None:
        self.withdrawn.add(action_id)

    def execute(self, cmd: CommandIssued, now: float, *, lease_remaining: float, fail: bool = False) -> tuple[Ack, ...]:
        """The acks for `cmd` (none for a redelivery of a finished action). `fail` injects a
        failure of the transition itself (a fetch or an engine start that did not work)."""
        if cmd.action_id in self.receipts:
            return ()
        if cmd.action_id in self.withdrawn:
            self.receipts[cmd.action_id] = CANCELLED
            return ((CANCELLED, "withdrawn"),)
        verdict = fencing.check_command(
            cmd, host_id=self.host_id, authority=self.fence, lease_remaining_seconds=lease_remaining,
            dependency_status=self.receipts, protection_state=self.state,
        )
        if not verdict.ok:
            self.refused.append((cmd, verdict.reason))
            self.receipts[cmd.action_id] = verdict.status
            return ((verdict.status, verdict.message),)
        self.fence = fencing.advance_authority(self.fence, cmd)
        self.executed.append(cmd)
        status, message = self._transition(cmd, now, fail)
        self.receipts[cmd.action_id] = status
        return (("accepted", "started"), (status, message))

    def _transition(self, cmd: CommandIssued, now: float, fail: bool) -> Ack:
        m = cmd.model_id
        r = self.residencies.get(m)
        if cmd.kind == "load":
            if fail:
                return FAILED, FETCH_FAILED
            self.cached[m] = cmd.artifact_sha256
            return SUCCEEDED, "ok"
        if cmd.kind == "warm":
            if fail or m not in self.cached:
                return FAILED, NOT_CACHED
            if self.used_mb() + cmd.memory_mb > self.capacity_mb:
                return FAILED, INSUFFICIENT_MEMORY
            if r is None or r.state in ("cached", "failed"):
                self.residencies[m] = SimResidency("ready", cmd.memory_mb, now, sha=cmd.artifact_sha256,
                                                   runtime=cmd.runtime)
            return SUCCEEDED, "ok"
        if cmd.kind == "drain":
            if r is not None and r.state in ("ready", "failed"):
                r.state = "draining"
            return SUCCEEDED, "ok"
        # unload: only a drained, idle engine stops (fail safe with requests in flight)
        if r is not None and r.state == "draining":
            if r.active_requests > 0:
                return FAILED, REQUESTS_IN_FLIGHT
            del self.residencies[m]
        return SUCCEEDED, "ok"


__all__ = ["Ack", "SimAgent", "SimResidency"]
