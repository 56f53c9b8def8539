"""The gateway process state: everything with side effects at this edge, and no HTTP.

`Gateway` owns a live ProjectionRunner (fleet + catalog + the latest plan + what the controller
placed and the hosts confirmed) following the log, the routing table cache, the private breaker
board and measurements, the proxy-owned active counters and last_used_at watermarks, the
telemetry queue, the request-body intake bounds, the shared upstream client (which reaches
engines through their hosts' agents; the gateway holds no engine key).
The pure choice is `grid.gateway.routing.choose`; the HTTP handlers (`grid.gateway.routes`)
read and update this state, and `grid.gateway.app` composes both into a served app. This
module imports neither of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import structlog

from grid.clock import Clock, SystemClock
from grid.config import GridConfig
from grid.events.control import ModelProfile
from grid.events.host import RESIDENCY_STATES
from grid.events.log import EventLog
from grid.events.subjects import HOSTS_STREAM, PLANS_STREAM, PREFIX
from grid.fleet.placeability import Unplaceable, plan_saw_profile, unplaceable
from grid.fleet.planning import Plan, decode_plan
from grid.gateway import routing
from grid.gateway.breaker import CLOSED, HALF_OPEN, OPEN, BreakerBoard
from grid.gateway.evaluation import OwnerCapability
from grid.gateway.host_metrics import host_gauges
from grid.gateway.intake import BodyReader
from grid.gateway.measure import Measurements
from grid.gateway.routing import RouteCandidate, RouteKey
from grid.gateway.settings import API_KEYS_ENV, ApiKeys, GatewaySettings, parse_api_keys
from grid.gateway.telemetry import TelemetryQueue
from grid.gateway.upstream import Upstream
from grid.infer.local import LocalResponders
from grid.projections.budget import budget_metric, flagged_rows
from grid.metrics import GatewayMetrics, GaugeSource, Sample, counts, rejected_events
from grid.projections import fleet, placed
from grid.projections import routes as routes_proj
from grid.projections.runner import CATALOG, FLEET, PLACED, PLANS, ProjectionRunner
from grid.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

# The routing table is rebuilt when the projection moved, and at least this often (overrides
# can expire with time alone).
TABLE_MAX_AGE_SECONDS = 1.0
FOLLOW_RETRY_SECONDS = 1.0
MAX_REMEMBERED_ROUTES = 2048
# Startup replays at most this many recent host events (see Gateway._catch_up).
HOST_REPLAY_MAX_MESSAGES = 50_000
# ...and, before them, every ack the hosts stream still holds (only those subjects): a warm ack
# corroborates a residency for as long as it runs (grid.projections.placed).
ACK_SUBJECTS = f"{PREFIX}.host.*.ack"
# Startup waits for that scan while acks keep arriving at most this far apart, and at most
# ACK_SCAN_MAX_SECONDS in all; the rest of it continues in the background (the fold does not
# depend on order), ending after ACK_SCAN_BACKGROUND_IDLE_SECONDS without one.
ACK_SCAN_IDLE_SECONDS = 1.0
ACK_SCAN_MAX_SECONDS = 15.0
ACK_SCAN_BACKGROUND_IDLE_SECONDS = 60.0
# Unplaced claims listed in /gateway/stats (the gauge counts all).
MAX_LISTED_UNPLACED = 100


class Gateway:
    def __init__(
        self,
        event_log: EventLog,
        config: GridConfig,
        *,
        api_keys: Iterable[str] | None = None,
        clock: Clock | None = None,
        settings: GatewaySettings | None = None,
        environ: Mapping[str, str] | None = None,
        local_responders: LocalResponders | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        # Host agents running in this process (`gridctl up`): their requests skip NATS.
        self.local_responders = local_responders
        self.log = event_log
        self.config = config
        self.clock = clock or SystemClock()
        self.settings = settings or GatewaySettings.from_environ(env)
        self.policy = self.settings.policy
        keys = list(api_keys) if api_keys is not None else parse_api_keys(env.get(API_KEYS_ENV))
        self.api_keys = ApiKeys(keys)
        # Only the owner may mark a request as an evaluation (grid.gateway.evaluation says why).
        self.owner = OwnerCapability.from_environ(env, config.operator_token_path)
        # PLANS: only the latest plan's shortfalls, to tell "loading" from "cannot be placed".
        # PLACED: a managed residency is routed only when the latest plan assigns it to its host
        # and that host's warm ack confirms it (a heartbeat's claim alone attracts nothing).
        self.runner = ProjectionRunner((CATALOG, FLEET, PLANS, PLACED))
        self._plan: tuple[int, Plan | None] = (0, None)
        self.breakers = BreakerBoard()
        self.measurements = Measurements()
        self.active: dict[RouteKey, int] = {}
        self.served: Counter[RouteKey] = Counter()
        self.last_used: dict[str, float] = {}
        self.last_used_by_route: dict[RouteKey, float] = {}
        self.counters: Counter[str] = Counter()
        self.telemetry = TelemetryQueue(
            event_log,
            source=f"gateway:{socket.gethostname()}",
            clock=self.clock,
            batch_size=self.settings.telemetry_batch_size,
            flush_seconds=self.settings.telemetry_flush_seconds,
            max_queue=self.settings.telemetry_max_queue,
        )
        self.intake = BodyReader(
            max_bytes=self.settings.max_body_bytes,
            timeout_seconds=self.settings.body_timeout_seconds,
            max_incomplete=self.settings.max_incomplete_bodies,
        )
        self.metrics = GatewayMetrics(self._gauges())
        self.upstream: Upstream | None = None
        self._upstream_lost: Any = None
        # Where inference requests go out: a second connection, as this gateway's key in the
        # INFER account (grid.identity.accounts), when its credential has one; else the log's.
        self.infer_log: Any = None
        self.waiters = 0
        self._released = asyncio.Event()
        self._version = 0
        self._table: dict[str, tuple[RouteCandidate, ...]] = {}
        self._table_version = -1
        self._table_built_at = float("-inf")
        self._unplaced: list[placed.UnplacedClaim] = []
        # Hosts routed nothing until they heartbeat again (NATS answered "no responders" for them,
        # or their agent went silent): host id -> (heartbeat time seen then, marked at, reason).
        self.unresponsive: dict[str, tuple[float | None, float, str]] = {}
        self._follower: asyncio.Task[None] | None = None
        self._ack_scan: asyncio.Task[None] | None = None
        self.ack_scan: dict[str, Any] = {"state": "none", "folded": 0}
        self.started = False

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        await self._catch_up()
        self._version += 1
        connect_infer = getattr(self.log, "infer_connector", None)
        self.infer_log = await connect_infer() if connect_infer is not None else self.log
        self.upstream = Upstream(
            connect_timeout=self.settings.upstream_connect_timeout,
            read_timeout=self.settings.upstream_read_timeout,
            max_connections=self.settings.upstream_max_connections,
            backend=self.settings.upstream_backend,
            # The in-memory log has no NATS connection.
            nc=getattr(self.infer_log, "client", None),
            signer=getattr(self.log, "authorship", None),
            local=self.local_responders,
        )
        # A lost NATS connection fails every inference request in flight at once (their replies
        # cannot arrive any more) instead of holding its slot for the whole read timeout.
        self._upstream_lost = getattr(self.upstream.client, "connection_lost", None)
        add_listener = getattr(self.infer_log, "add_disconnect_listener", None)
        if self._upstream_lost is not None and add_listener is not None:
            add_listener(self._upstream_lost)
        self._follower = asyncio.create_task(self._follow(), name="grid-gateway-follower")
        self.telemetry.start()
        self.started = True

    async def _catch_up(self) -> None:
        """Fold the control stream completely and only the recent tail of the hosts stream.

        Routing needs each host's latest heartbeat, and only one younger than the heartbeat
        timeout counts; replaying days of heartbeats would only delay startup. Of the older host
        events, the acks are folded too (`_scan_acks`): a residency's warm ack is as old as it is.
        """
        # Verify authorship from the first message on, as the follower will (it adopts the same).
        if self.runner.gate.authorship is None:
            self.runner.gate.authorship = getattr(self.log, "authorship", None)
        for stream in self.runner.streams:
            start = self.runner.positions.get(stream, 0) + 1
            if stream == HOSTS_STREAM:
                tail = max(start, await self.log.last_sequence(stream) - HOST_REPLAY_MAX_MESSAGES + 1)
                if tail > start:
                    await self._scan_acks(start, tail)
                start = tail
                # the live follower continues after the skipped prefix, never from its start
                self.runner.positions[stream] = max(self.runner.positions.get(stream, 0), start - 1)
            elif stream == PLANS_STREAM:
                # Only the latest plan matters; an idle grid appends thousands a day.
                start = max(start, await self.log.last_sequence(stream))
                self.runner.positions[stream] = max(self.runner.positions.get(stream, 0), start - 1)
            async for msg in self.log.replay(stream, start_seq=start):
                self.runner.fold(msg)

    async def _scan_acks(self, first: int, end: int) -> None:
        """Fold the acks of hosts stream sequences [first, end) into `placed` only: the skipped
        prefix of the host events may hold the warm ack of a residency that has run for days.

        A filtered ordered consumer (the server skips the heartbeats). Startup waits while acks
        keep coming; what remains continues in the background, which is safe because the fold
        keeps each (host, model)'s highest-sequence ack whatever the order.
        """
        sub = await self.log.subscribe(HOSTS_STREAM, start_seq=first, subject_filter=ACK_SUBJECTS)
        self.ack_scan = {"state": "scanning", "folded": 0, "from": first, "to": end - 1}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ACK_SCAN_MAX_SECONDS
        try:
            while True:
                wait = min(ACK_SCAN_IDLE_SECONDS, deadline - loop.time())
                msg = await sub.next(timeout=wait) if wait > 0 else None
                if msg is None:
                    break
                if msg.seq >= end:
                    self.ack_scan["state"] = "done"
                    await sub.close()
                    return
                self._fold_ack(msg)
        except BaseException:
            await sub.close()
            raise
        self.ack_scan["state"] = "background"
        self._ack_scan = asyncio.create_task(self._scan_acks_rest(sub, end), name="grid-gateway-ack-scan")

    async def _scan_acks_rest(self, sub: Any, end: int) -> None:
        try:
            while True:
                msg = await sub.next(timeout=ACK_SCAN_BACKGROUND_IDLE_SECONDS)
                if msg is None or msg.seq >= end:
                    self.ack_scan["state"] = "done" if msg is not None else "idle"
                    return
                self._fold_ack(msg)
                self._version += 1
                self.pulse()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the live tail still folds new acks
            self.ack_scan["state"] = f"failed: {type(exc).__name__}"
            log.warning("ack scan failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                await sub.close()

    def _fold_ack(self, msg: Any) -> None:
        if self.runner.fold_aside(msg, ("placed",)):
            self.ack_scan["folded"] = self.ack_scan.get("folded", 0) + 1

    async def stop(self) -> None:
        self.started = False
        if self._ack_scan is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(cancel_and_wait([self._ack_scan]), 2.0)
            self._ack_scan = None
        if self._follower is not None:
            # Closing subscriptions on a dead NATS connection can hang: bound it.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(cancel_and_wait([self._follower]), 2.0)
            self._follower = None
        await self.telemetry.stop()
        remove_listener = getattr(self.infer_log, "remove_disconnect_listener", None)
        if self._upstream_lost is not None and remove_listener is not None:
            remove_listener(self._upstream_lost)
        self._upstream_lost = None
        if self.upstream is not None:
            await self.upstream.aclose()
            self.upstream = None
        if self.infer_log is not None and self.infer_log is not self.log:
            with contextlib.suppress(Exception):  # stopping: a dead connection closes as it can
                await self.infer_log.close()
        self.infer_log = None

    async def _follow(self) -> None:
        while True:
            try:
                await self.runner.follow(self.log, on_fold=self._on_fold)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep following; routing uses the last state
                self.counters["follow_errors"] += 1
                log.warning("projection follower restarting", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(FOLLOW_RETRY_SECONDS)

    def _on_fold(self, stream: str, msg: Any) -> None:
        self._version += 1
        self.pulse()

    def pulse(self) -> None:
        """Wake requests waiting for capacity (a slot freed or the fleet changed)."""
        if self.waiters:
            self._released.set()
            self._released = asyncio.Event()

    async def wait_for_change(self, timeout: float) -> None:
        event = self._released
        self.waiters += 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            self.waiters -= 1

    # --- views -------------------------------------------------------------------------------------

    def table(self, now: float) -> dict[str, tuple[RouteCandidate, ...]]:
        if self._table_version != self._version or now - self._table_built_at > TABLE_MAX_AGE_SECONDS \
                or now < self._table_built_at:
            snaps = fleet.snapshots(self.runner["fleet"], now)
            self._unplaced = routes_proj.unadmitted_claims(snaps, routes=self.runner["catalog"].routes,
                                                           profiles=self.profiles, placed=self.runner["placed"],
                                                           now=now, policy=self.policy)
            if self.unresponsive:
                heartbeats = {snap.host_id: snap.heartbeat_at for snap in snaps}
                for host_id, (seen, _at, reason) in list(self.unresponsive.items()):
                    if host_id not in heartbeats or not routing.still_unresponsive(seen, heartbeats[host_id]):
                        del self.unresponsive[host_id]  # it heartbeated again (or left the fleet)
                        log.info("host routable again", host_id=host_id, after=reason)
            self._table = routing.build_table(
                snaps, {(c.host_id, c.model_id): c.reason for c in self._unplaced if c.managed},
                {h: (seen, reason) for h, (seen, _at, reason) in self.unresponsive.items()},
                {(c.host_id, c.model_id): c.reason for c in self._unplaced if not c.managed})
            self._table_version = self._version
            self._table_built_at = now
            self._prune_routes()
        return self._table

    def mark_no_responders(self, host_id: str, heartbeat_at: float | None, now: float) -> None:
        """NATS proved nobody serves `host_id` (its agent is gone): route nothing to it until it
        heartbeats again, newer than `heartbeat_at` (the heartbeat its route was chosen with)."""
        self._mark_unresponsive(host_id, heartbeat_at, now, routing.EXCLUDED_NO_RESPONDERS)

    def mark_silent(self, host_id: str, now: float) -> None:
        """The agent of `host_id` stopped answering within the bound its own evidence sets
        (grid.infer.client.SilentHost): route nothing new to it until it heartbeats again, newer
        than the latest heartbeat this gateway has of it now. That heartbeat is at least the
        silence bound old, so one the agent sent before it stopped cannot clear the mark."""
        latest = [c.heartbeat_at for cs in self.table(now).values() for c in cs
                  if c.host_id == host_id and c.heartbeat_at is not None]
        self._mark_unresponsive(host_id, max(latest, default=None), now, routing.EXCLUDED_SILENT)

    def _mark_unresponsive(self, host_id: str, heartbeat_at: float | None, now: float, reason: str) -> None:
        if host_id not in self.unresponsive:
            log.warning("host unroutable until it heartbeats again", host_id=host_id, reason=reason)
        seen = self.unresponsive.get(host_id, (None, now, reason))[0]
        if seen is None or (heartbeat_at is not None and heartbeat_at > seen):
            seen = heartbeat_at
        self.unresponsive[host_id] = (seen, now, reason)
        self.counters[reason] += 1
        self._version += 1  # the next table() excludes it

    def unroutable_hosts(self, now: float) -> list[dict[str, Any]]:
        self.table(now)
        return [{"host_id": h, "reason": reason, "heartbeat_at": seen, "marked_at": at}
                for h, (seen, at, reason) in sorted(self.unresponsive.items())]

    def _prune_routes(self) -> None:
        """Forget idle per-route counters of engines that left the fleet (bounded memory)."""
        if len(self.served) <= MAX_REMEMBERED_ROUTES:
            return
        live = {c.key for cs in self._table.values() for c in cs}
        for key in [k for k in self.served if k not in live and not self.active.get(k)]:
            self.served.pop(key, None)
            self.active.pop(key, None)
            self.last_used_by_route.pop(key, None)

    @property
    def profiles(self) -> dict[str, ModelProfile]:
        return self.runner["catalog"].profiles  # type: ignore[no-any-return]

    def latest_plan(self) -> Plan | None:
        """The latest plan, decoded once per plan (None when none, or not decodable)."""
        state = self.runner["plans"]
        if state.latest is None:
            return None
        if self._plan[0] != state.latest_seq:
            try:
                plan: Plan | None = decode_plan(bytes(state.latest.plan))
            except Exception:  # noqa: BLE001 - a plan this gateway cannot read only loses the hint
                plan = None
            self._plan = (state.latest_seq, plan)
        return self._plan[1]

    def unplaceable(self, profile: ModelProfile, now: float) -> Unplaceable | None:
        """Why a configured model can never become ready as things stand (None: it may)."""
        plans = self.runner["plans"]
        revision = self.runner["catalog"].revisions.get(profile.model_id, 0)
        current = plan_saw_profile(plans.latest.based_on if plans.latest is not None else None, revision)
        return unplaceable(profile, fleet.snapshots(self.runner["fleet"], now), self.latest_plan(),
                           plan_current=current, now=now,
                           heartbeat_timeout_seconds=self.policy.heartbeat_timeout_seconds)

    def ready_models(self, now: float) -> list[str]:
        return routing.ready_models(self.table(now), now, self.policy)

    def unplaced_claims(self, now: float) -> list[placed.UnplacedClaim]:
        """Ready/warming claims that get no route: managed ones the controller did not place or
        no warm ack confirms, external ones no operator admitted (grid.projections.routes)."""
        self.table(now)
        return self._unplaced

    # --- metrics (read at scrape time from the state the gateway routes with) ------------------

    def _gauges(self) -> list[GaugeSource]:
        def in_flight() -> list[Sample]:
            by_route: dict[tuple[str, str], float] = {}
            for (host_id, _endpoint, model_id), n in self.active.items():
                by_route[(model_id, host_id)] = by_route.get((model_id, host_id), 0.0) + n
            return [(key, v) for key, v in sorted(by_route.items())]

        def routes() -> list[Sample]:
            return counts((c.state for cs in self.table(self.clock.now()).values() for c in cs), RESIDENCY_STATES)

        def unplaced() -> list[Sample]:
            reasons = (placed.REASON_NOT_IN_PLAN, placed.REASON_NO_WARM_ACK, placed.REASON_ARTIFACT_MISMATCH,
                       routes_proj.REASON_NOT_ADMITTED)
            return counts((c.reason for c in self.unplaced_claims(self.clock.now())), reasons)

        def unroutable() -> list[Sample]:
            return counts((str(h["reason"]) for h in self.unroutable_hosts(self.clock.now())),
                          (routing.EXCLUDED_NO_RESPONDERS, routing.EXCLUDED_SILENT))

        def breakers() -> list[Sample]:
            now = self.clock.now()
            return counts((str(c["state"]) for c in self.breakers.describe(now)), (CLOSED, HALF_OPEN, OPEN))

        return [
            GaugeSource("grid_gateway_in_flight", "Requests being proxied now, by served model and serving host.",
                        ("model", "host"), in_flight),
            GaugeSource("grid_gateway_routes", "Engine routes known from heartbeats, by residency state.",
                        ("state",), routes),
            GaugeSource("grid_gateway_unplaced_claims",
                        "Ready/warming residencies claimed by heartbeats that get no route: the latest plan "
                        "does not assign them, no warm ack confirms them, or their artifact is not the profile's "
                        "(managed); no operator admitted them (external, route_not_admitted and the other "
                        "grid.projections.routes reasons).",
                        ("reason",), unplaced),
            GaugeSource("grid_gateway_unroutable_hosts",
                        "Hosts routed nothing until they heartbeat again, by reason (no_responders: NATS said "
                        "nobody serves the host's inference subject; agent_silent: its agent stopped answering "
                        "within the bound its progress markers set).", ("reason",), unroutable),
            GaugeSource("grid_gateway_breakers", "Per-route circuit breakers, by state.", ("state",), breakers),
            GaugeSource("grid_gateway_waiting", "Requests waiting for a free slot.", (),
                        lambda: [((), float(self.waiters))]),
            GaugeSource("grid_gateway_telemetry_failed_records",
                        "Request records dropped because their batch could not be appended to the log.", (),
                        lambda: [((), float(self.telemetry.dropped_failed))]),
            rejected_events(lambda: self.runner.rejected),
            budget_metric(lambda: self.runner.budget),
            *host_gauges(lambda: self.runner["fleet"], self.clock.now),
        ]

    # --- proxy-owned counters --------------------------------------------------------------------

    def acquire(self, key: RouteKey, model_id: str, now: float) -> None:
        self.active[key] = self.active.get(key, 0) + 1
        self.served[key] += 1
        self.touch(key, model_id, now)

    def release(self, key: RouteKey, model_id: str, now: float) -> None:
        # Keys stay (at zero) once used: the proxy's count then overrides heartbeat counts.
        self.active[key] = max(0, self.active.get(key, 0) - 1)
        self.touch(key, model_id, now)
        self.pulse()

    def touch(self, key: RouteKey, model_id: str, now: float) -> None:
        # Monotonic watermarks: a clock step backwards never lowers them.
        if now > self.last_used.get(model_id, 0.0):
            self.last_used[model_id] = now
        if now > self.last_used_by_route.get(key, 0.0):
            self.last_used_by_route[key] = now

    def stats(self) -> dict[str, Any]:
        now = self.clock.now()
        keys = sorted(set(self.active) | set(self.served) | set(self.last_used_by_route))
        by_host: dict[str, dict[str, float]] = {}
        for (host_id, _endpoint, model_id), ts in sorted(self.last_used_by_route.items()):
            host = by_host.setdefault(host_id, {})
            host[model_id] = max(ts, host.get(model_id, 0.0))
        return {
            "now": now,
            "ready_models": self.ready_models(now),
            "unplaced_claims": [msgspec.to_builtins(c) for c in self.unplaced_claims(now)[:MAX_LISTED_UNPLACED]],
            "routes": [
                {
                    "host_id": k[0],
                    "endpoint": k[1],
                    "model_id": k[2],
                    "active": self.active.get(k, 0),
                    "served": self.served.get(k, 0),
                    "last_used_at": self.last_used_by_route.get(k),
                    "circuit": self.breakers.state(k, now),
                }
                for k in keys
            ],
            "last_used_at": dict(sorted(self.last_used.items())),
            "last_used_at_by_host": by_host,
            "waiting": self.waiters,
            "unroutable_hosts": self.unroutable_hosts(now),
            "open_circuits": sum(1 for c in self.breakers.describe(now) if c["state"] != "closed"),
            "telemetry": self.telemetry.stats(),
            "intake": self.intake.stats(),
            "requests": dict(sorted(self.counters.items())),
            "projection": {
                "positions": dict(sorted(self.runner.positions.items())),
                "malformed": self.runner.malformed,
                # Skipped as not provably their author's (or not vouched for by their subject).
                "rejected": dict(sorted(self.runner.rejected.items())),
                # Hosts over their log budget: their messages dropped unread (grid.projections.budget).
                "over_budget_hosts": flagged_rows(self.runner.budget.flagged if self.runner.budget is not None else None, now),
                "ack_scan": dict(self.ack_scan),
            },
            "api_keys_required": self.api_keys.required,
        }
