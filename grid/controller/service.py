"""The controller loop: follow the log, forecast, plan, reconcile, and (in automatic mode) command.

Side effects live here and nowhere else in grid.controller:

* projections follow every stream (ordered consumers); a snapshot under GRID_HOME/snapshots
  makes restarts cheap, a corrupt one is quarantined with a visible warning;
* a tick runs promptly when hosts, control or requests changed (coalesced) and periodically;
  its pure part (forecast, plan, reconcile) runs on a worker thread over the projection states
  held at its start (`ProjectionRunner.hold`), so the fold goes on meanwhile; recording and
  publishing stay on the loop;
* a plan is appended only by the lease holder, only when it changed (or periodically), with
  ``Nats-Expected-Last-Subject-Sequence`` = the last plan sequence this controller folded, so a
  stale writer's append fails;
* commands are published only in automatic mode, by the lease holder, after re-reading the lease,
  with ``Nats-Msg-Id`` = the stable action id (a retried publish is a no-op); each carries term,
  controller id, lease expiry and remaining TTL, and the plan generation;
* leaving automatic mode withdraws every open command; automatic mode is refused while the log
  is not durable;
* after a start, destructive work waits for a grace period and for heartbeats received after
  the start.

With auth on, an optional grid.identity.service.ControllerIdentity provisions host command
consumers and serves enrolment alongside.

The process entry (``gridctl serve controller``) is the typer command in grid.cli.controller;
the admin HTTP server is grid.controller.api's.

Why one file of ~730 lines: it is the controller's only side-effect edge, and the lease (and presence), the
identity wiring, the tick, plan recording and command publishing share state that must be read at one instant (the
positions a plan is based on, the lease term a command carries). The pure parts it composes
live elsewhere (tick.py, reconcile.py, status.py); metrics are read from this state at scrape
time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import structlog

from grid.analytics.service import AnalyticsService
from grid.clock import Clock, SystemClock
from grid.config import GridConfig
from grid.controller.governor import Limits
from grid.controller.issue import Issuer, command_issued, command_withdrawn
from grid.controller.lease import Lease
from grid.controller.presence import (
    ANNOUNCE_ACTIVE,
    ANNOUNCE_STANDBY,
    ANNOUNCE_STOPPED,
    PresenceRecord,
    announce,
    presence_view,
    read_presence,
)
from grid.controller.reconcile import (
    WITHDRAW_MODE,
    Action,
    Guards,
    ReconcileResult,
    Withdrawal,
    withdraw_all,
)
from grid.controller.status import LATEST_REJECTIONS, ControllerView, TickReport, build_status
from grid.controller.tick import PROJECTIONS, Controls, Tick, encode_policy, run_tick
from grid.demand.forecast import Forecast
from grid.events import codec
from grid.events.base import Event
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.control import ForecastWindowSet, ModeSet, ProfileRemoved, ProfileSet, TickRequested
from grid.events.evaluations import EvaluationRecorded
from grid.events.log import (
    AppendResult,
    ConflictError,
    EventLog,
    LogError,
    StoredMessage,
)
from grid.events.plan import PlanCreated, make_generation
from grid.events.subjects import (
    COMMANDS_STREAM,
    CONTROL_STREAM,
    HOSTS_STREAM,
    PLANS_STREAM,
    REQUESTS_STREAM,
    revocation_subject,
)
from grid.controller.quarantine_metrics import quarantine_gauge
from grid.controller import store_view
from grid.controller.store_metrics import store_sources
from grid.fleet.planning import Plan, PlannerInput, Policy, decode_plan, encode_plan
from grid.controller.ingress import HostIngress, ingress_metrics
from grid.projections.budget import Flagged, budget_metric, flagged_rows, merge_flagged
from grid.identity.admin import apply_requested_revocations
from grid.metrics import ControllerMetrics, GaugeCollector, GaugeSource, Sample, rejected_events
from grid.projections import actions as actions_proj
from grid.projections import catalog as catalog_proj
from grid.projections import fleet as fleet_proj
from grid.projections import placed as placed_proj
from grid.projections.runner import ProjectionRunner
from grid.secrets import load_or_create_secret, write_owner_only
from grid.tasks import cancel_and_wait
from grid.transport.artifact_store import ensure_artifact_store
from grid.transport.jetstream import REPLICAS_MISMATCH, JetStreamLog, host_footprint_bytes
from grid.transport.store_pressure import StorePressure, as_status

log = structlog.get_logger(__name__)

SNAPSHOT_NAME = "controller.snapshot"
# Hosts whose commands are appended concurrently while publishing a batch (each host's in the
# reconciler's order, one after another): a wave of a thousand commands one round trip at a time
# would hold the tick for seconds.
PUBLISH_CONCURRENCY = 64
# How often a controller without a local store supervisor reads the JetStream account's storage.
STORE_READ_SECONDS = 10.0
STORE_READ_TIMEOUT_SECONDS = 5.0
# Streams whose changes make a prompt tick worthwhile (our own plans/commands do not).
TRIGGER_STREAMS = frozenset({HOSTS_STREAM, CONTROL_STREAM, REQUESTS_STREAM})
# Where revocations land (grid.events.subjects.revocation_subject), and how soon one that could
# not be applied (no lease, servers unreachable) is tried again.
REVOCATION_SUBJECT_PREFIX = revocation_subject("x")[: -len("x")]
REVOCATION_RETRY_SECONDS = 1.0


class ControllerError(RuntimeError):
    pass


def pure_tick(states: Mapping[str, Any], now: float, controls: Controls) -> tuple[Tick, float]:
    """The pure tick on held states, and the CPU seconds it took on its own thread (the rest of a
    tick's duration is waiting: for the GIL, the log, the lease)."""
    cpu0 = time.thread_time()
    tick = run_tick(states, now, controls, stopwatch=time.perf_counter)
    return tick, time.thread_time() - cpu0


class ControllerSettings(msgspec.Struct, frozen=True, kw_only=True):
    tick_interval_seconds: float = 5.0
    coalesce_seconds: float = 0.2
    # Keepalive: re-record an unchanged plan this often, so status, replay windows and the
    # dashboard always find a recent plan and its inputs (an unchanged plan is otherwise not
    # appended). Five minutes keeps an idle grid's plan stream to ~12 appends an hour.
    plan_refresh_seconds: float = 300.0
    lease_ttl_seconds: float = 15.0
    lease_renew_seconds: float = 5.0
    lease_margin_seconds: float = 1.0
    restart_grace_seconds: float = 10.0
    snapshot_interval_seconds: float = 30.0
    history_limit: int = 50
    tick_history_limit: int = 20
    limits: Limits = Limits()
    policy: Policy = Policy()
    # Test seam: pause between command publishes (lets a test kill the process mid-batch).
    publish_pause_seconds: float = 0.0
    # False: no tick loop; the caller drives tick() (benchmarks, deterministic tests).
    background_ticks: bool = True
    # Run the DuckDB analytics sink in this process (GRID_HOME/analytics.duckdb) and serve history
    # from it. The process entries (`serve controller`, `up`) turn it on; library users opt in.
    analytics: bool = False


def plan_key(plan: Plan) -> str:
    """Identity of a plan's decisions (not of its inputs, `now`, scores or explanations): a new
    plan is recorded only when this changes.

    Scores drift with every heartbeat (free memory moves the fit score) and explanations quote
    them; keyed on those, an idle one-host grid recorded a plan every tick (~2 s, ~100 MB a day).
    What agents and replay act on is which model goes where, with what memory and status, what
    is preempted, and what cannot be placed and why. The predictive cache decisions are commands
    too (a prefetch load, an exact-SHA evict): a plan that adds or drops one is recorded, so every
    such command names a recorded plan that carries it. Their drifting figures (value, free disk
    after, an entry's age) are left out, like scores.
    """
    body = (
        tuple((p.model_id, p.host_id, p.runtime, p.memory_mb, p.status, p.managed) for p in plan.placements),
        plan.preemptions,
        tuple((s.model_id, s.wanted, s.placed, s.reason) for s in plan.shortfalls),
        tuple((a.host_id, a.model_id, a.artifact_sha256, a.size_bytes) for a in plan.prefetch),
        tuple((e.host_id, e.model_id, e.artifact_sha256, e.size_bytes) for e in plan.evictions),
    )
    return hashlib.sha256(codec.encode_value(body)).hexdigest()


@dataclass
class _HomeFiles:
    root: Path

    @property
    def dir(self) -> Path:
        return self.root / "controller"

    @property
    def lock(self) -> Path:
        return self.dir / "lock"

    @property
    def controller_id(self) -> Path:
        return self.dir / "id"

    @property
    def epoch(self) -> Path:
        return self.dir / "epoch"

    @property
    def snapshot(self) -> Path:
        return self.root / "snapshots" / SNAPSHOT_NAME

    @property
    def admin_url(self) -> Path:
        return self.root / "admin.url"


def _persistent_value(path: Path, nbytes: int = 16) -> str:
    if path.exists():
        value = path.read_text().strip()
        if value:
            return value
    value = secrets.token_hex(nbytes)
    write_owner_only(path, (value + "\n").encode())
    return value


class Controller:
    """The allocator controller. `start()` / `stop()`; `tick()`; `view()` / `status()`."""

    def __init__(
        self,
        log_: EventLog,
        home: Path | GridConfig,
        *,
        settings: ControllerSettings | None = None,
        clock: Clock | None = None,
        controller_id: str | None = None,
        identity: Any = None,
        store: Callable[[], StorePressure | None] | None = None,
    ) -> None:
        self.log = log_
        # The supervisor's last reading of the event log store's disk, where the controller runs
        # beside the NATS server that stores the log (`gridctl up`): status and /metrics show a
        # filling disk before heartbeats stop being stored.
        self.store = store
        # Without that supervisor (a cluster, a server elsewhere): the JetStream account's view of the
        # store, read every STORE_READ_SECONDS (grid.controller.store_view); never a bare null.
        self._account_store: dict[str, Any] = store_view.unmeasured("not read yet")
        # grid.identity.service.ControllerIdentity when the log has auth on: host command
        # consumers and the enrolment service (hosts may create neither themselves).
        self.identity = identity
        # Started with the identity (a grid with host accounts): grid.controller.ingress.
        self.ingress: HostIngress | None = None
        self._ingress_log: JetStreamLog | None = None
        self.config = home if isinstance(home, GridConfig) else GridConfig(home=Path(home), nats_url=None)
        self.files = _HomeFiles(self.config.home)
        self.settings = settings or ControllerSettings()
        self.clock = clock or SystemClock()
        self._explicit_id = controller_id
        self.controller_id = controller_id or ""
        self.epoch = ""
        # Each plan records the residencies PLACED corroborates (a command of this controller,
        # acknowledged by its host), and status reports the claims it does not (the gateway's rule).
        self.runner = ProjectionRunner(PROJECTIONS)
        self.lease: Lease | None = None
        self.token: str | None = None
        self.started_at: float | None = None
        self.first_tick_at: float | None = None
        self.warnings: list[str] = []
        self.last_result: ReconcileResult | None = None
        self.last_plan: Plan | None = None
        self.last_input: PlannerInput | None = None
        self.last_forecast: Forecast | None = None
        self.last_generation = ""
        self.plan_recorded = False
        self.last_tick: TickReport | None = None
        self.ticks: collections.deque[TickReport] = collections.deque(maxlen=self.settings.tick_history_limit)
        self.published_total = 0
        self.withdrawn_total = 0
        self.plan_conflicts = 0
        self._cleared: set[str] = set()
        self._dirty = asyncio.Event()
        # Set when a revocation is folded: one an operator machine asked for is applied here
        # (`_revocation_loop`), where the authority lives.
        self._revocations = asyncio.Event()
        self._dirty_revision = 0
        self._processed_revision = 0
        self._success_revision = 0
        self._tick_no = 0
        self._tick_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[Any]] = []
        self._lock_fd: int | None = None
        self._last_plan_key: str | None = None
        self._last_plan_recorded_at: float | None = None
        self._stopping = False
        self.analytics: AnalyticsService | None = None
        # Every controller's last presence record (this one's included), for status.
        self.presence: list[tuple[PresenceRecord, float | None]] = []
        self.metrics = ControllerMetrics(self._gauges())
        self.metrics.registry.register(GaugeCollector(store_sources(self._store_status)))

    # --- metrics (states read at scrape time) ----------------------------------------------------

    def _gauges(self) -> list[GaugeSource]:
        def plan_age() -> list[Sample]:
            at = self._last_plan_recorded_at
            return [] if at is None else [((), max(0.0, self.clock.now() - at))]

        def pending() -> list[Sample]:
            if "actions" not in self.runner.states:
                return [((), 0.0)]
            records = actions_proj.open_actions(self.runner["actions"])
            return [((), float(sum(1 for r in records if not r.withdrawn)))]

        def term() -> list[Sample]:
            return [((), float(self.lease.term if self.lease is not None else 0))]

        def active() -> list[Sample]:
            return [((), 1.0 if self.lease is not None and self.lease.held else 0.0)]

        def positions() -> list[Sample]:
            return [((stream,), float(seq)) for stream, seq in sorted(self.runner.positions.items())]

        def last_tick() -> list[Sample]:
            report = self.last_tick
            return [] if report is None else [((), report.duration_ms / 1000)]

        def sink_positions() -> list[Sample]:
            # The DuckDB sink's stored positions, when it runs in this process.
            service = self.analytics
            if service is None or service.sink is None:
                return []
            try:
                stored = service.stored_positions()
            except Exception:  # the store is being replaced: no reading this scrape
                return []
            return [((stream,), float(seq)) for stream, seq in sorted(stored.items())]

        return [
            GaugeSource("grid_controller_log_position", "The last log sequence folded, by stream.", ("stream",),
                        positions),
            GaugeSource("grid_controller_last_tick_seconds", "Duration of the latest reconciliation pass.", (),
                        last_tick),
            GaugeSource("grid_analytics_log_position", "The last log sequence the analytics store holds, by stream.",
                        ("stream",), sink_positions),
            GaugeSource("grid_controller_plan_age_seconds", "Seconds since the last plan was recorded.", (), plan_age),
            GaugeSource("grid_controller_pending_commands", "Commands issued and not yet terminal (withdrawn excluded).",
                        (), pending),
            GaugeSource("grid_controller_lease_term", "The controller lease term this process holds or last saw.",
                        (), term),
            GaugeSource("grid_controller_active", "1 when this controller holds the lease (active), 0 on standby.",
                        (), active),
            quarantine_gauge(lambda: self.last_input, self.clock.now),
            rejected_events(lambda: self.runner.rejected),
            budget_metric(lambda: self.runner.budget),
            *ingress_metrics(lambda: self.ingress),
        ]

    # --- lifecycle ------------------------------------------------------------------------------

    def _lock_home(self) -> bool:
        """Hold GRID_HOME/controller/lock for the process lifetime. True when it was free."""
        self.files.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.files.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise ControllerError(f"another controller is running with grid home {self.config.home}") from exc
        self._lock_fd = fd
        return True

    async def _ensure_artifact_store(self) -> None:
        """Create the grid's artifact store (hosts fetch what they lack from it); a JetStream log only."""
        if not isinstance(self.log, JetStreamLog):
            return
        try:
            report = await ensure_artifact_store(self.log)
            if report.outcome == REPLICAS_MISMATCH:
                self.warnings.append(f"artifact store has {report.actual} replicas, wanted {report.wanted}: "
                                     f"{report.fix}")
        except Exception as exc:  # nats raises several unrelated types; the grid still runs without it
            self.warnings.append(f"artifact store unavailable: {type(exc).__name__}: {str(exc)[:160]}")

    async def _start_ingress(self, log_: JetStreamLog) -> None:
        """Store hosts' appends from now on (grid.controller.ingress): first thing at start, since
        agents may be waiting for their registrations to be stored. On a connection of its own,
        so a host flooding the ingress with the largest messages it may send (hundreds of MB a
        minute) queues nothing ahead of the folds' deliveries on the log's connection."""
        connection = None
        try:
            connection = await log_.sibling("grid-controller-ingress")
        except LogError as exc:
            log.warning("ingress connection not opened; the ingress shares the log's", error=str(exc))
        self._ingress_log = connection
        self.ingress = HostIngress(clock=self.clock.now)
        await self.ingress.start((connection or log_).client)

    async def start(self) -> None:
        self.config.ensure_home()
        self._lock_home()
        self.controller_id = self._explicit_id or _persistent_value(self.files.controller_id)
        self.epoch = _persistent_value(self.files.epoch, 8)
        self.token = load_or_create_secret(self.config.operator_token_path)
        if self.identity is not None and isinstance(self.log, JetStreamLog):
            await self._start_ingress(self.log)
        await self.runner.restore_snapshot(self.files.snapshot, self.log)
        await self.runner.catch_up(self.log)
        self.started_at = self.clock.now()
        s = self.settings
        # The home lock was free, so an earlier incarnation with our id is dead: reclaim at once.
        self.lease = Lease(
            self.log, self.controller_id, ttl_seconds=s.lease_ttl_seconds, margin_seconds=s.lease_margin_seconds,
            clock=self.clock, reclaim_own=self._explicit_id is None,
        )
        self.lease.observe_term(self._max_term_seen())
        if not self.log.durable:
            self.warnings.append("the event log is not durable: automatic mode is refused")
        with contextlib.suppress(LogError):
            await self.lease.step()
        await self._announce()
        self._latest_plan_from_log()
        await self._ensure_artifact_store()
        if s.analytics:
            await self._start_analytics()
        if self.identity is not None:
            # Only the lease holder answers joins and renewals (grid.identity.enrolment.serve).
            await self.identity.start(self.log, getattr(self.log, "client", None),
                                      answering=lambda: self.lease is not None and self.lease.held)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._follow(), name="controller-follow"),
            loop.create_task(self._lease_loop(), name="controller-lease"),
            loop.create_task(self._snapshot_loop(), name="controller-snapshot"),
        ]
        if self.identity is not None:
            self._revocations.set()  # what the catch-up folded
            self._tasks.append(loop.create_task(self._revocation_loop(), name="controller-revocations"))
        if s.background_ticks:
            self._tasks.append(loop.create_task(self._tick_loop(), name="controller-tick"))
        if self.store is None:
            self._tasks.append(loop.create_task(self._account_store_loop(), name="controller-store"))
        self._dirty.set()
        log.info("controller started", controller_id=self.controller_id, term=self.lease.term,
                 positions=self.runner.positions)

    async def _start_analytics(self) -> None:
        service = AnalyticsService(self.log, self.config.duckdb_path)
        try:
            await service.start()
        except Exception as exc:  # a damaged or foreign-locked file: serve without history, say so
            self._warn(f"analytics store {self.config.duckdb_path} unavailable ({exc}); history is off")
            log.warning("analytics store unavailable", path=str(self.config.duckdb_path), error=str(exc))
            return
        self.analytics = service

    async def stop(self) -> None:
        self._stopping = True
        await cancel_and_wait(self._tasks)
        self._tasks = []
        if self.identity is not None:
            with contextlib.suppress(Exception):
                await self.identity.stop()
        if self.ingress is not None:
            await self.ingress.stop()
            self.ingress = None
        if self._ingress_log is not None:
            await self._ingress_log.close()
            self._ingress_log = None
        if self.analytics is not None:
            await self.analytics.stop()
            self.analytics = None
        if self.lease is not None:
            with contextlib.suppress(Exception):
                await self.lease.release()
            await self._announce(ANNOUNCE_STOPPED)
        with contextlib.suppress(OSError):
            self.runner.save_snapshot(self.files.snapshot)
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            self._lock_fd = None

    async def _account_store_loop(self) -> None:
        while True:
            self._account_store = await self._read_account_store()
            await asyncio.sleep(STORE_READ_SECONDS)

    async def _read_account_store(self) -> dict[str, Any]:
        """The JetStream account's storage, used and reserved, and its limit ($JS.API.INFO under the
        log's API prefix; nats-py's account_info() drops reserved_storage)."""
        js, nc = getattr(self.log, "jetstream", None), getattr(self.log, "client", None)
        if js is None or nc is None:
            return store_view.unmeasured("the event log is not a NATS JetStream server")
        prefix = getattr(js, "_prefix", None) or "$JS.API"
        try:
            msg = await nc.request(f"{prefix}.INFO", b"", timeout=STORE_READ_TIMEOUT_SECONDS)
            info = json.loads(msg.data)
        except Exception as exc:  # an answer status can show, never a crash of the loop
            return store_view.account_store(None, error=f"{type(exc).__name__}: {exc}")
        return store_view.account_store(info if isinstance(info, dict) else None, error="not a JSON object")

    def _store_status(self) -> dict[str, Any]:
        """Status's `store`: the local supervisor's reading, else the account's (never None)."""
        if self.store is None:
            return self._account_store
        reading = as_status(self.store())
        return store_view.local(reading) if reading is not None else store_view.unmeasured(
            "the local store has not been read yet")

    def _max_term_seen(self) -> int:
        term = 0
        plans = self.runner["plans"]
        if plans.latest is not None:
            term = max(term, plans.latest.controller_term)
        for r in self.runner["actions"].actions.values():
            term = max(term, r.command.controller_term)
        return term

    def _latest_plan_from_log(self) -> None:
        latest = self.runner["plans"].latest
        if latest is None:
            return
        self.last_generation = latest.generation
        self._last_plan_recorded_at = latest.now
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            self._last_plan_key = plan_key(decode_plan(bytes(latest.plan)))

    # --- background loops -------------------------------------------------------------------------

    def _on_fold(self, stream: str, msg: StoredMessage) -> None:
        if stream in TRIGGER_STREAMS:
            self._dirty_revision += 1
            self._dirty.set()
        if stream == CONTROL_STREAM and msg.subject.startswith(REVOCATION_SUBJECT_PREFIX):
            self._revocations.set()

    async def _revocation_loop(self) -> None:
        """Apply the revocations an operator machine asked for on the log (grid.identity.admin:
        `gridctl node revoke` where the grid home holds the operator credential, not the
        authority): the lease holder revokes the host where the authority lives, pushes the
        servers' revocation list, which disconnects the host, and appends the revocation naming its
        keys. Level-triggered on the fleet's revoked hosts, so a restart applies what is pending."""
        while True:
            await self._revocations.wait()
            if self.lease is None or not self.lease.held:
                await asyncio.sleep(REVOCATION_RETRY_SECONDS)
                continue
            self._revocations.clear()
            requested = {host_id: (record.revoked_at, record.revoked_reason)
                         for host_id, record in self.runner["fleet"].hosts.items() if record.revoked_at is not None}
            if not requested:
                continue
            client = getattr(self.log, "client", None)
            url = ",".join(u.geturl() for u in getattr(client, "servers", ())) or self.config.nats_url or ""
            try:
                applied = await apply_requested_revocations(self.identity.authority.directory.parent, url, requested)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the servers or the log unreachable: try again
                log.warning("revocation not applied; retrying", error=f"{type(exc).__name__}: {exc}")
                self._revocations.set()
                await asyncio.sleep(REVOCATION_RETRY_SECONDS)
                continue
            for done in applied:
                log.info("revocation applied", host_id=done.host_id, keys=len(done.keys), seq=done.seq)
            if applied and hasattr(self.identity, "registry_changed"):
                await self.identity.registry_changed()  # the other controllers learn it at once

    async def _follow(self) -> None:
        while not self._stopping:
            try:
                await self.runner.follow(self.log, on_fold=self._on_fold)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection trouble: resume from the folded positions
                log.warning("controller follow failed; resuming", error=str(exc))
                await asyncio.sleep(1.0)

    async def _lease_loop(self) -> None:
        assert self.lease is not None
        while True:
            was = self.lease.held
            try:
                self.lease.observe_term(self._max_term_seen())
                await self.lease.step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("lease step failed", error=str(exc))
            if self.lease.held and not was:
                self._dirty.set()
            await self._announce()
            await asyncio.sleep(self.settings.lease_renew_seconds)

    async def _announce(self, state: str | None = None) -> None:
        """Write this controller's presence record and read everyone's (status only: a failure
        here costs a stale status row, never the lease or a tick)."""
        lease = self.lease
        if lease is None:
            return
        try:
            admin_url = self.files.admin_url.read_text().strip() or None
        except OSError:
            admin_url = None
        record = PresenceRecord(
            controller_id=self.controller_id, state=state or (ANNOUNCE_ACTIVE if lease.held else ANNOUNCE_STANDBY),
            term=lease.term, interval_seconds=self.settings.lease_renew_seconds, admin_url=admin_url,
            started_at=self.started_at,
        )
        try:
            await announce(self.log, record)
            self.presence = await read_presence(self.log)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - connection trouble, permissions: status degrades only
            log.debug("controller presence not announced", error=str(exc))

    async def _tick_loop(self) -> None:
        s = self.settings
        while True:
            try:
                await asyncio.wait_for(self._dirty.wait(), timeout=s.tick_interval_seconds)
                reason = "changed"
                await asyncio.sleep(s.coalesce_seconds)  # coalesce a burst of changes
            except TimeoutError:
                reason = "periodic"
            self._dirty.clear()
            try:
                await self.tick(reason)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("controller tick failed")

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.snapshot_interval_seconds)
            try:
                await asyncio.to_thread(self._save_snapshot_bytes, self.runner.snapshot_bytes())
            except OSError as exc:
                log.warning("snapshot failed", error=str(exc))

    def _save_snapshot_bytes(self, data: bytes) -> None:
        path = self.files.snapshot
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_owner_only(path, data)

    def request_tick(self) -> None:
        self._dirty.set()

    # --- control events (admin API) -----------------------------------------------------------

    async def append_control(self, event: Event) -> AppendResult:
        if not isinstance(event, (ProfileSet, ProfileRemoved, ModeSet, TickRequested, EvaluationRecorded,
                                  ForecastWindowSet)):
            raise TypeError(f"not a control event: {type(event).__name__}")
        result = await self.log.append(event)
        await self._await_position(result.stream, result.seq)
        self._dirty.set()
        return result

    async def _await_position(self, stream: str, seq: int, timeout: float = 2.0) -> None:
        """Wait until the follower folded `seq` of `stream` (catch up directly if it lags)."""
        deadline = time.monotonic() + timeout
        while self.runner.positions.get(stream, 0) < seq:
            if time.monotonic() > deadline:
                await self.runner.catch_up(self.log, end={stream: seq})
                return
            await asyncio.sleep(0.002)

    # --- the tick -------------------------------------------------------------------------------

    def _guards(self, states: Mapping[str, Any]) -> Guards:
        grace_until = (self.first_tick_at or self.clock.now()) + self.settings.restart_grace_seconds
        return Guards(
            destructive_not_before=grace_until,
            fresh_after=self.started_at,
            cleared_withdrawals=frozenset(self._cleared),
            evacuating_since=fleet_proj.evacuating_since(states["fleet"], self.clock.now()),
        )

    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)
            del self.warnings[:-20]

    async def tick(self, reason: str = "manual") -> TickReport:
        async with self._tick_lock:
            return await self._tick(reason)

    async def _tick(self, reason: str) -> TickReport:
        t0 = time.perf_counter()
        now = self.clock.now()
        if self.first_tick_at is None:
            self.first_tick_at = now
        self._tick_no += 1
        self._processed_revision = self._dirty_revision
        # The states this tick reads and the positions they were folded to, held at one instant
        # (no await in between): the fold goes on on this loop while the tick runs on a worker
        # thread, and a plan's based_on must name exactly what its planner saw, or replay cannot
        # rebuild it.
        held = self.runner.hold()
        states = held.states
        catalog: catalog_proj.CatalogState = states["catalog"]
        mode = catalog.mode
        durable = bool(getattr(self.log, "durable", False))
        effective = mode if (mode != "automatic" or durable) else "recommend"
        lease = self.lease
        leader = lease is not None and lease.held
        report = TickReport(number=self._tick_no, at=now, reason=reason, mode=mode, effective_mode=effective,
                            leader=leader, dirty_revision=self._processed_revision)
        try:
            based_on = dict(sorted(held.positions.items()))
            controls = Controls(policy=self.settings.policy, mode=effective, limits=self.settings.limits,
                                guards=self._guards(states))
            # observe, forecast, plan, reconcile (pure) off the loop, so heartbeats, the gateway's
            # requests and the analytics sink are not queued behind the plan.
            tick, cpu_seconds = await asyncio.to_thread(pure_tick, states, now, controls)
            planned, result = tick.planned, tick.result
            if planned.forecast_error is not None:
                log.warning("forecast failed; using baseline demand", error=planned.forecast_error)
                self._warn(f"forecast failed ({planned.forecast_error}); using min_replicas")
            pin, plan = planned.planner_input, planned.plan
            report.forecast_ms = planned.forecast_seconds * 1000
            report.plan_ms = planned.plan_seconds * 1000
            report.reconcile_ms = tick.reconcile_seconds * 1000
            report.cpu_ms = cpu_seconds * 1000
            self.last_input, self.last_plan, self.last_forecast = pin, plan, planned.forecast
            # record the plan (lease holder only, CAS on the plan subject)
            if leader:
                await self._record_plan(plan, pin, now, report, based_on, states["placed"])
            report.generation = self.last_generation
            self._cleared.update(result.cleared_withdrawals)
            self.last_result = result
            report.actions, report.deferred = len(result.actions), len(result.deferred)
            # side effects (lease holder only)
            t5 = time.perf_counter()
            if leader and self.last_generation:
                if effective == "automatic":
                    await self._publish(result.withdrawals, result, now, report)
                else:
                    await self._publish(withdraw_all(states["actions"], WITHDRAW_MODE), None, now, report)
            report.publish_ms = (time.perf_counter() - t5) * 1000
            if mode == "automatic" and not durable:
                self._warn("automatic mode requested but the event log is not durable: running as recommend")
            self._success_revision = self._processed_revision
        except LogError as exc:
            report.error = f"{type(exc).__name__}: {exc}"
            log.warning("tick failed", error=report.error)
        report.duration_ms = (time.perf_counter() - t0) * 1000
        self.metrics.tick.observe(report.duration_ms / 1000)
        self.last_tick = report
        self.ticks.append(report)
        return report

    async def _record_plan(self, plan: Plan, pin: PlannerInput, now: float, report: TickReport,
                           based_on: dict[str, int], placed: placed_proj.PlacedState) -> None:
        # Corroborated as of the plan's own positions (`placed` held with its input).
        corroborated = placed_proj.corroborated(placed)
        # A newly corroborated residency is a change worth recording: the gateway routes to it
        # only once a plan lists it.
        key = plan_key(plan) + hashlib.sha256(codec.encode_value(corroborated)).hexdigest()
        fresh_enough = (
            self._last_plan_recorded_at is not None
            and now - self._last_plan_recorded_at < self.settings.plan_refresh_seconds
        )
        assert self.lease is not None
        latest = self.runner["plans"].latest
        # A controller that took over records its plan at once, even an unchanged one: the plan
        # stream then says which term is in charge (and failover shows there, not a TTL later).
        ours = latest is not None and latest.controller_term == self.lease.term
        if key == self._last_plan_key and fresh_enough and self.last_generation and ours:
            return
        if not await self.lease.verify():
            return
        plans = self.runner["plans"]
        sequence = (plans.latest.sequence if plans.latest is not None else 0) + 1
        generation = make_generation(self.epoch, sequence, plan.inputs_digest)
        expected = self.runner.positions.get(PLANS_STREAM, 0)
        event = PlanCreated(
            event_id=f"plan-{self.epoch}-{sequence}-{plan.inputs_digest[:16]}", at=now,
            planner_version=plan.planner_version, generation=generation, epoch=self.epoch, sequence=sequence,
            inputs_digest=plan.inputs_digest, based_on=based_on, now=now,
            controller_id=self.controller_id, controller_term=self.lease.term,
            plan=msgspec.Raw(encode_plan(plan)), policy=encode_policy(pin.policy), corroborated=corroborated,
        )
        try:
            res = await self.log.append(event, expected_last_subject_seq=expected)
        except ConflictError as exc:
            # Someone else appended a plan since we folded: we are stale. Catch up, step back.
            self.plan_conflicts += 1
            self._warn(f"plan append refused (another writer): {exc}")
            await self.runner.catch_up(self.log)
            return
        await self._await_position(PLANS_STREAM, res.seq)
        self.last_generation = generation
        self._last_plan_key = key
        self._last_plan_recorded_at = now
        report.plan_recorded = True

    async def _publish(self, withdrawals: tuple[Withdrawal, ...], result: ReconcileResult | None, now: float,
                       report: TickReport) -> None:
        """Withdrawals first, then commands. Appends are pipelined across hosts and kept in the
        reconciler's order within each host's subject."""
        actions = result.actions if result is not None else ()
        if not withdrawals and not actions:
            return
        lease = self.lease
        assert lease is not None
        if not await lease.verify():
            return
        pause = self.settings.publish_pause_seconds
        width = 1 if pause else PUBLISH_CONCURRENCY
        last_seq = 0
        held_back = False

        def issuer() -> Issuer:
            # Read per event: the term a command carries is the lease's at the moment it is built.
            return Issuer(controller_id=self.controller_id, controller_term=lease.term,
                          generation=self.last_generation)

        def withdrawal_event(w: Withdrawal) -> CommandWithdrawn:
            return command_withdrawn(w, issuer(), at=now)

        def command_event(a: Action) -> CommandIssued | None:
            nonlocal held_back
            remaining = lease.remaining()
            if not lease.held or remaining <= lease.margin:
                held_back = True
                return None
            return command_issued(a, issuer(), issued_at=self.clock.now(), lease_remaining=remaining)

        async def run(items: list[Any], build: Any, is_command: bool) -> None:
            per_host: dict[str, list[Any]] = {}
            for item in items:
                per_host.setdefault(item.host_id, []).append(item)
            sem = asyncio.Semaphore(width)

            async def host_batch(batch: list[Any]) -> None:
                nonlocal last_seq
                async with sem:
                    for item in batch:
                        ev = build(item)
                        if ev is None:
                            return
                        res = await self.log.append(ev)
                        last_seq = max(last_seq, res.seq)
                        if is_command:
                            if not res.duplicate:
                                report.published += 1
                                self.published_total += 1
                                self.metrics.commands.labels(ev.kind).inc()
                        else:
                            report.withdrawn += 1
                            self.withdrawn_total += 1
                        if pause:
                            await asyncio.sleep(pause)

            await asyncio.gather(*(host_batch(b) for b in per_host.values()))

        await run(list(withdrawals), withdrawal_event, False)
        await run(list(actions), command_event, True)
        if held_back:
            self._warn("lease authority ran out while publishing; remaining commands held back")
        if last_seq:
            # The next tick must see these as open (pending equivalents are suppressed).
            await self._await_position(COMMANDS_STREAM, last_seq)

    # --- status -------------------------------------------------------------------------------

    def view(self) -> ControllerView:
        """What status shows, read at one instant (nothing awaits while it is taken)."""
        lease = self.lease
        s = self.settings
        return ControllerView(
            now=self.clock.now(), controller_id=self.controller_id, epoch=self.epoch, started_at=self.started_at,
            restart_grace_until=None if self.first_tick_at is None else self.first_tick_at + s.restart_grace_seconds,
            lease=lease.describe() if lease is not None else None,
            lease_error=lease.last_error if lease is not None and lease.state != "held" else None,
            published_total=self.published_total, withdrawn_total=self.withdrawn_total,
            plan_conflicts=self.plan_conflicts, log_durable=bool(getattr(self.log, "durable", False)),
            dirty_revision=self._dirty_revision, processed_revision=self._processed_revision,
            success_revision=self._success_revision, states=dict(self.runner.states),
            positions=dict(sorted(self.runner.positions.items())), malformed_events=self.runner.malformed,
            warnings=tuple(self.runner.warnings) + tuple(self.warnings) + self._footprint_warning()
            + tuple(getattr(self.identity, "warnings", list)()), limits=s.limits,
            store=self._store_status(),
            history_limit=s.history_limit, last_tick=self.last_tick, ticks=tuple(self.ticks),
            last_plan=self.last_plan, last_input=self.last_input, last_forecast=self.last_forecast,
            last_generation=self.last_generation, last_result=self.last_result,
            controllers=tuple(presence_view(self.presence, now=self.clock.now(),
                                            holder_id=lease.holder_id if lease is not None else None,
                                            holder_term=lease.holder_term if lease is not None else 0)),
            rejected_events=dict(self.runner.rejected),
            rejections=tuple(self.runner.gate.rejections[-LATEST_REJECTIONS:]),
            over_budget=tuple(flagged_rows(self._flagged_hosts(), self.clock.now())),
        )

    def status(self) -> dict[str, Any]:
        return build_status(self.view())

    def _flagged_hosts(self) -> dict[str, Flagged]:
        """Hosts over a budget: the ingress's refusals (what was never stored) and the fold's
        drops (its second line) together."""
        ingress = self.ingress
        folded = self.runner.budget.flagged if self.runner.budget is not None else {}
        return merge_flagged(folded, ingress.budget.flagged) if ingress is not None else dict(folded)

    def _footprint_warning(self) -> tuple[str, ...]:
        """Whether the hosts stream still holds every known host's history beside one host's whole
        footprint (grid.transport.jetstream.protected_hosts): past that, a host flooding its own
        subjects can push other hosts' oldest messages out."""
        capacity = getattr(self.log, "hosts_capacity", None)
        hosts = len(self.runner["fleet"].hosts) if "fleet" in self.runner.states else 0
        if capacity is None or hosts <= (limit := capacity()):
            return ()
        return (f"{hosts} hosts, but GRID_HOSTS holds the history of only {limit} beside one host's whole "
                f"footprint ({host_footprint_bytes() >> 20} MiB): a host flooding its own subjects could push other "
                "hosts' oldest messages out; raise the log budget (gridctl up --log-budget)",)

