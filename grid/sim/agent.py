"""The one simulated host agent, without an engine (pure): the real agent's admission chain
(grid.agent.fencing) in front of the lifecycle transitions, applied to an in-memory inventory.

The controller integration tests drive it over a real log (tests/integration/controller/simhost.py)
and the stateful reconciler test drives it directly (`execute`), delivering its acks and
heartbeats late, twice or never; its transitions then take no time. The lab's machines
(grid.sim.world) give it a `Timing` and start queued commands themselves (`start`): a warm is
`warming` and an unload `unloading` until `settle` reaches the time the step ends. It has no
clock: `now` is always the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grid.agent import fencing
from grid.events.commands import PREDICTIVE_PREFETCH, CommandIssued
from grid.fleet import HOLDS_MEMORY_STATES

# (ack status, message), in the order the agent would append them.
Ack = tuple[str, str]

ACCEPTED = "accepted"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
# Failure messages (the agent's own words for them).
FETCH_FAILED = "fetch_failed"
DISK_FULL = "disk_full"
NOT_CACHED = "not_cached"
RESIDENCY_BUSY = "residency_busy"
INSUFFICIENT_MEMORY = "insufficient_memory"
NOT_DRAINING = "not_draining"
REQUESTS_IN_FLIGHT = "requests_in_flight"
ALREADY_READY = "already_ready"
# An evict refused: the entry is not an unused predictive download of exactly that SHA.
NOT_EVICTABLE = "not_evictable"


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds each step takes. A fetch and an engine start depend on the model and the machine:
    a caller that knows them passes them with the command (`start`); `fetch` and `warm` are
    for the callers that do not."""

    fetch: float = 0.0
    warm: float = 0.0
    verify: float = 0.0
    drain: float = 0.0
    unload: float = 0.0
    # A step that ends at once: a failure found before any work, or nothing to do.
    brief: float = 0.0


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
    max_concurrency: int = 1
    last_used_at: float = 0.0
    # When a timed step in progress (warming, unloading) ends.
    settles_at: float | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One started command: its terminal outcome and how long the host was busy with it."""

    status: str
    message: str
    seconds: float = 0.0
    # The artifact was transferred (not only verified on disk).
    fetched: bool = False
    # False: the command never started (withdrawn before it could), so nothing was accepted.
    started: bool = True

    @property
    def acks(self) -> tuple[Ack, ...]:
        terminal = (self.status, self.message)
        return ((ACCEPTED, "started"), terminal) if self.started else (terminal,)


@dataclass(slots=True)
class SimAgent:
    host_id: str
    capacity_mb: int = 16_000
    # The host's protection state (admission is refused outside the admitting states).
    state: str = "accepting"
    residencies: dict[str, SimResidency] = field(default_factory=dict)
    # Model id -> artifact MB of the weights on disk.
    cached: dict[str, int] = field(default_factory=dict)
    # Model id -> when its artifact entered the cache (entries from before the day have none).
    cached_at: dict[str, float] = field(default_factory=dict)
    # Model ids downloaded by a predictive prefetch and never warmed since (provenance: only
    # these may be evicted).
    # Model id -> the SHA it was fetched as.
    predictive: dict[str, str] = field(default_factory=dict)
    # Disk for artifacts in MB (None: unbounded).
    disk_mb: int | None = None
    # None: every transition is instantaneous.
    timing: Timing | None = None
    fence: fencing.CommandFence = field(default_factory=fencing.CommandFence)
    # Action id -> terminal status (the agent's receipts: dependencies are judged on them).
    receipts: dict[str, str] = field(default_factory=dict)
    withdrawn: set[str] = field(default_factory=set)
    executed: list[CommandIssued] = field(default_factory=list)
    refused: list[tuple[CommandIssued, str]] = field(default_factory=list)

    def used_mb(self) -> int:
        return sum(r.memory_mb for r in self.residencies.values() if r.state in HOLDS_MEMORY_STATES)

    def disk_used_mb(self) -> int:
        return sum(self.cached.values())

    def withdraw(self, action_id: str) -> None:
        self.withdrawn.add(action_id)

    def execute(self, cmd: CommandIssued, now: float, *, lease_remaining: float, fail: bool = False) -> tuple[Ack, ...]:
        """The acks for `cmd` (none for a redelivery of a finished action), after the admission
        chain. `fail` injects a failure of the transition itself (a fetch or an engine start
        that did not work)."""
        if cmd.action_id in self.receipts:
            return ()
        if cmd.action_id not in self.withdrawn:
            verdict = fencing.check_command(
                cmd, host_id=self.host_id, fence=self.fence, lease_remaining_seconds=lease_remaining,
                dependency_status=self.receipts, protection_state=self.state,
            )
            if not verdict.ok:
                self.refused.append((cmd, verdict.reason))
                self.receipts[cmd.action_id] = verdict.status
                return ((verdict.status, verdict.message),)
            self.fence = fencing.advance_fence(self.fence, cmd)
        return self.start(cmd, now, fail=fail).acks

    def start(self, cmd: CommandIssued, at: float, *, fail: bool = False, fetch_seconds: float | None = None,
              warm_seconds: float | None = None, max_concurrency: int = 1) -> Step:
        """Run `cmd`'s transition from `at` (a withdrawn command is cancelled instead). With a
        `Timing`, `fetch_seconds` and `warm_seconds` are how long this model's transfer and
        engine start take here; `max_concurrency` is what its engine will report."""
        if cmd.action_id in self.withdrawn:
            step = Step(CANCELLED, "withdrawn", started=False)
        else:
            self.executed.append(cmd)
            t = self.timing or Timing()
            step = self._transition(cmd, at, t, fail, t.fetch if fetch_seconds is None else fetch_seconds,
                                    t.warm if warm_seconds is None else warm_seconds, max_concurrency)
        self.receipts[cmd.action_id] = step.status
        return step

    def _evict(self, cmd: CommandIssued, t: Timing) -> Step:
        """Delete an unused predictive download of exactly the named SHA; anything else stays."""
        m = cmd.model_id
        if m not in self.cached:
            return Step(SUCCEEDED, "ok", t.brief)
        r = self.residencies.get(m)
        sha = (cmd.artifact_sha256 or "").lower()
        if not sha or self.predictive.get(m) != sha or r is not None:
            return Step(FAILED, NOT_EVICTABLE, t.brief)
        del self.cached[m]
        self.cached_at.pop(m, None)
        del self.predictive[m]
        return Step(SUCCEEDED, "ok", t.brief)

    def settle(self, until: float) -> None:
        """End the timed steps due by `until`: a warming engine is ready, an unloading one gone."""
        for model_id in sorted(self.residencies):
            r = self.residencies[model_id]
            if r.settles_at is None or r.settles_at > until:
                continue
            if r.state == "warming":
                r.state = "ready"
                r.loaded_at = r.last_used_at = r.settles_at
            elif r.state == "unloading":
                del self.residencies[model_id]
                continue
            r.settles_at = None

    def stop_engines(self) -> None:
        """Every engine dies with the machine (an outage)."""
        self.residencies.clear()

    def _transition(self, cmd: CommandIssued, at: float, t: Timing, fail: bool, fetch_seconds: float,
                    warm_seconds: float, max_concurrency: int) -> Step:
        m = cmd.model_id
        r = self.residencies.get(m)
        if cmd.kind == "load":
            if fail:
                return Step(FAILED, FETCH_FAILED, t.brief)
            if m in self.cached:
                return Step(SUCCEEDED, "ok", t.verify)
            size = int(cmd.artifact_size_mb or 0)
            if self.disk_mb is not None and size > self.disk_mb - self.disk_used_mb():
                return Step(FAILED, DISK_FULL, t.brief)
            self.cached[m] = size
            self.cached_at[m] = at + fetch_seconds
            if cmd.reason == PREDICTIVE_PREFETCH:
                self.predictive[m] = (cmd.artifact_sha256 or "").lower()
            return Step(SUCCEEDED, "ok", fetch_seconds, fetched=True)
        if cmd.kind == "warm":
            if r is not None and r.state == "ready":
                return Step(SUCCEEDED, ALREADY_READY, t.brief)
            if r is not None and r.state in HOLDS_MEMORY_STATES and r.state != "failed":
                return Step(FAILED, RESIDENCY_BUSY, t.brief)
            if fail or m not in self.cached:
                return Step(FAILED, NOT_CACHED, t.brief)
            if self.used_mb() + cmd.memory_mb > self.capacity_mb:
                return Step(FAILED, INSUFFICIENT_MEMORY, t.brief)
            timed = self.timing is not None
            # Warmed: a predictive download is used now and no longer evictable.
            self.predictive.pop(m, None)
            self.residencies[m] = SimResidency(
                "warming" if timed else "ready", cmd.memory_mb, at, sha=cmd.artifact_sha256, runtime=cmd.runtime,
                max_concurrency=max_concurrency, last_used_at=at, settles_at=at + warm_seconds if timed else None)
            return Step(SUCCEEDED, "ok", warm_seconds)
        if cmd.kind == "evict":
            return self._evict(cmd, t)
        if cmd.kind == "drain":
            if r is not None and r.state in ("ready", "failed", "warming"):
                r.state = "draining"
            return Step(SUCCEEDED, "ok", t.drain)
        # unload: only a drained, idle engine stops (fail safe with requests in flight)
        if r is None:
            return Step(SUCCEEDED, "ok", t.brief)
        if r.state != "draining":
            return Step(FAILED, NOT_DRAINING, t.brief)
        if r.active_requests > 0:
            return Step(FAILED, REQUESTS_IN_FLIGHT, t.brief)
        if self.timing is None:
            del self.residencies[m]
        else:
            r.state = "unloading"
            r.settles_at = at + t.unload
        return Step(SUCCEEDED, "ok", t.unload)


__all__ = ["Ack", "SimAgent", "SimResidency", "Step", "Timing"]
