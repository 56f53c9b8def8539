"""The physical side of the lab: machines that execute lifecycle commands with modelled timing.

Each machine is a simulated agent (grid.sim.agent.SimAgent) with a `Timing`, running one
command at a time in arrival order, like the agent: load fetches or verifies the artifact (no
memory), warm starts the engine (memory from the start, ready after its warm time), drain stops
new routing, unload releases memory once the residency is draining and idle. Every step emits
the acks the agent would, stamped with the simulated time it finished; heartbeats report the
level state. An outage kills every engine and loses the queue (the agent fails those commands
when it comes back); a throttle lowers the machine's share. The lab has one controller that
never loses its lease, so its machines start commands without the admission chain: a command
whose dependency failed fails on its own terms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from grid.events.acks import ActionAck
from grid.events.base import Event
from grid.events.commands import PREDICTIVE_PREFETCH, CommandIssued
from grid.events.control import ModelProfile
from grid.events.host import CachedArtifact, HostHeartbeat, HostLoad, Residency
from grid.events.subjects import HOSTS_STREAM
from msgspec import UNSET

from grid.sim.agent import ACCEPTED, FAILED, INSUFFICIENT_MEMORY, NOT_DRAINING, SUCCEEDED, SimAgent, Timing
from grid.sim.fleet import MachineSpec

Emit = Callable[[float, str, Event], None]

# Verifying an artifact on disk, stopping new routing, stopping an engine; a refused or empty
# step ends after BRIEF.
TIMING = Timing(verify=3.0, drain=1.0, unload=2.0, brief=1.0)
# Transfer seconds on a 200 MB/s link equal the profile's load_seconds; other links scale.
REFERENCE_BANDWIDTH = 200.0

# Problems the world observed with a command it was given (safety evidence for the report).
WARM_WITHOUT_MEMORY = "warm_without_free_memory"
UNLOAD_NOT_DRAINED = "unload_not_drained"
# The agent's failure message -> the problem it is evidence of.
_PROBLEMS = {("warm", INSUFFICIENT_MEMORY): WARM_WITHOUT_MEMORY, ("unload", NOT_DRAINING): UNLOAD_NOT_DRAINED}
AGENT_RESTARTED = "agent_restarted"


@dataclass(slots=True)
class PrefetchScore:
    """What predictive prefetch did on the machines: what was downloaded, what a later placement
    actually used (the load phase it skipped), and what expired unused."""

    downloads: int = 0
    download_mb: int = 0
    hits: int = 0
    # Seconds from a prefetch finishing to the warm that used it, per hit.
    lead_seconds: list[float] = field(default_factory=list)
    # Transfer seconds the hits did not spend (the fetch the placement would have waited for).
    avoided_load_seconds: float = 0.0
    expired: int = 0
    reclaimed_mb: int = 0


@dataclass(slots=True)
class Machine:
    spec: MachineSpec
    agent: SimAgent
    up: bool = True
    queue: list[CommandIssued] = field(default_factory=list)
    busy_until: float = 0.0
    heartbeats: int = 0

    def used_mb(self) -> int:
        return self.agent.used_mb()

    def disk_used_mb(self) -> int:
        return self.agent.disk_used_mb()


class World:
    def __init__(self, machines: tuple[MachineSpec, ...], profiles: dict[str, ModelProfile], start: float) -> None:
        self.profiles = profiles
        self.machines: dict[str, Machine] = {}
        for spec in machines:
            agent = SimAgent(spec.host_id, capacity_mb=spec.memory_mb, disk_mb=spec.disk_gb * 1024, timing=TIMING)
            for model_id in spec.cached:
                p = profiles.get(model_id)
                if p is not None:
                    agent.cached[model_id] = int(p.artifact_size_mb or 0)
            self.machines[spec.host_id] = Machine(spec, agent)
        self.start = start
        self.problems: list[tuple[float, str, str, str]] = []
        self.cold_fetches = 0
        self.prefetch = PrefetchScore()
        self._ack_seq = 0

    # --- commands ---------------------------------------------------------------------------

    def deliver(self, cmd: CommandIssued) -> None:
        self.machines[cmd.host_id].queue.append(cmd)

    def withdraw(self, host_id: str, action_id: str) -> None:
        self.machines[host_id].agent.withdraw(action_id)

    def _ack(self, emit: Emit, at: float, m: Machine, cmd: CommandIssued, status: str, *,
             duration: float | None = None, message: str = "", fetched: bool = False) -> None:
        self._ack_seq += 1
        emit(at, HOSTS_STREAM, ActionAck(
            event_id=f"ack-{self._ack_seq}", at=at, host_id=m.spec.host_id, action_id=cmd.action_id,
            status=status, message=message, duration_seconds=duration, artifact_fetched=fetched,  # type: ignore[arg-type]
            kind=cmd.kind, model_id=cmd.model_id, generation=cmd.generation, controller_term=cmd.controller_term,
        ))

    def advance(self, until: float, emit: Emit) -> None:
        """Run every machine's queue up to `until`, emitting acks at the times they happen."""
        for host_id in sorted(self.machines):
            m = self.machines[host_id]
            while m.up and m.queue and m.busy_until < until:
                cmd = m.queue.pop(0)
                at = max(m.busy_until, cmd.created_at)
                m.busy_until = at + self._execute(m, cmd, at, emit)
        for m in self.machines.values():
            m.agent.settle(until)

    def _execute(self, m: Machine, cmd: CommandIssued, at: float, emit: Emit) -> float:
        """Start `cmd` at `at`; returns how long the machine is busy with it."""
        p = self.profiles.get(cmd.model_id)
        spec = m.spec
        agent = m.agent
        fetch_seconds = (p.load_seconds if p is not None else 60.0) * REFERENCE_BANDWIDTH / spec.bandwidth_mb_s
        # Before the step: a warm of a predictive download is a cache hit, an evict frees its size.
        hit_from = agent.cached_at.get(cmd.model_id) if (
            cmd.kind == "warm" and cmd.model_id in agent.predictive) else None
        evicting_mb = agent.cached.get(cmd.model_id, 0) if cmd.kind == "evict" else 0
        step = agent.start(
            cmd, at,
            fetch_seconds=fetch_seconds,
            warm_seconds=(p.warm_seconds if p is not None else 30.0) / spec.speed,
            max_concurrency=max(1, int((p.replica_concurrency if p else 1) * spec.concurrency_factor)),
        )
        if not step.started:
            self._ack(emit, at, m, cmd, step.status, message=step.message)
            return 0.0
        problem = _PROBLEMS.get((cmd.kind, step.message))
        if problem is not None:
            self.problems.append((at, spec.host_id, cmd.model_id, problem))
        self.cold_fetches += int(step.fetched)
        self._score_prefetch(m, cmd, at, step.status, step.fetched, fetch_seconds, hit_from, evicting_mb)
        self._ack(emit, at, m, cmd, ACCEPTED)
        self._ack(emit, at + step.seconds, m, cmd, step.status, duration=step.seconds, message=step.message,
                  fetched=step.fetched)
        return step.seconds

    def _score_prefetch(self, m: Machine, cmd: CommandIssued, at: float, status: str, fetched: bool,
                        fetch_seconds: float, hit_from: float | None, evicting_mb: int) -> None:
        sc = self.prefetch
        if status != SUCCEEDED:
            return
        if cmd.kind == "load" and fetched and cmd.reason == PREDICTIVE_PREFETCH:
            sc.downloads += 1
            sc.download_mb += int(cmd.artifact_size_mb or 0)
        elif cmd.kind == "warm" and hit_from is not None:
            sc.hits += 1
            sc.lead_seconds.append(max(0.0, at - hit_from))
            sc.avoided_load_seconds += fetch_seconds
        elif cmd.kind == "evict" and evicting_mb and cmd.model_id not in m.agent.cached:
            sc.expired += 1
            sc.reclaimed_mb += evicting_mb

    def unused_predictions(self) -> int:
        """Predictive downloads still on disk that nothing has warmed."""
        return sum(len(m.agent.predictive) for m in self.machines.values())

    # --- incidents --------------------------------------------------------------------------

    def set_incident(self, host_id: str, kind: str | None, at: float, emit: Emit) -> None:
        m = self.machines[host_id]
        if kind == "node_outage":
            if m.up:
                m.up = False
                m.agent.stop_engines()
            return
        if not m.up:
            # Back from the outage: the agent fails what it had queued and starts clean.
            m.up = True
            m.busy_until = at
            for cmd in m.queue:
                self._ack(emit, at, m, cmd, FAILED, duration=0.0, message=AGENT_RESTARTED)
            m.queue.clear()
        m.agent.state = "throttled" if kind == "thermal_throttle" else "accepting"

    # --- observation ------------------------------------------------------------------------

    def heartbeat(self, host_id: str, at: float) -> HostHeartbeat | None:
        m = self.machines[host_id]
        if not m.up:
            return None
        m.heartbeats += 1
        spec = m.spec
        engines = m.agent.residencies
        residencies = tuple(
            Residency(
                model_id=model_id, memory_mb=e.memory_mb, state=e.state,  # type: ignore[arg-type]
                runtime=e.runtime, artifact_sha256=e.sha, loaded_age_seconds=max(0.0, at - e.loaded_at),
                last_used_age_seconds=max(0.0, at - e.last_used_at), active_requests=0,
                max_concurrency=e.max_concurrency, endpoint=f"http://{host_id}.sim:{8100 + i}",
            )
            for i, (model_id, e) in enumerate(sorted(engines.items()))
        )
        agent = m.agent
        cached = tuple(
            CachedArtifact(
                model_id=mid, sha256=self.profiles[mid].artifact_sha256 or "", size_bytes=size << 20,
                predictive=mid in agent.predictive,
                cached_age_seconds=max(0.0, at - agent.cached_at[mid]) if mid in agent.cached_at else UNSET,
            )
            for mid, size in sorted(agent.cached.items()) if mid in self.profiles
        )
        total = spec.disk_gb << 30
        return HostHeartbeat(
            event_id=f"hb-{host_id}-{m.heartbeats}", at=at, host_id=host_id, state=m.agent.state,  # type: ignore[arg-type]
            resources=spec.resources(), residencies=residencies, cached=cached,
            disk_total_bytes=total, disk_free_bytes=max(0, total - (m.disk_used_mb() << 20)),
            load=HostLoad(), highest_term=1,
        )

    def touch(self, host_id: str, model_id: str, at: float) -> None:
        e = self.machines[host_id].agent.residencies.get(model_id)
        if e is not None:
            e.last_used_at = max(e.last_used_at, at)
