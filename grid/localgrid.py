"""A complete one-machine grid in one event loop: the composition behind `gridctl up`.

Embedded NATS JetStream (unless a URL is given), the controller with its admin API, the
OpenAI-compatible gateway and a local host agent. The embedded server runs with auth on
(grid.identity, operator mode) and each component connects with its own credential, generated
under the grid home on first start. Stopping drains and unloads the agent's
children after the controller has stopped issuing commands.

The embedded server listens on loopback unless asked to listen for other machines too
(`nats_listen`, `gridctl up --nats-listen`): then it serves TLS from Grid's private CA under the
grid home, the one `gridctl invite` pins in join tokens and the join reply hands over.

An embedded server that dies is started again on the same port with the same store (the
components reconnect on their own), and so is one that stopped storing after a failed write (a
full disk) once there is room again (grid.transport.store_pressure). The log counts as durable only
when we know every write is fsynced: the embedded server is configured so; an external one must
report it (or the operator vouches for it with assume_durable), otherwise automatic mode is
refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from grid.backoff import Backoff
from grid.config import GridConfig
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.identity.admin import sync_accounts
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.local import TLS_DIR, LocalCredentials, authority_dir, ensure_local_credentials, local_tls_ca
from grid.identity.server import SecuredEmbeddedNats
from grid.infer.local import LocalResponders
from grid.identity.tls import TLSMaterial
from grid.netaddr import is_loopback
from grid.secrets import write_owner_only
from grid.tasks import cancel_and_wait
from grid.transport.embedded import WILDCARD_HOSTS, EmbeddedNats, EmbeddedNatsError
from grid.transport.jetstream import JetStreamLog
from grid.transport.store_pressure import MIB, STORE_OK, STORE_UNKNOWN, StorePressure, read_store

log = structlog.get_logger(__name__)

# How often the embedded server's process is checked, and the pause between failed restarts:
# 1 s doubling to 30 s, so a store that cannot be opened does not turn into a busy loop and a
# server that can start again is restarted within 30 s. No jitter: one process restarts one
# server, there is no crowd of clients to spread out.
NATS_WATCH_SECONDS = 0.5
NATS_RESTART_BACKOFF = Backoff(first=1.0, cap=30.0)
# How often the embedded store's free space and health are read (status, /metrics, recovery).
STORE_CHECK_SECONDS = 2.0
# Restarts that bring a failed store back are at least this far apart: a write that fails for
# another reason than a full disk must not turn into a restart loop.
STORE_RECOVERY_MIN_INTERVAL_SECONDS = 30.0
# Resident budget for the bundled 135M Q4_1 model with a 2k context (the file is 94 MiB).
BUNDLED_MEMORY_MB = 512


def bundled_profile(**overrides: Any) -> ModelProfile:
    from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256

    fields: dict[str, Any] = dict(
        model_id=BUNDLED_MODEL_ID,
        memory_mb=BUNDLED_MEMORY_MB,
        artifact_sha256=BUNDLED_SHA256,
        min_replicas=1,
        max_replicas=1,
        workload_scores={"general": 0.6, "coding": 0.3, "research": 0.3, "marketing": 0.4, "sales": 0.4},
        expected_service_seconds=1.0,
        load_seconds=2.0,
        warm_seconds=3.0,
        min_residency_seconds=60.0,
    )
    fields.update(overrides)
    return ModelProfile(**fields)


class LocalGrid:
    def __init__(
        self,
        config: GridConfig,
        *,
        nats_url: str | None = None,
        mode: str = "automatic",
        profile: ModelProfile | None = None,
        gateway_host: str = "127.0.0.1",
        gateway_port: int = 0,
        admin_port: int = 0,
        agent_options: Any = None,
        controller_settings: Any = None,
        assume_durable: bool = False,
        notify: Callable[[str], None] | None = None,
        gateway_insecure: bool = False,
        log_budget: int | None = None,
        nats_listen: tuple[str, int] | None = None,
        nats_tls_names: tuple[str, ...] = (),
    ) -> None:
        self.config = config
        # Where the embedded server listens for other machines too (None: loopback only), and
        # the names they reach it by (its TLS certificate's names).
        self.nats_listen = nats_listen
        self.nats_tls_names = nats_tls_names
        # Bytes the streams may hold together (grid.transport.log_budget); None: as they are.
        self.log_budget = log_budget
        self.nats_url = nats_url
        self.mode = mode
        self.profile = profile if profile is not None else bundled_profile()
        self.gateway_host = gateway_host
        self.gateway_port = gateway_port
        self.gateway_insecure = gateway_insecure
        self.admin_port = admin_port
        self.agent_options = agent_options
        self.controller_settings = controller_settings
        self.assume_durable = assume_durable
        # Where operator-facing notices go (gridctl up prints them); they are logged as well.
        self.notify = notify
        self.durability_note = ""  # why the log does not count as durable, when it does not
        self.nats_restarts = 0
        # The embedded store's last reading (grid.transport.store_pressure), and the restarts that
        # brought a failed store back.
        self.store_pressure: StorePressure | None = None
        self.store_recoveries = 0
        self._reserved_bytes: int | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self.embedded: EmbeddedNats | None = None
        self.log: JetStreamLog | None = None  # the controller's connection
        self.gateway_log: JetStreamLog | None = None
        self.agent_log: JetStreamLog | None = None
        self.credentials: LocalCredentials | None = None
        self.controller: Any = None
        self.gateway: Any = None
        self.gateway_routes: Any = None  # the gateway's own view of the fleet (grid.gateway.state.Gateway)
        self.agent: Any = None
        self.local = LocalResponders()
        self.admin: Any = None
        self.admin_url = ""

    @property
    def gateway_url(self) -> str:
        return self.gateway.url if self.gateway is not None else ""

    async def start(self) -> "LocalGrid":
        from grid.agent.identity import resolve_host_id
        from grid.agent.service import AgentOptions, HostAgent
        from grid.agent.state import AgentPaths
        from grid.controller.api import serve_admin
        from grid.controller.service import Controller, ControllerSettings
        from grid.gateway.app import create_gateway_app, start_gateway
        from grid.identity.service import ControllerIdentity

        cfg = self.config
        cfg.ensure_home()
        options = self.agent_options or AgentOptions(failure_domain="local", tags=("local",))
        # Auth is on for the embedded server, and for an external one `gridctl nats init` set up.
        secured = self.nats_url is None or authority_dir(cfg.home).exists()
        if secured:
            # The host credential names the host, so its id is settled before anything starts.
            host_id = options.host_id or resolve_host_id(AgentPaths.for_config(cfg, options.state_dir), None)
            self.credentials = ensure_local_credentials(cfg.home, host_ids=[host_id], now=time.time())
            options = dataclasses.replace(options, host_id=host_id, credentials=self.credentials.hosts[host_id])
        if self.nats_url is None:
            # Started from this (the main) thread: the server dies with it (see embedded.py).
            host, port = self.nats_listen or ("127.0.0.1", None)
            self.embedded = SecuredEmbeddedNats(cfg.nats_store_dir, Authority(authority_dir(cfg.home)),
                                                tls=embedded_tls(cfg.home, host, self.nats_tls_names),
                                                host=host, port=port, monitor_host="127.0.0.1")
            self.embedded.start()
            self.nats_url = self.embedded.url
        write_owner_only(cfg.nats_url_file, (self.nats_url + "\n").encode())
        creds = self.credentials
        # An external server set up by `gridctl nats init --tls-name` speaks TLS from Grid's CA.
        # So does an embedded server listening for other machines (the same CA, under this home).
        serves_tls = self.embedded is None or getattr(self.embedded, "tls", None) is not None
        ca = local_tls_ca(cfg.home) if creds is not None and serves_tls else None
        self.log = await connect_log(self.nats_url, credentials=creds.controller if creds else None, tls_ca=ca,
                                     name="grid-controller", durable=False,
                                     replicas=cfg.replicas(), log_budget=self.log_budget)
        self.log.durable = await self._log_is_durable(self.log)
        if creds is not None:
            # This machine's hosts live in accounts of their own, which a server configured before
            # they existed does not know yet (grid.identity.accounts).
            await sync_accounts(Authority(authority_dir(cfg.home)), self.nats_url, tls_ca=ca)
            # Only the controller manages streams; the others may not (and need not).
            self.gateway_log = await connect_log(self.nats_url, credentials=creds.gateway, tls_ca=ca,
                                                 name="grid-gateway", ensure_streams=False)
            self.agent_log = await connect_log(self.nats_url, credentials=options.credentials, tls_ca=ca,
                                               name="grid-agent", ensure_streams=False)
        else:
            self.gateway_log = self.agent_log = self.log
        if self.embedded is not None:
            self._supervisor = asyncio.create_task(self._supervise_nats(self.embedded), name="grid-nats-supervisor")

        # A joining machine receives the CA that vouches for the server with its credential.
        ca_pem = ca.read_text() if ca is not None else None
        identity = ControllerIdentity(authority_dir(cfg.home), ca_pem=ca_pem) if creds is not None else None
        # The one-machine grid keeps its analytics store current (history right after a chat).
        settings = self.controller_settings or ControllerSettings(analytics=True)
        self.controller = Controller(self.log, cfg, settings=settings, identity=identity,
                                     store=None if self.embedded is None else lambda: self.store_pressure)
        await self.controller.start()
        self.admin = await serve_admin(self.controller, "127.0.0.1", self.admin_port)
        self.admin_url = self.admin.url or ""
        # Profile and mode travel through the log like any operator's change.
        catalog = self.controller.runner["catalog"]
        if catalog.profiles.get(self.profile.model_id) is None:
            await self.log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=self.profile))
        if catalog.mode != self.mode:
            await self.log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode=self.mode))  # type: ignore[arg-type]

        app = create_gateway_app(self.gateway_log, cfg, local_responders=self.local)
        self.gateway_routes = app.state.gateway
        self.gateway = await start_gateway(app, self.gateway_host, self.gateway_port, insecure=self.gateway_insecure)
        self.agent = HostAgent(self.agent_log, cfg, options)
        await self.agent.start()
        # The gateway hands this host's requests to its agent's responder in process (no broker
        # hop); while that responder is stopped they go over NATS like any other host's.
        agent = self.agent
        self.local.add(agent.host_id, lambda: agent.responder)
        return self

    def _say(self, text: str) -> None:
        log.warning("local grid notice", notice=text)
        if self.notify is not None:
            self.notify(text)

    async def _log_is_durable(self, event_log: JetStreamLog) -> bool:
        if self.embedded is not None:
            return self.embedded.sync_always  # we wrote its configuration
        if self.assume_durable:
            return True
        from grid.identity.durability import external_log_durable

        # The server's own report, else a server whose config `gridctl nats init` / `nats
        # cluster-config` wrote under this home (recorded by name: fsync on every write).
        durable, reported, recorded = await external_log_durable(event_log, self.config.home)
        # The URL may carry credentials: the note names the server by role only.
        self.durability_note = "" if recorded else durability_note(reported)
        return durable

    async def _supervise_nats(self, server: EmbeddedNats) -> None:
        """Start the embedded server again, same port and store, whenever it dies, or when it has
        stopped storing (a full disk) and there is room again; keep `store_pressure` current."""
        pauses = NATS_RESTART_BACKOFF.delays()
        next_store_check = 0.0
        last_recovery = -STORE_RECOVERY_MIN_INTERVAL_SECONDS
        while True:
            await asyncio.sleep(NATS_WATCH_SECONDS)
            if server.alive:
                if time.monotonic() < next_store_check:
                    continue
                next_store_check = time.monotonic() + STORE_CHECK_SECONDS
                pressure = await asyncio.to_thread(self._read_store, server)
                if not pressure.recoverable or time.monotonic() < last_recovery + STORE_RECOVERY_MIN_INTERVAL_SECONDS:
                    continue
                # It keeps refusing writes until restarted (grid.transport.store_pressure).
                self.store_recoveries += 1
                last_recovery = time.monotonic()
                await asyncio.to_thread(server.stop)
                reason = f"stopped storing after a failed write and {pressure.free_bytes // MIB} MiB are free again"
            else:
                reason = _exit_reason(server.exit_code)
            self.nats_restarts += 1
            self._say(f"embedded NATS server {reason}; restarting it on {server.url} with the same store")
            try:
                server.respawn()  # from this (the main) thread: the server dies with it (embedded.py)
                await asyncio.to_thread(server.wait_ready)
            except (EmbeddedNatsError, OSError) as exc:
                pause = next(pauses)
                self._say(f"embedded NATS server did not restart ({exc}); next attempt in {pause:.0f}s")
                await asyncio.sleep(pause)
                continue
            pauses = NATS_RESTART_BACKOFF.delays()  # a restart that worked starts the schedule over
            next_store_check = 0.0
            self._say(f"embedded NATS server restarted on {server.url}; the components reconnect on their own")

    def _read_store(self, server: EmbeddedNats) -> StorePressure:
        """One reading of the embedded store (blocking: run it in a thread)."""
        pressure = read_store(server.store_dir, server.monitor, reserved_bytes=self._reserved_bytes,
                              recoveries=self.store_recoveries)
        if pressure.jetstream_reserved_bytes:
            # A failed server may stop reporting the reservations a restart must find room for.
            self._reserved_bytes = max(self._reserved_bytes or 0, pressure.jetstream_reserved_bytes)
        if pressure.state != (self.store_pressure.state if self.store_pressure else STORE_OK):
            if pressure.state in (STORE_OK, STORE_UNKNOWN):
                log.info("event log store", state=pressure.state, free_bytes=pressure.free_bytes)
            else:
                self._say(f"event log store: {pressure.detail}")
        self.store_pressure = pressure
        return pressure

    def residency_state(self, model_id: str) -> str | None:
        """The state this host's agent last reported for `model_id` (None: no residency)."""
        hb = getattr(self.agent, "last_heartbeat", None)
        if hb is None:
            return None
        return {r.model_id: r.state for r in hb.residencies}.get(model_id)

    def serving(self, model_id: str) -> bool:
        """Whether the gateway routes `model_id` now. The agent reports READY first; the gateway
        learns it from the log a few hops later (the heartbeat through the ingress, the warm ack),
        and until then answers 503 model_not_ready."""
        routes = self.gateway_routes
        return routes is not None and model_id in routes.ready_models(routes.clock.now())

    async def stop(self) -> None:
        if self._supervisor is not None:
            await cancel_and_wait([self._supervisor])  # a server stopped on purpose stays stopped
            self._supervisor = None
        # Controller first: nothing may re-warm what the agent is draining.
        if self.admin is not None:
            with contextlib.suppress(Exception):
                await self.admin.stop()
        if self.controller is not None:
            with contextlib.suppress(Exception):
                await self.controller.stop()
        if self.agent is not None:
            with contextlib.suppress(Exception):
                await self.agent.stop(drain=True)
        if self.gateway is not None:
            with contextlib.suppress(Exception):
                await self.gateway.stop()
        for connection in {id(c): c for c in (self.agent_log, self.gateway_log, self.log) if c is not None}.values():
            with contextlib.suppress(Exception):
                await connection.close()
        if self.embedded is not None:
            self.embedded.stop()
            with contextlib.suppress(OSError):
                self.config.nats_url_file.unlink()


