"""The physical side of the lab: machines that execute lifecycle commands with modelled timing.

Each machine runs one command at a time in arrival order, like the agent: load fetches or
verifies the artifact (no memory), warm starts the engine (memory from the start, ready after
its warm time), drain stops new routing, unload releases memory once the residency is draining
and idle. Every step emits the acks the agent would, stamped with the simulated time it
finished; heartbeats report the level state. An outage kills every engine and loses the queue
(the agent fails those commands when it comes back); a throttle lowers the machine's share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from grid.events.acks import ActionAck
from grid.events.base import Event
from grid.events.commands import CommandIssued
from grid.events.control import ModelProfile
from grid.events.host import CachedArtifact, HostHeartbeat, HostLoad, Residency
from grid.events.subjects import HOSTS_STREAM
from grid.fleet import HOLDS_MEMORY_STATES
from grid.sim.fleet import MachineSpec

Emit = Callable[[float, str, Event], None]

VERIFY_SECONDS = 3.0
DRAIN_SECONDS = 1.0
UNLOAD_SECONDS = 2.0
# Transfer seconds on a 200 MB/s link equal the profile's load_seconds; other links scale.
REFERENCE_BANDWIDTH = 200.0

# Problems the world observed with a command it was given (safety evidence for the report).
WARM_WITHOUT_MEMORY = "warm_without_free_memory"
UNLOAD_NOT_DRAINED = "unload_not_drained"


@dataclass(slots=True)
class Engine:
    model_id: str
    memory_mb: int
    state: str
    sha: str | None
    max_concurrency: int
    started_at: float
    last_used_at: float
    runtime: str = "llama.cpp"


@dataclass(slots=True)
class Machine:
    spec: MachineSpec
    state: str = "accepting"
    up: bool = True
    engines: dict[str, Engine] = field(default_factory=dict)
    cached: dict[str, int] = field(default_factory=dict)  # model id -> artifact MB
    queue: list[CommandIssued] = field(default_factory=list)
    withdrawn: set[str] = field(default_factory=set)
    busy_until: float = 0.0
    heartbeats: int = 0

    def used_mb(self) -> int:
        return sum(e.memory_mb for e in self.engines.values() if e.state in HOLDS_MEMORY_STATES)

    def disk_used_mb(self) -> int:
        return sum(self.cached.values())


class World:
    def __init__(self, machines: tuple[MachineSpec, ...], profiles: dict[str, ModelProfile], start: float) -> None:
        self.profiles = profiles
        self.machines: dict[str, Machine] = {}
        for spec in machines:
            m = Machine(spec)
            for model_id in spec.cached:
                p = profiles.get(model_id)
                if p is not None:
                    m.cached[model_id] = int(p.artifact_size_mb or 0)
            self.machines[spec.host_id] = m
        self.start = start
        self.problems: list[tuple[float, str, str, str]] = []
        self.cold_fetches = 0
        self._ack_seq = 0
        # (time, machine, action) steps whose effect lands later: warm -> ready, unload -> gone.
        self._pending: list[tuple[float, str, str, str]] = []

    # --- commands ---------------------------------------------------------------------------

    def deliver(self, cmd: CommandIssued) -> None:
        self.machines[cmd.host_id].queue.append(cmd)

    def withdraw(self, host_id: str, action_id: str) -> None:
        self.machines[host_id].withdrawn.add(action_id)

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
        self._settle(until)

    def _settle(self, until: float) -> None:
        keep = []
        for at, host_id, model_id, step in sorted(self._pending):
            if at > until:
                keep.append((at, host_id, model_id, step))
                continue
            m = self.machines[host_id]
            e = m.engines.get(model_id)
            if e is None:
                continue
            if step == "ready" and e.state == "warming":
                e.state = "ready"
                e.started_at = at
                e.last_used_at = at
            elif step == "gone" and e.state == "unloading":
                del m.engines[model_id]
        self._pending = keep

    def _execute(self, m: Machine, cmd: CommandIssued, at: float, emit: Emit) -> float:
        """Start `cmd` at `at`; returns how long the machine is busy with it."""
        if cmd.action_id in m.withdrawn:
            self._ack(emit, at, m, cmd, "cancelled", message="withdrawn before start")
            return 0.0
        self._ack(emit, at, m, cmd, "accepted")
        p = self.profiles.get(cmd.model_id)
        e = m.engines.get(cmd.model_id)
        host = m.spec.host_id
        if cmd.kind == "load":
            if cmd.model_id in m.cached:
                self._ack(emit, at + VERIFY_SECONDS, m, cmd, "succeeded", duration=VERIFY_SECONDS)
                return VERIFY_SECONDS
            size = int(cmd.artifact_size_mb or (p.artifact_size_mb if p else 0) or 0)
            free_mb = m.spec.disk_gb * 1024 - m.disk_used_mb()
            if size > free_mb:
                self._ack(emit, at + 1.0, m, cmd, "failed", duration=1.0, message="disk_full")
                return 1.0
            base = p.load_seconds if p is not None else 60.0
            took = base * REFERENCE_BANDWIDTH / m.spec.bandwidth_mb_s
            m.cached[cmd.model_id] = size
            self.cold_fetches += 1
            self._ack(emit, at + took, m, cmd, "succeeded", duration=took, fetched=True)
            return took
        if cmd.kind == "warm":
            free = m.spec.memory_mb - m.used_mb()
            if cmd.model_id not in m.cached or (e is not None and e.state in HOLDS_MEMORY_STATES):
                self._ack(emit, at + 1.0, m, cmd, "failed", duration=1.0, message="not_cached_or_running")
                return 1.0
            if cmd.memory_mb > free:
                self.problems.append((at, host, cmd.model_id, WARM_WITHOUT_MEMORY))
                self._ack(emit, at + 1.0, m, cmd, "failed", duration=1.0, message="insufficient_memory")
                return 1.0
            took = (p.warm_seconds if p is not None else 30.0) / m.spec.speed
            conc = max(1, int((p.replica_concurrency if p else 1) * m.spec.concurrency_factor))
            m.engines[cmd.model_id] = Engine(cmd.model_id, cmd.memory_mb, "warming", cmd.artifact_sha256, conc, at, at,
                                             cmd.runtime)
            self._pending.append((at + took, host, cmd.model_id, "ready"))
            self._ack(emit, at + took, m, cmd, "succeeded", duration=took)
            return took
        if cmd.kind == "drain":
            if e is not None and e.state in ("ready", "failed", "warming"):
                e.state = "draining"
            self._ack(emit, at + DRAIN_SECONDS, m, cmd, "succeeded", duration=DRAIN_SECONDS)
            return DRAIN_SECONDS
        # unload
        if e is None:
            self._ack(emit, at + 1.0, m, cmd, "succeeded", duration=1.0)
            return 1.0
        if e.state != "draining":
            self.problems.append((at, host, cmd.model_id, UNLOAD_NOT_DRAINED))
            self._ack(emit, at + 1.0, m, cmd, "failed", duration=1.0, message="not_draining")
            return 1.0
        e.state = "unloading"
        self._pending.append((at + UNLOAD_SECONDS, host, cmd.model_id, "gone"))
        self._ack(emit, at + UNLOAD_SECONDS, m, cmd, "succeeded", duration=UNLOAD_SECONDS)
        return UNLOAD_SECONDS

    # --- incidents --------------------------------------------------------------------------

    def set_incident(self, host_id: str, kind: str | None, at: float, emit: Emit) -> None:
        m = self.machines[host_id]
        if kind == "node_outage":
            if m.up:
                m.up = False
                m.engines.clear()  # every engine dies with the machine
                self._pending = [p for p in self._pending if p[1] != host_id]
            return
        if not m.up:
            # Back from the outage: the agent fails what it had queued and starts clean.
            m.up = True
            m.busy_until = at
            for cmd in m.queue:
                self._ack(emit, at, m, cmd, "failed", duration=0.0, message="agent_restarted")
            m.queue.clear()
        m.state = "throttled" if kind == "thermal_throttle" else "accepting"

    # --- observation ------------------------------------------------------------------------

    def heartbeat(self, host_id: str, at: float) -> HostHeartbeat | None:
        m = self.machines[host_id]
        if not m.up:
            return None
        m.heartbeats += 1
        spec = m.spec
        residencies = tuple(
            Residency(
                model_id=e.model_id, memory_mb=e.memory_mb, state=e.state,  # type: ignore[arg-type]
                runtime=e.runtime, artifact_sha256=e.sha, loaded_age_seconds=max(0.0, at - e.started_at),
                last_used_age_seconds=max(0.0, at - e.last_used_at), active_requests=0,
                max_concurrency=e.max_concurrency, endpoint=f"http://{host_id}.sim:{8100 + i}",
            )
            for i, e in enumerate(sorted(m.engines.values(), key=lambda x: x.model_id))
        )
        cached = tuple(
            CachedArtifact(model_id=mid, sha256=self.profiles[mid].artifact_sha256 or "", size_bytes=size << 20)
            for mid, size in sorted(m.cached.items()) if mid in self.profiles
        )
        total = spec.disk_gb << 30
        return HostHeartbeat(
            event_id=f"hb-{host_id}-{m.heartbeats}", at=at, host_id=host_id, state=m.state,  # type: ignore[arg-type]
            resources=spec.resources(), residencies=residencies, cached=cached,
            disk_total_bytes=total, disk_free_bytes=max(0, total - (m.disk_used_mb() << 20)),
            load=HostLoad(), highest_term=1,
        )

    def touch(self, host_id: str, model_id: str, at: float) -> None:
        e = self.machines[host_id].engines.get(model_id)
        if e is not None:
            e.last_used_at = max(e.last_used_at, at)