class NatsListenError(ValueError):
    """--nats-listen cannot be served as asked (the message says why and what to pass)."""


def embedded_tls(home: Any, host: str, names: Sequence[str]) -> TLSMaterial | None:
    """TLS for an embedded server listening on `host`: always off loopback, on loopback only when
    names are given. The certificate comes from Grid's private CA under the home (the one
    `gridctl nats init --tls-name` makes), so `gridctl invite` pins it in the join token and a
    joining machine receives the CA; it also names loopback, for this machine's own components."""
    if is_loopback(host) and not names:
        return None
    wanted = list(names) or ([] if host in WILDCARD_HOSTS else [host])
    if not wanted:
        raise NatsListenError(f"--nats-listen {host}: name the hostname or address other machines reach this one "
                              "by with --nats-tls-name (its TLS certificate must carry it)")
    material = TLSMaterial(authority_dir(home) / TLS_DIR)
    return material.ensure([*wanted, "127.0.0.1", "localhost"], now=dt.datetime.now(dt.timezone.utc))


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "is gone"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def durability_note(reported: bool | None) -> str:
    """Why an external server does not count as durable ("" when it does)."""
    if reported is None:
        return "the external NATS server does not report its sync policy to this connection"
    if not reported:
        return "the external NATS server does not fsync every write (its sync_interval is not always)"
    return ""
